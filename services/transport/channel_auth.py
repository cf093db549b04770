"""How a node's tensor messages are authenticated and bounded (tensor_channel.py says how they are
used): apart from the channel itself, which loads torch, so that a node's settings (and the
gateway process that builds every role's flags) can name them without it."""

from __future__ import annotations

from dataclasses import dataclass, field

# Far above the largest tensor (one frame) a node sends: a KV layer of a 128k-token prompt with 8
# KV heads of 128 in bfloat16 is 256 MiB, the pixels of an image at Qwen2-VL's max_pixels ~77 MB.
DEFAULT_MAX_FRAME_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ChannelAuth:
    """How a node's tensor messages are authenticated and bounded."""

    key: bytes | None = field(default=None, repr=False)  # HMAC-SHA256 key; None: messages carry no tag
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES  # an inbox's ZMQ MAXMSGSIZE

    def __post_init__(self) -> None:
        if self.max_frame_bytes < 1:
            raise ValueError("max_frame_bytes must be positive")


OPEN_CHANNEL = ChannelAuth()  # no tag: for single-process use and tests, and clusters without a secret
