"""Checkpoints named by their Hugging Face Hub id: ``org/name`` or ``org/name@revision``.

Downloaded with ``huggingface_hub`` into its standard cache (``HF_HOME``, ``HF_HUB_CACHE``), with
``HF_TOKEN`` for gated or private repositories and ``HF_ENDPOINT`` for a mirror. Only what
serving reads is fetched (config, tokenizer, processor and safetensors files; no ``.bin`` or
``.pt`` weights, no README images). ``HF_HUB_OFFLINE=1`` is honoured: the cached snapshot is
used, and a missing one is an error that says how to fetch it.

Every role must serve the same weights, so a stack resolves the reference to its commit once
(``pinned_reference``) and starts its roles on ``org/name@<commit>``, which they find in the cache.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ALLOW_PATTERNS = (
    "*.json",  # config, generation config, tokenizer and processor configs, safetensors index
    "*.safetensors",
    "*.jinja",  # chat templates shipped beside the tokenizer
    "tokenizer.model",
    "*.tiktoken",
    "merges.txt",
    "vocab.txt",
)
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")


class HubModelError(Exception):
    """The checkpoint cannot be had from the Hub or its cache; the message says what to do."""


@dataclass(frozen=True, slots=True)
class HubReference:
    repo_id: str
    revision: str | None = None  # a branch, tag or commit; None: the default branch

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"


def parse_hub_reference(reference: str) -> HubReference | None:
    """``org/name[@revision]`` as a Hub reference, or None (a local path, a built-in name)."""
    match = _HUB_ID.match(reference)
    if match is None or reference.startswith((".", "/", "~")) or Path(reference).expanduser().exists():
        return None
    return HubReference(match["repo"], match["revision"])


def is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def download(reference: HubReference) -> Path:
    """The snapshot directory of ``reference``: downloaded (only the files serving reads), or
    from the cache when offline."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    offline = is_offline()
    try:
        path = snapshot_download(
            reference.repo_id, revision=reference.revision, allow_patterns=list(ALLOW_PATTERNS), local_files_only=offline
        )
    except LocalEntryNotFoundError:
        if offline:
            raise HubModelError(
                f"{reference} is not in the Hugging Face cache and HF_HUB_OFFLINE=1 forbids downloading it; "
                f"fetch it once online (HF_HUB_OFFLINE=0 tessera models download {reference}), or name a local directory"
            ) from None
        raise HubModelError(f"{reference} could not be downloaded (no connection to the Hub?) and is not in the cache") from None
    except RevisionNotFoundError:
        raise HubModelError(f"{reference}: the repository has no revision {reference.revision!r}") from None
    except RepositoryNotFoundError:
        raise HubModelError(f"{reference}: no such model repository (or it is private: set HF_TOKEN)") from None
    return Path(path)


def pinned_reference(reference: HubReference, snapshot: Path) -> HubReference:
    """``reference`` at the commit its snapshot holds (the cache names snapshots by commit)."""
    return HubReference(reference.repo_id, snapshot.name)
