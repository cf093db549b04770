"""vLLM's ``truncate_prompt_tokens``: a prompt longer than the number asked keeps only that many
tokens, the last ones (side ``left``: cut from the start, where a long history is) or the first
(``right``); unset, the tokenizer's own ``truncation_side`` decides, as in vLLM.

It applies to the rendered, tokenized prompt. A prompt with images or videos is refused when it
would be cut: a cut through a placeholder run leaves the model an image it cannot place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.preprocess.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class Truncation:
    num_tokens: int  # at least 1
    side: Literal["left", "right"] | None = None  # None: the tokenizer's

    def __post_init__(self) -> None:
        if self.num_tokens < 1:
            raise InvalidRequestError(f"truncate_prompt_tokens must be at least 1 (or -1), got {self.num_tokens}")


def truncated(token_ids: list[int], truncation: Truncation | None, tokenizer_side: str, *, has_media: bool) -> list[int]:
    """``token_ids`` cut to ``truncation``'s length, or as they are when they fit."""
    if truncation is None or len(token_ids) <= truncation.num_tokens:
        return token_ids
    if has_media:
        raise InvalidRequestError(
            f"truncate_prompt_tokens={truncation.num_tokens} would cut a prompt of {len(token_ids)} tokens "
            "that has images or videos; only text prompts are truncated"
        )
    side = truncation.side or tokenizer_side
    return token_ids[-truncation.num_tokens :] if side == "left" else token_ids[: truncation.num_tokens]
