"""vLLM's request fields that name token ids for sampling and logprobs, shared by chat and text
completions:

- ``allowed_token_ids``: only these tokens may be sampled (the logprobs stay the model's own, so
  a token outside the set still has its finite logprob);
- ``logprob_token_ids``: each output position's alternatives are the sampled token and these ids,
  whatever their rank, instead of the most likely; needs logprobs asked for;
- ``return_tokens_as_token_ids``: logprobs name tokens ``token_id:<id>``, for tokens whose text
  is not a whole character.

Ids are checked against the vocabulary on the node that samples (services/engine/engine.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from services.engine.sampling_params import MAX_LOGPROB_TOKEN_IDS
from services.gateway.protocol.wire_base import WireModel

TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]


class TokenIdFields(WireModel):
    allowed_token_ids: list[TokenId] | None = Field(None, description="vLLM's: only these token ids may be sampled")
    logprob_token_ids: Annotated[list[TokenId], Field(max_length=MAX_LOGPROB_TOKEN_IDS)] | None = Field(
        None, description="vLLM's: the logprobs' alternatives are the sampled token and these ids (needs logprobs)"
    )
    return_tokens_as_token_ids: bool | None = Field(None, description="vLLM's: logprobs name tokens 'token_id:<id>'")

    @model_validator(mode="after")
    def _token_ids_usable(self) -> TokenIdFields:
        if self.allowed_token_ids == []:
            raise ValueError("allowed_token_ids is empty: no token could be sampled")
        if self.logprob_token_ids and self.num_logprobs() is None:
            raise ValueError("when using `logprob_token_ids`, `logprobs` must be set.")  # vLLM's words
        if self.logprob_token_ids and getattr(self, "echo_only", False):
            raise ValueError(
                "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` because no output tokens are generated."
            )
        return self

    def num_logprobs(self) -> int | None:
        """The alternatives asked for per output token; None: no logprobs (each endpoint's own)."""
        raise NotImplementedError

    def named_token_ids(self) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        """(allowed_token_ids, logprob_token_ids) as the sampling takes them; an empty
        logprob_token_ids asks for nothing, as in vLLM."""
        allowed = tuple(self.allowed_token_ids) if self.allowed_token_ids is not None else None
        return allowed, tuple(self.logprob_token_ids) if self.logprob_token_ids else None
