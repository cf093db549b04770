"""vLLM's ``kv_transfer_params`` on chat completions, the part of it that decides the output.

In vLLM's disaggregated serving a proxy hands the decode side the prompt's token ids in
``kv_transfer_params.prompt_token_ids``, and they are served verbatim: the messages are not
rendered or tokenized. Tessera serves the same (the messages must then carry no image or video:
ids alone cannot say where their pixels are). vLLM's other keys steer its KV connectors, which
Tessera does not have; a request that sends one is refused by name rather than served as if it
had not.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from services.gateway.protocol.wire_base import WireModel

INT32_MAX = 2**31 - 1


class KVTransferFields(WireModel):
    kv_transfer_params: dict[str, Any] | None = Field(
        None, description="vLLM's; {'prompt_token_ids': [...]}: those ids are the prompt, verbatim (other keys are refused)"
    )

    @model_validator(mode="after")
    def _prompt_ids_only(self) -> KVTransferFields:
        params = self.kv_transfer_params
        if params is None:
            return self
        others = sorted(set(params) - {"prompt_token_ids"})
        if others:
            raise ValueError(f"kv_transfer_params: {', '.join(others)} is not supported by this server (only prompt_token_ids is)")
        ids = params.get("prompt_token_ids")
        if not isinstance(ids, list) or not ids or not all(type(t) is int and 0 <= t <= INT32_MAX for t in ids):
            raise ValueError("kv_transfer_params.prompt_token_ids must be a non-empty list of token ids")
        return self

    def forwarded_prompt_ids(self) -> list[int] | None:
        """The prompt's ids a proxy forwarded, or None: the messages are the prompt."""
        return None if self.kv_transfer_params is None else list(self.kv_transfer_params["prompt_token_ids"])
