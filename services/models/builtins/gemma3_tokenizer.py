"""Gemma3's tokenizer built offline: Gemma3's special tokens at their real ids around a real byte-level BPE.

Gemma's SentencePiece vocabulary is not available offline, so the regular vocabulary is Qwen's
byte-level BPE (``services.models.builtins.qwen2_tokenizer``) moved to ids ``BPE_OFFSET + rank``, clear of every
Gemma special id. Every other id below ``VOCAB_SIZE`` holds a placeholder, so any id the model can
emit decodes: Gemma's ``<unused{n}>`` names where the real vocabulary has them, ``<reserved_{id}>``
elsewhere. Placeholders are plain vocabulary entries, not added tokens: the pre-tokenizer splits
``<``, letters and digits apart, so text never encodes to them, and thousands of added tokens would
slow loading for nothing.

Saved as transformers' generic ``TokenizersBackend``: ``GemmaTokenizer`` rebuilds its pipeline on load
(SentencePiece-style ``▁`` normalizer, byte fallback), which would break a byte-level vocabulary;
the generic class loads ``tokenizer.json`` as written. ``Gemma3Processor`` accepts any tokenizer that
has ``image_token``/``boi_token``/``eoi_token`` (and their ids); they are named extra special tokens.

Runs of 1 to 31 newlines are single tokens at Gemma's ids 107..137, as in the real vocabulary
(``NEWLINE_RUN_IDS``): added (non-special) tokens, matched longest first before the BPE. vLLM's
Gemma3 processor looks them up by their text to merge the newlines around an image's expansion.

Like the real Gemma tokenizer, ``add_special_tokens=True`` prepends ``<bos>`` (nothing is appended);
``add_special_tokens=False`` adds nothing. The chat template writes ``<bos>`` itself, so rendered chat
text must be tokenized with ``add_special_tokens=False``. The ``<bos>`` rule lives in tokenizer.json's
post-processor: transformers 5 drops ``add_bos_token`` from tokenizer_config.json, so after a reload
``tokenizer.add_bos_token`` reads False although ``<bos>`` is still prepended.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import TokenizersBackend

PAD_ID = 0
EOS_ID = 1
BOS_ID = 2
UNK_ID = 3
MASK_ID = 4
START_OF_TURN_ID = 105
END_OF_TURN_ID = 106
BOI_ID = 255_999  # <start_of_image>
EOI_ID = 256_000  # <end_of_image>
IMAGE_TOKEN_ID = 262_144  # <image_soft_token>: one per pooled vision embedding
# "\n" * k for k = 1..31 at 106 + k, as in Gemma's SentencePiece vocabulary.
NEWLINE_RUN_IDS: dict[str, int] = {"\n" * k: 106 + k for k in range(1, 32)}
# Gemma3's text vocab_size: the tokenizer's 262145 tokens padded to a multiple of 64.
VOCAB_SIZE = 262_208
# Regular tokens start here: above Gemma's low specials and <unused0..98> (ids 0..106).
BPE_OFFSET = 1000

SPECIAL_TOKENS: dict[str, int] = {
    "<pad>": PAD_ID,
    "<eos>": EOS_ID,
    "<bos>": BOS_ID,
    "<unk>": UNK_ID,
    "<mask>": MASK_ID,
    "[multimodal]": 5,
    "<start_of_turn>": START_OF_TURN_ID,
    "<end_of_turn>": END_OF_TURN_ID,
    "<start_of_image>": BOI_ID,
    "<end_of_image>": EOI_ID,
    "<image_soft_token>": IMAGE_TOKEN_ID,
}

# Gemma3's real chat template, with one extension: like the Qwen template, a part carrying an
# ``image`` or ``image_url`` key (OpenAI style) is an image too, not only ``{"type": "image"}``.
CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' or 'image' in item or 'image_url' in item -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

# Qwen2's pre-tokenizer split (as in transformers' Qwen2Tokenizer): the BPE ranks assume it.
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+"""
    r"""|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Gemma's reserved ranges: <unused0>..<unused98> at 6..104 and <unused99>..<unused6241> at 256001..262143.
_UNUSED_LOW = range(6, 105)
_UNUSED_HIGH = range(256_001, 262_144)


def _placeholder(token_id: int) -> str:
    if token_id in _UNUSED_LOW:
        return f"<unused{token_id - _UNUSED_LOW.start}>"
    if token_id in _UNUSED_HIGH:
        return f"<unused{len(_UNUSED_LOW) + token_id - _UNUSED_HIGH.start}>"
    return f"<reserved_{token_id}>"


@lru_cache(maxsize=1)
def gemma3_vocab() -> dict[str, int]:
    """Every id in [0, VOCAB_SIZE): specials, then BPE tokens at BPE_OFFSET + rank, placeholders elsewhere."""
    from services.models.builtins.qwen2_tokenizer import vocab_and_merges

    bpe_vocab, _ = vocab_and_merges()
    # Qwen's BPE happens to hold the literal text "<unk>"; the special takes the name (its pre-tokenizer
    # splits "<unk" from ">", so BPE never produced it anyway) and its old id becomes a placeholder.
    vocab = {token: BPE_OFFSET + rank for token, rank in bpe_vocab.items() if token not in SPECIAL_TOKENS}
    taken = set(vocab.values())
    for token, token_id in SPECIAL_TOKENS.items():
        if token_id in taken or BPE_OFFSET <= token_id < BPE_OFFSET + len(bpe_vocab):
            raise RuntimeError(f"special token {token} id {token_id} collides with the BPE range")
        vocab[token] = token_id
    taken.update(SPECIAL_TOKENS.values())
    for token, token_id in NEWLINE_RUN_IDS.items():
        vocab.pop(token, None)  # the BPE's own newline tokens give way to Gemma's ids
        vocab[token] = token_id
    taken = set(vocab.values())
    vocab.update({_placeholder(i): i for i in range(VOCAB_SIZE) if i not in taken})
    if len(vocab) != VOCAB_SIZE:
        raise RuntimeError(f"vocabulary has {len(vocab)} tokens, expected {VOCAB_SIZE}: a placeholder shadows a token")
    return vocab


@lru_cache(maxsize=1)
def _backend_json() -> str:
    """The ``tokenizers`` pipeline, serialized: building it from 262k tokens and 150k merges takes seconds."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    from services.models.builtins.qwen2_tokenizer import vocab_and_merges

    _, merges = vocab_and_merges()
    # ignore_merges: like tiktoken, a pre-token that is itself in the vocabulary is emitted whole.
    tokenizer = Tokenizer(BPE(vocab=gemma3_vocab(), merges=list(merges), ignore_merges=True, fuse_unk=False, byte_fallback=False))
    # The Qwen2 pipeline the BPE ranks were trained with: NFC, Qwen's split regex, then bytes -> chars.
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    # Added in id order so the added-token table serializes the same way every time; already in the
    # vocabulary, so they keep their ids and are matched whole (never split) before pre-tokenization.
    specials = sorted(SPECIAL_TOKENS.items(), key=lambda item: item[1])
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token, _ in specials])
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in NEWLINE_RUN_IDS])
    for token, token_id in specials:
        if tokenizer.token_to_id(token) != token_id:
            raise RuntimeError(f"special token {token} got id {tokenizer.token_to_id(token)}, expected {token_id}")
    return tokenizer.to_str()


def build_gemma3_tokenizer() -> TokenizersBackend:
    """A ``TokenizersBackend`` with Gemma3's special tokens at their real ids and Gemma3's chat template."""
    from tokenizers import Tokenizer
    from transformers import TokenizersBackend

    tokenizer = TokenizersBackend(
        tokenizer_object=Tokenizer.from_str(_backend_json()),
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        # Named so that tokenizer.image_token / boi_token / eoi_token (and *_id), which Gemma3Processor
        # reads, survive a save and reload.
        extra_special_tokens={"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"},
        add_bos_token=True,  # as the real Gemma tokenizer: encode(text) starts with <bos>
        add_eos_token=False,
        padding_side="left",
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
