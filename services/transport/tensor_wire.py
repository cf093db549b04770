"""The wire format of one tensor message (services/transport/tensor_channel.py moves it): frame 0
is a JSON header {"key": str, "meta": {...}, "tensors": [{"name", "dtype", "shape"}, ...]},
followed by one raw frame per tensor (C-contiguous bytes, sent zero-copy)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["MalformedMessageError", "TensorMessage", "decode_message", "encode_message"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32}


@dataclass(slots=True)
class TensorMessage:
    key: str
    meta: dict
    tensors: dict[str, torch.Tensor]
    received_at: float = 0.0  # time.monotonic() when it reached the inbox

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


class MalformedMessageError(ValueError):
    pass


def encode_message(key: str, tensors: dict[str, torch.Tensor], meta: dict | None = None) -> tuple[bytes, list[memoryview]]:
    """The header frame and the tensors' frames (views of CPU copies, for a zero-copy send)."""
    header: dict = {"key": key, "meta": meta or {}, "tensors": []}
    frames: list[memoryview] = []
    for name, tensor in tensors.items():
        tensor = tensor.detach().to("cpu").contiguous()
        dtype = str(tensor.dtype).removeprefix("torch.")
        header["tensors"].append({"name": name, "dtype": dtype, "shape": list(tensor.shape)})
        raw = tensor.view(torch.uint8) if tensor.dtype == torch.bfloat16 else tensor
        frames.append(memoryview(raw.numpy()).cast("B"))
    return json.dumps(header).encode(), frames


def decode_message(frames: list) -> TensorMessage:
    """The message in ``frames``, or MalformedMessageError saying what is wrong with it."""
    try:
        header = json.loads(bytes(frames[0].buffer))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedMessageError(f"the header is not JSON: {exc}") from None
    if not (
        isinstance(header, dict)
        and isinstance(header.get("key"), str)
        and isinstance(header.get("meta"), dict)
        and isinstance(header.get("tensors"), list)
    ):
        raise MalformedMessageError("the header needs a string key, a meta object and a tensors list")
    if len(frames) != 1 + len(header["tensors"]):
        raise MalformedMessageError(f"{len(header['tensors'])} tensors declared, {len(frames) - 1} frames sent")
    tensors = {}
    for spec, frame in zip(header["tensors"], frames[1:]):
        try:
            tensors[spec["name"]] = _tensor(spec, frame)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise MalformedMessageError(f"tensor {spec!r:.120}: {exc}") from None
    return TensorMessage(header["key"], header["meta"], tensors)


def _tensor(spec: dict, frame) -> torch.Tensor:
    dtype = _DTYPES[spec["dtype"]]
    if dtype == torch.bfloat16:
        array = np.frombuffer(frame.buffer, dtype=np.uint8)
        tensor = torch.from_numpy(array.copy()).view(torch.bfloat16)
    else:
        array = np.frombuffer(frame.buffer, dtype=str(dtype).removeprefix("torch."))
        # The frame's buffer is owned by ZMQ; copy once into torch-owned memory.
        tensor = torch.from_numpy(array.copy())
    return tensor.reshape([int(d) for d in spec["shape"]])
