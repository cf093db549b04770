"""Incremental detokenization: a request's text grows by decoding a short window of its newest
tokens, not its whole output at every step (O(window) per token instead of O(output)).

State per request (vLLM's scheme): the kept token ids (EOS ids are left out, as the full decode
leaves them out), ``prefix_offset`` <= ``read_offset``, and ``committed``, the text of
ids[:read_offset]. For each new token, decode ids[prefix_offset:] and ids[prefix_offset:read_offset];
the first is longer by the new text. It is committed, and both offsets move up, only when it does
not end in U+FFFD (bytes of a character still arriving). The text so far is ``committed`` plus
what is pending past ``read_offset``. Both windows start at the same token, so a decoder that
treats its first token specially (dropping a leading space) does it to both and the difference
is exact; the tests check it against the full decode on every built-in tokenizer.

A fast tokenizer that does no clean-up of spaces is decoded by its Rust tokenizer directly:
that is all transformers' ``decode`` does for it, and its argument conversion around that call
cost several times the decode itself at every token.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class DetokenizerState:
    ids: list[int] = field(default_factory=list)
    num_seen: int = 0  # output tokens consumed, EOS ids included
    prefix_offset: int = 0
    read_offset: int = 0
    committed: str = ""


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_ids: frozenset[int]) -> None:
        self.tokenizer = tokenizer
        self.skip_ids = skip_ids
        backend = getattr(tokenizer, "backend_tokenizer", None)
        direct = backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True)
        self._decode = backend.decode if direct else tokenizer.decode

    def text(self, state: DetokenizerState, output_token_ids: list[int]) -> str:
        """The decoded text of ``output_token_ids`` (which only ever grows), from ``state``."""
        for token_id in output_token_ids[state.num_seen :]:
            state.num_seen += 1
            if token_id in self.skip_ids:
                continue
            state.ids.append(token_id)
            prefix_text, new_text = self._window(state)
            if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
                state.committed += new_text[len(prefix_text) :]
                state.prefix_offset, state.read_offset = state.read_offset, len(state.ids)
        if state.read_offset == len(state.ids):
            return state.committed
        prefix_text, new_text = self._window(state)
        return state.committed + new_text[len(prefix_text) :]

    def _window(self, state: DetokenizerState) -> tuple[str, str]:
        decode = self._decode
        prefix = decode(state.ids[state.prefix_offset : state.read_offset], skip_special_tokens=True)
        return prefix, decode(state.ids[state.prefix_offset :], skip_special_tokens=True)
