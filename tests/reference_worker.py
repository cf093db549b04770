"""The reference processors' worker: transformers' own ``AutoProcessor`` (and its image and video
processors) as users run them, with real torchvision, in a virtual environment of its own
(deploy/reference-venv.sh builds it). It imports nothing of Tessera; tests/reference_processors.py
starts it and sends it requests.

Protocol, over stdin and stdout: each message is an 8-byte big-endian length and a pickle. A
request is a dict (``op`` one of "process", "images", "video", "sample", "class_defaults"); the answer is ``{"ok": outputs}``
with every tensor as it came from transformers, or ``{"error": text}``.

Videos are decoded whole with transformers' ``load_video(backend="pyav")``, then handed to the
processor with their metadata and ``do_sample_frames=True``: the processor's own sampler picks the
frames (transformers' documented way to sample decoded clips).
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
import tempfile
import traceback

import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoProcessor, AutoVideoProcessor
from transformers.video_utils import load_video

_cache: dict[tuple, object] = {}


def _cached(kind, model_dir: str, **kwargs):
    key = (kind.__name__, model_dir, tuple(sorted(kwargs.items())))
    if key not in _cache:
        _cache[key] = kind.from_pretrained(model_dir, **kwargs)
    return _cache[key]


def _images(items: list[bytes]) -> list[Image.Image]:
    return [Image.open(io.BytesIO(data)) for data in items]


def _videos(items: list[bytes]) -> tuple[list, list]:
    frames, metadata = [], []
    for data in items:
        with tempfile.NamedTemporaryFile(suffix=".mp4") as f:
            f.write(data)
            f.flush()
            clip, meta = load_video(f.name, backend="pyav")
        frames.append(clip)
        metadata.append(meta)
    return frames, metadata


def _outputs(batch) -> dict:
    return {key: value for key, value in batch.items()}


def handle(request: dict) -> dict:
    model_dir, kwargs = request["model_dir"], dict(request.get("kwargs") or {})
    op = request["op"]
    if op == "images":
        processor = _cached(AutoImageProcessor, model_dir)
        return {
            "backend": type(processor).__name__,
            **_outputs(processor(images=_images(request["images"]), return_tensors="pt", **kwargs)),
        }
    video_kwargs = dict(request.get("video_kwargs") or {})
    if op == "video":
        processor = _cached(AutoVideoProcessor, model_dir)
        frames, metadata = _videos(request["videos"])
        out = processor(videos=frames, video_metadata=metadata, do_sample_frames=True, return_tensors="pt", **video_kwargs)
        return {"backend": type(processor).__name__, "frames_indices": [list(m.frames_indices) for m in metadata], **_outputs(out)}
    if op == "class_defaults":  # a transformers class's own defaults, by name: an instance built with none
        import transformers

        made = getattr(transformers, request["class_name"])()
        plain = lambda v: {k: x for k, x in dict(v).items() if x is not None} if hasattr(v, "shortest_edge") else v  # noqa: E731
        return {name: plain(getattr(made, name)) for name in request["names"]}
    if op == "sample":  # the video processor's own sampler, built with the request's bounds
        from transformers.video_utils import VideoMetadata

        processor = AutoVideoProcessor.from_pretrained(model_dir, **kwargs)
        metadata = VideoMetadata(total_num_frames=request["total"], fps=request["fps"], width=64, height=48)
        return {"indices": [int(i) for i in processor.sample_frames(metadata, **video_kwargs)], "backend": type(processor).__name__}
    if op == "process":
        processor = _cached(AutoProcessor, model_dir)
        extra = {}
        if request.get("images"):
            extra["images"] = _images(request["images"])
            extra.update(kwargs)
        if request.get("videos"):
            frames, metadata = _videos(request["videos"])
            extra.update(videos=frames, video_metadata=metadata, do_sample_frames=True, **video_kwargs)
        # The rendered chat template already holds any BOS: tokenize the text as it stands.
        out = processor(text=[request["text"]], return_tensors="pt", return_mm_token_type_ids=True, add_special_tokens=False, **extra)
        return {"backend": type(processor.image_processor).__name__, **_outputs(out)}
    raise ValueError(f"unknown op {op!r}")


def _read(stream) -> dict | None:
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack(">Q", head)
    return pickle.loads(stream.read(size))


def _write(stream, message: dict) -> None:
    buffer = io.BytesIO()
    torch.save(message, buffer)
    data = buffer.getvalue()
    stream.write(struct.pack(">Q", len(data)) + data)
    stream.flush()


def main() -> None:
    torch.set_num_threads(1)  # the suite runs beside it on few cores
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # library prints must not corrupt the channel
    while (request := _read(stdin)) is not None:
        try:
            _write(stdout, {"ok": handle(request)})
        except Exception:
            _write(stdout, {"error": traceback.format_exc()})


if __name__ == "__main__":
    main()
