"""Qwen2-VL's special tokens with their real ids, and the checkpoint-level token constants."""

from __future__ import annotations

NUM_BPE_TOKENS = 151643  # regular byte-level BPE tokens; specials start right after them
# Qwen2-VL pads the embedding table to a multiple of 128 for hardware efficiency.
VOCAB_SIZE = 151936

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",  # 151643
    "<|im_start|>",  # 151644
    "<|im_end|>",  # 151645
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",  # 151652
    "<|vision_end|>",  # 151653
    "<|vision_pad|>",
    "<|image_pad|>",  # 151655
    "<|video_pad|>",  # 151656
)
SPECIAL_TOKEN_TO_ID: dict[str, int] = {tok: NUM_BPE_TOKENS + i for i, tok in enumerate(SPECIAL_TOKENS)}

ENDOFTEXT_ID = SPECIAL_TOKEN_TO_ID["<|endoftext|>"]
IM_END_ID = SPECIAL_TOKEN_TO_ID["<|im_end|>"]
IMAGE_PAD_ID = SPECIAL_TOKEN_TO_ID["<|image_pad|>"]
VISION_START_ID = SPECIAL_TOKEN_TO_ID["<|vision_start|>"]
VISION_END_ID = SPECIAL_TOKEN_TO_ID["<|vision_end|>"]

# Qwen2-VL's chat template, verbatim in behaviour: a default system turn, images as
# <|vision_start|><|image_pad|><|vision_end|>, and the assistant header on add_generation_prompt.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen2-VL's real image-processor limits.
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 16384
