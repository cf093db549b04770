"""vLLM's ``truncate_prompt_tokens`` and ``truncation_side`` on chat and text completions: a
prompt longer than the number keeps only that many tokens (the preprocess role cuts the rendered
prompt: services/preprocess/truncation.py). -1 is the model length less one token, left for the
output, as vLLM resolves it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from protos.gen import pb
from services.gateway.errors import GatewayError
from services.gateway.protocol.wire_base import WireModel

_SIDES = {None: pb.Truncation.TOKENIZER, "left": pb.Truncation.LEFT, "right": pb.Truncation.RIGHT}


class TruncationFields(WireModel):
    truncate_prompt_tokens: int | None = Field(
        None, ge=-1, le=2**31 - 1, description="vLLM's: keep this many of the prompt's tokens (-1: the model length less one)"
    )
    truncation_side: Literal["left", "right"] | None = Field(
        None, description="'left' keeps the last tokens, 'right' the first; unset: the tokenizer's side"
    )

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _keeps_a_token(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("truncate_prompt_tokens must be at least 1, or -1 for the model length")
        return value

    def truncation(self, max_model_len: int | None) -> pb.Truncation | None:
        """What the prompt's preprocessing is told; None: the prompt whole."""
        asked = self.truncate_prompt_tokens
        if asked is None:
            return None
        if asked == -1:
            if max_model_len is None:
                raise GatewayError(
                    400, "truncate_prompt_tokens=-1 is not served here: give the number of tokens", param="truncate_prompt_tokens"
                )
            asked = max_model_len - 1
        return pb.Truncation(num_tokens=asked, side=_SIDES[self.truncation_side])
