"""Gemma3's prompt layout: each ``<start_of_image>`` marker becomes text, tokenized with its
surroundings, exactly as transformers' Gemma3Processor does it:

  one view:        "\n\n<start_of_image>" + "<image_soft_token>" * T + "<end_of_image>\n\n"
  Pan-and-Scan:    "Here is the original image " + VIEW + " and here are some crops to help you see
                   better " + " ".join(VIEW for each crop)

Replacing text before tokenizing matters: the "\n\n" around an image merges with neighbouring
newlines in the BPE, so expanding token ids alone would differ from the oracle. Token-id prompts
have no text to merge with: each marker id becomes the tokenized replacement on its own.
Each run of soft tokens is one placeholder span (one view).
"""

from __future__ import annotations

from collections.abc import Sequence

from services.models.family import PlaceholderCountError
from shared.types import PlaceholderRange

BOI, EOI, SOFT = "<start_of_image>", "<end_of_image>", "<image_soft_token>"


def replacement_text(num_views: int, tokens_per_view: int) -> str:
    view = f"\n\n{BOI}{SOFT * tokens_per_view}{EOI}\n\n"
    if num_views == 1:
        return view
    return f"Here is the original image {view} and here are some crops to help you see better " + " ".join([view] * (num_views - 1))


def expand_text(text: str, views_per_image: Sequence[tuple[int, int]]) -> str:
    """``text`` with its i-th marker replaced for image i, given (views, tokens per view)."""
    pieces = text.split(BOI)
    if len(pieces) - 1 != len(views_per_image):
        raise PlaceholderCountError(f"prompt has {len(pieces) - 1} image placeholder(s) but {len(views_per_image)} image(s) were given")
    out = [pieces[0]]
    for (views, tokens), piece in zip(views_per_image, pieces[1:]):
        out += [replacement_text(views, tokens), piece]
    return "".join(out)


def expand_token_ids(tokenizer, token_ids: Sequence[int], boi_id: int, views_per_image: Sequence[tuple[int, int]]) -> list[int]:
    markers = [i for i, t in enumerate(token_ids) if t == boi_id]
    if len(markers) != len(views_per_image):
        raise PlaceholderCountError(f"prompt has {len(markers)} image placeholder(s) but {len(views_per_image)} image(s) were given")
    out: list[int] = []
    cursor = 0
    for position, (views, tokens) in zip(markers, views_per_image):
        out += token_ids[cursor:position]
        out += tokenizer.encode(replacement_text(views, tokens), add_special_tokens=False)
        cursor = position + 1
    return out + list(token_ids[cursor:])


def soft_token_runs(token_ids: Sequence[int], soft_id: int) -> list[PlaceholderRange]:
    runs: list[PlaceholderRange] = []
    start: int | None = None
    for i, token in enumerate([*token_ids, -1]):
        if token == soft_id and start is None:
            start = i
        elif token != soft_id and start is not None:
            runs.append(PlaceholderRange(offset=start, length=i - start))
            start = None
    return runs
