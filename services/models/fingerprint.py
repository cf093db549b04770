"""A checkpoint's identity from its contents: the weight fingerprint in every cache key.

Two checkpoints served under one name (v1 and v2 of a rolling update) must never share cached
work: an image embedding, a KV block or a processed image computed by one is wrong for the
other. So a node's model id is ``name@fingerprint`` (registry.py), and that id is in every
``mm_hash`` (shared/hashing.py), hence in every processor- and encoder-cache key, and it is the
index namespace, which scopes the nodes a router sees, the block hashes it looks up and the
embeddings and KV a node may pull (docs/architecture.md, "Hash contracts").

Fingerprint = blake3 over, for every file serving reads (config, generation config, tokenizer,
processor, chat template and safetensors files), sorted by name: the name and its content digest.
Making it cheap without giving up collision safety:
  * a Hugging Face cache snapshot's file is a link to a blob named by its content hash (sha256 of
    LFS files such as weights, git's sha1 of small ones), which huggingface_hub checked when it
    downloaded it: that name is used, and the bytes are not read;
  * any other file is read once and digested with blake3 (multithreaded); the digest is memoized
    by (path, size, mtime_ns, inode), so a restart on an unchanged checkpoint reads nothing. A
    rewritten file gets a new mtime and is read again.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import blake3

from services.models.hub import ALLOW_PATTERNS
from shared.paths import tessera_home

FINGERPRINT_KEY = b"tessera/weight-fingerprint/v1".ljust(32, b"\0")
FINGERPRINT_CHARS = 16  # 64 bits of blake3: collisions between checkpoints of one name are not a concern
MAX_MEMO_ENTRIES = 4096
_CONTENT_ADDRESSED_BLOB = re.compile(r"^(?:[0-9a-f]{64}|[0-9a-f]{40})$")


def checkpoint_files(path: Path) -> list[Path]:
    return sorted({p for pattern in ALLOW_PATTERNS for p in path.glob(pattern) if p.is_file()})


def fingerprint(path: Path) -> str:
    return files_fingerprint(checkpoint_files(path))


def files_fingerprint(files: list[Path]) -> str:
    """The fingerprint of ``files`` (sorted by the caller): a checkpoint's, or a LoRA adapter's
    (services/models/lora/adapter.py), whose identity enters the caches' keys the same way."""
    memo = _Memo(tessera_home() / "fingerprints.json")
    digest = blake3.blake3(key=FINGERPRINT_KEY)
    for file in files:
        digest.update(file.name.encode() + b"\0" + file_digest(file, memo).encode() + b"\n")
    memo.save()
    return digest.hexdigest()[:FINGERPRINT_CHARS]


def file_digest(file: Path, memo: _Memo | None = None) -> str:
    """The content hash of ``file``: its Hub blob's name where it is one, else blake3 of its bytes."""
    target = file.resolve()
    if file.is_symlink() and target.parent.name == "blobs" and _CONTENT_ADDRESSED_BLOB.match(target.name):
        return "hub:" + target.name
    stat = target.stat()
    key = f"{target}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}"
    known = memo.get(key) if memo is not None else None
    if known is not None:
        return known
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    hasher.update_mmap(str(target))
    value = "blake3:" + hasher.hexdigest()
    if memo is not None:
        memo.put(key, value)
    return value


class _Memo:
    """File digests by stat key, in one JSON file, written atomically (nodes start together)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.changed = False
        try:
            self.entries: dict[str, str] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.entries = {}

    def get(self, key: str) -> str | None:
        return self.entries.get(key)

    def put(self, key: str, value: str) -> None:
        self.entries[key] = value
        self.changed = True

    def save(self) -> None:
        if not self.changed:
            return
        entries = dict(list(self.entries.items())[-MAX_MEMO_ENTRIES:])  # the newest, in insertion order
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(entries))
            tmp.replace(self.path)
        except OSError:
            pass  # a read-only home: the next start reads the files again
