"""The reference users compare with: transformers' own processors with real torchvision, run in a
virtual environment of their own (deploy/reference-venv.sh) by tests/reference_worker.py, one
worker per test session. Images travel losslessly (PNG; TIFF for CMYK), clips as
their bytes; the answers are transformers' tensors as they came.

The project's environment holds the CPU torch wheel, beside which the registry's torchvision
does not import; the reference environment holds the registry's torch and torchvision pair. Both
run the same torch release, so the same CPU kernels.
"""

from __future__ import annotations

import atexit
import io
import os
import pickle
import struct
import subprocess
import threading
from pathlib import Path

import torch
from PIL import Image

WORKER = Path(__file__).with_name("reference_worker.py")
VENV_ENV = "TESSERA_REFERENCE_VENV"


def reference_python() -> Path:
    """The reference environment's interpreter; deploy/run-tests.sh builds it where it is missing."""
    venv = Path(os.environ.get(VENV_ENV) or Path.home() / ".cache/tessera/reference-venv")
    python = venv / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"no reference environment at {venv}: run deploy/reference-venv.sh (the README's test command does)")
    return python


def png_bytes(image: Image.Image) -> bytes:
    """The image losslessly: PNG, or TIFF for the modes PNG cannot hold (CMYK)."""
    buffer = io.BytesIO()
    image.save(buffer, "TIFF" if image.mode == "CMYK" else "PNG")
    return buffer.getvalue()


class ReferenceProcessors:
    """A client of one worker process; calls are serialized (one request at a time)."""

    def __init__(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "PYTHONPATH": ""}
        self._process = subprocess.Popen(
            [str(reference_python()), "-I", str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        self._lock = threading.Lock()
        atexit.register(self.close)

    def _call(self, request: dict) -> dict:
        data = pickle.dumps(request)
        with self._lock:
            assert self._process.stdin is not None and self._process.stdout is not None
            self._process.stdin.write(struct.pack(">Q", len(data)) + data)
            self._process.stdin.flush()
            head = self._process.stdout.read(8)
            if len(head) < 8:
                raise RuntimeError(f"the reference worker exited ({self._process.poll()})")
            (size,) = struct.unpack(">Q", head)
            answer = torch.load(io.BytesIO(self._process.stdout.read(size)), weights_only=False)
        if "error" in answer:
            raise RuntimeError(f"the reference processor failed:\n{answer['error']}")
        return answer["ok"]

    def images(self, model_dir: Path, images: list[Image.Image], **kwargs) -> dict:
        """AutoImageProcessor's output for ``images``."""
        return self._call({"op": "images", "model_dir": str(model_dir), "images": [png_bytes(i) for i in images], "kwargs": kwargs})

    def video(self, model_dir: Path, clips: list[bytes], **video_kwargs) -> dict:
        """AutoVideoProcessor's output for the clips, sampled by its own sampler (plus the
        indices it picked, ``frames_indices``)."""
        return self._call({"op": "video", "model_dir": str(model_dir), "videos": clips, "video_kwargs": video_kwargs})

    def sample(self, model_dir: Path, total: int, clip_fps: float, *, processor_kwargs=None, **sample_kwargs) -> list[int]:
        """The frame indices the checkpoint's video processor (built with ``processor_kwargs``)
        samples from a clip of ``total`` frames at ``clip_fps``, called with ``sample_kwargs``."""
        request = {"op": "sample", "model_dir": str(model_dir), "total": total, "fps": clip_fps}
        answer = self._call({**request, "kwargs": processor_kwargs or {}, "video_kwargs": sample_kwargs})
        return answer["indices"]

    def class_defaults(self, class_name: str, names: list[str]) -> dict:
        """Attributes of the transformers class ``class_name``, as the class defines them."""
        return self._call({"op": "class_defaults", "model_dir": "", "class_name": class_name, "names": names})

    def process(
        self, model_dir: Path, text: str, images: list[Image.Image] = (), clips: list[bytes] = (), *, video_kwargs=None, **kwargs
    ) -> dict:
        """AutoProcessor's output for a rendered prompt with its images and clips."""
        request = {
            "op": "process",
            "model_dir": str(model_dir),
            "text": text,
            "images": [png_bytes(i) for i in images],
            "videos": list(clips),
            "kwargs": kwargs,
            "video_kwargs": video_kwargs or {},
        }
        return self._call(request)

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()


_shared: ReferenceProcessors | None = None


def reference_processors() -> ReferenceProcessors:
    """The session's one worker, started on first use."""
    global _shared
    if _shared is None:
        _shared = ReferenceProcessors()
    return _shared
