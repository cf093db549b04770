"""The vLLM entrypoint tests that need a real checkpoint, by name, each with why and the symptom
its failure shows on the built-in ``tiny`` (outcomes.py counts a listed test as needing the
checkpoint only when it fails with that symptom; any other failure is a failure).

Why a built-in cannot stand in: the Hub is out of reach, so a test that loads a model's files
itself (a tokenizer, a config, a chat template) fails before it asks the server anything; and a
built-in's random weights never choose EOS, so a test that asserts a reply stopped on its own
cannot pass on either server.
"""

from __future__ import annotations

from dataclasses import dataclass

HUB = r"huggingface\.co|LocalEntryNotFoundError|OfflineModeIsEnabled|HFValidationError|RepositoryNotFoundError|couldn't connect"
NO_EOS = r"assert 'length' == 'stop'"


@dataclass(frozen=True, slots=True)
class Need:
    reason: str
    symptom: str  # a regular expression the failure's message or traceback matches


NEEDS_CHECKPOINT: dict[str, Need] = {}
