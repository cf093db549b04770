"""Factories for test images and requests. Images are deterministic functions of their seed."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from protos.gen import pb
from services.gateway.frontend.prompt_wire import prompt_for_library, prompt_from_body
from services.preprocess.prompt import Prompt


def make_image(width: int, height: int, *, seed: int = 0, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    if mode == "P":
        indices = rng.integers(0, 16, size=(height, width), dtype=np.uint8)
        image = Image.fromarray(indices, mode="L").convert("P")
        palette = rng.integers(0, 256, size=16 * 3, dtype=np.uint8).tolist()
        image.putpalette(palette + [0] * (768 - len(palette)))
        return image
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    # Smooth gradients plus noise: realistic enough for resizing, distinct per seed.
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([(xx * (c + 1) + yy * (seed + 2)) % 256 for c in range(channels)], axis=-1)
    noise = rng.integers(0, 40, size=base.shape)
    pixels = ((base + noise) % 256).astype(np.uint8)
    if channels == 1:
        pixels = pixels[..., 0]
    return Image.fromarray(pixels, mode=mode)


def encode_image(image: Image.Image, fmt: str = "PNG", **save_kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **save_kwargs)
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_data_url(image: Image.Image, fmt: str = "PNG") -> str:
    return data_url(encode_image(image, fmt), f"image/{fmt.lower()}")


def make_clip(
    num_frames: int = 30,
    fps: int = 10,
    width: int = 64,
    height: int = 48,
    *,
    seed: int = 0,
    codec: str = "libx264",
    container: str = "mp4",
    frames: list[np.ndarray] | None = None,
) -> bytes:
    """An encoded clip of deterministic frames (each a function of its seed and index), or of
    ``frames`` (RGB arrays) as given; lossless where the codec allows, so frames stay distinct."""
    import av

    buf = io.BytesIO()
    if frames is None:
        frames = [np.asarray(make_image(width, height, seed=seed * 1000 + i)) for i in range(num_frames)]
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height = frames[0].shape[1], frames[0].shape[0]
        stream.pix_fmt = "yuv444p" if codec == "libx264" else "yuv420p"
        if codec == "libx264":
            stream.options = {"qp": "0"}
        for array in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
        out.mux(stream.encode())
    return buf.getvalue()


def make_clip_without_frame_rate() -> bytes:
    """A Matroska clip with every frame stamped at time 0 and no DefaultDuration: nothing in the
    file implies a rate, so FFmpeg leaves the average frame rate unset."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as out:  # Matroska takes equal timestamps, MP4 refuses them
        stream = out.add_stream("ffv1", rate=6)  # intra-only: a packet needs no timestamp order
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        frames = [av.VideoFrame.from_ndarray(np.asarray(make_image(32, 32, seed=i)), format="rgb24") for i in range(6)]
        for packet in [p for frame in frames for p in stream.encode(frame)] + list(stream.encode()):
            packet.pts, packet.dts, packet.duration = 0, 0, 0
            out.mux(packet)
    data = buf.getvalue()
    # The muxer writes the stream's rate as the track's DefaultDuration (ID 23 E3 83, then a 1-byte
    # size 0x80|n and n value bytes): overwrite it with a Void element (EC) of the same length.
    assert data.count(b"\x23\xe3\x83") == 1
    at = data.index(b"\x23\xe3\x83")
    length = 4 + (data[at + 3] & 0x7F)
    return data[:at] + bytes([0xEC, 0x80 | (length - 2)]) + bytes(length - 2) + data[at + length :]


def make_clip_of_unknown_codec() -> bytes:
    """A Matroska clip whose track names a codec id no FFmpeg knows (same length as H.264's)."""
    data = make_clip(6, fps=6, width=32, height=32, container="matroska")
    assert data.count(b"V_MPEG4/ISO/AVC") == 1
    return data.replace(b"V_MPEG4/ISO/AVC", b"V_XXXXX/ISO/AVC")


def decoded(data: bytes) -> Image.Image:
    """What a client's bytes decode to: the oracle sees exactly this image."""
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


@dataclass
class ChatCase:
    """A chat request in Tessera's form plus what the oracle needs for the same request."""

    body: dict
    oracle_messages: list[dict]
    images: list[Image.Image] = field(default_factory=list)
    videos: list[bytes] = field(default_factory=list)  # encoded clips, in prompt order

    @property
    def prompt(self) -> Prompt:
        """The body as the preprocess role takes it from the gateway."""
        return prompt_for_library(self.body)

    @property
    def wire_prompt(self) -> pb.PromptInput:
        """The body as the gateway sends it to the preprocess role."""
        return prompt_from_body(self.body)


@dataclass(frozen=True)
class Video:
    """An encoded clip as a chat part (a video_url data URL)."""

    data: bytes
    mime: str = "video/mp4"


def chat_case(*parts: str | bytes | tuple[bytes, str] | Video, fmt: str = "PNG", mm_processor_kwargs: dict | None = None) -> ChatCase:
    """Parts in order: str is text, bytes is an encoded image (PNG by default), (bytes, mime) too,
    a Video is a clip."""
    content: list[dict] = []
    oracle_content: list[dict] = []
    images: list[Image.Image] = []
    videos: list[bytes] = []
    for part in parts:
        if isinstance(part, str):
            content.append({"type": "text", "text": part})
            oracle_content.append({"type": "text", "text": part})
            continue
        if isinstance(part, Video):
            content.append({"type": "video_url", "video_url": {"url": data_url(part.data, part.mime)}})
            oracle_content.append({"type": "video"})
            videos.append(part.data)
            continue
        data, mime = part if isinstance(part, tuple) else (part, f"image/{fmt.lower()}")
        content.append({"type": "image_url", "image_url": {"url": data_url(data, mime)}})
        oracle_content.append({"type": "image"})
        images.append(decoded(data))
    body: dict = {"messages": [{"role": "user", "content": content}]}
    if mm_processor_kwargs:
        body["mm_processor_kwargs"] = mm_processor_kwargs
    return ChatCase(body=body, oracle_messages=[{"role": "user", "content": oracle_content}], images=images, videos=videos)


def conversation(*turns: ChatCase | str) -> ChatCase:
    """A multi-turn chat: each ChatCase is a user turn, each str an assistant reply, in order."""
    messages: list[dict] = []
    oracle_messages: list[dict] = []
    images: list[Image.Image] = []
    videos: list[bytes] = []
    for turn in turns:
        if isinstance(turn, str):
            reply = {"role": "assistant", "content": turn}
            messages.append(reply)
            oracle_messages.append(reply)
            continue
        messages += turn.body["messages"]
        oracle_messages += turn.oracle_messages
        images += turn.images
        videos += turn.videos
    return ChatCase(body={"messages": messages}, oracle_messages=oracle_messages, images=images, videos=videos)


def tool_call_history(call_id: str = "c1", function: str = "get_weather") -> list[dict]:
    """What agent clients send back: a developer message, a named user, the assistant's tool call
    and the tool's answer (OpenAI's message shapes)."""
    return [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "What is the weather?", "name": "ann"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": function, "arguments": "{}"}}],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": call_id},
    ]
