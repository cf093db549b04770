"""The one hashing contract shared by router, preprocess, prefill and decode.

Every process must derive identical hashes from identical inputs, so nothing here may depend on
Python's ``hash()``, pickle, dict order or the process. Values are serialized canonically, then
digested with blake3 under a fixed domain-separation key.

Canonical serialization (``canonical_bytes``): a type tag byte followed by the payload.
  None -> b"N"; bool -> b"T"/b"F"; int -> b"I" + decimal + b";"
  str  -> b"S" + len + b":" + utf-8; bytes -> b"B" + len + b":" + raw
  list/tuple -> b"L" + count + b":" + items; dict -> b"D" + count + b":" + items sorted by key bytes
Lengths prefix every variable-size payload, so no two distinct values share an encoding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import blake3

from shared.types import MmHash

# Fixed 32-byte key: hashes are stable across processes, machines and releases of this contract.
HASH_KEY = b"tessera/hash-contract/v1".ljust(32, b"\0")

CanonicalValue = None | bool | int | float | str | bytes | Sequence | Mapping


def canonical_bytes(value: CanonicalValue) -> bytes:
    """Serialize ``value`` canonically; equal values give equal bytes in every process."""
    out = bytearray()
    _encode(value, out)
    return bytes(out)


def _encode(value: CanonicalValue, out: bytearray) -> None:
    if value is None:
        out += b"N"
    elif isinstance(value, bool):
        out += b"T" if value else b"F"
    elif isinstance(value, int):
        out += b"I" + str(value).encode() + b";"
    elif isinstance(value, float):
        # repr() round-trips exactly, so equal floats serialize equally.
        out += b"R" + repr(value).encode() + b";"
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        out += b"S" + str(len(raw)).encode() + b":" + raw
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        out += b"B" + str(len(raw)).encode() + b":" + raw
    elif isinstance(value, Mapping):
        items = sorted(((canonical_bytes(k), v) for k, v in value.items()), key=lambda kv: kv[0])
        out += b"D" + str(len(items)).encode() + b":"
        for key_bytes, item in items:
            out += key_bytes
            _encode(item, out)
    elif isinstance(value, Sequence):
        out += b"L" + str(len(value)).encode() + b":"
        for item in value:
            _encode(item, out)
    else:
        raise TypeError(f"cannot canonically serialize {type(value).__name__}")


def digest_hex(value: CanonicalValue) -> str:
    return blake3.blake3(canonical_bytes(value), key=HASH_KEY).hexdigest()


def mm_hash_of_pixels(
    *,
    model_id: str,
    modality: str,
    mode: str,
    size: tuple[int, int],
    pixel_bytes: bytes | memoryview,
    processor_kwargs: Mapping[str, object],
) -> MmHash:
    """mm_hash of decoded pixels: the item's identity for every cache and the index.

    The pixel payload is fed to blake3 in streaming form after its canonical header, so hashing a
    large image costs one pass over its bytes and no copy.
    """
    header = canonical_bytes(
        {
            "model_id": model_id,
            "modality": modality,
            "content": {"kind": "pixels", "mode": mode, "size": list(size)},
            "processor_kwargs": dict(processor_kwargs),
        }
    )
    hasher = blake3.blake3(key=HASH_KEY)
    hasher.update(header)
    hasher.update(b"P" + str(len(pixel_bytes)).encode() + b":")
    hasher.update(pixel_bytes)
    return MmHash(hasher.hexdigest())


def mm_hash_of_stable_id(
    *,
    model_id: str,
    modality: str,
    stable_id: str,
    processor_kwargs: Mapping[str, object],
) -> MmHash:
    """mm_hash of an item named by a client-supplied stable id instead of its pixels."""
    return MmHash(
        digest_hex(
            {
                "model_id": model_id,
                "modality": modality,
                "content": {"kind": "stable_id", "id": stable_id},
                "processor_kwargs": dict(processor_kwargs),
            }
        )
    )
