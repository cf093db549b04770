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
from dataclasses import dataclass

import blake3

from shared.types import BlockHash, MmHash, PlaceholderRange

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


def mm_hash_of_video(
    *,
    model_id: str,
    content: Mapping[str, str],
    processor_kwargs: Mapping[str, object],
    decoder: str,
) -> MmHash:
    """A video clip's identity before it is decoded: the model, its source (``{"kind": "file",
    "digest": blake3 of the encoded bytes}``, also for a clip named by a client uuid bound to them),
    every sampler and processor setting, and the decoder that turns the bytes into frames. It
    names the clip's list of temporal groups; each group's own mm_hash (``mm_hash_of_pixels`` of
    its processed pixels) is what caches and the index hold."""
    return MmHash(
        digest_hex(
            {
                "model_id": model_id,
                "modality": "video",
                "content": dict(content),
                "processor_kwargs": dict(processor_kwargs),
                "decoder": decoder,
            }
        )
    )


def mm_hash_of_part(image: MmHash, index: int) -> MmHash:
    """mm_hash of part ``index`` of an image that fills several placeholder spans (Gemma3's
    Pan-and-Scan: the full view, then each crop). Derived from the image's own mm_hash, so the
    processor settings that decided the crops are part of every part's identity."""
    return MmHash(digest_hex({"image": image, "part": index}))


def mm_hash_for_adapter(mm_hash: MmHash, fingerprint: str) -> MmHash:
    """mm_hash of an image (or part, or video group) as encoded with a LoRA adapter that changes
    the vision tower or projector (LoraRef.tower): its embeddings differ from the base model's,
    so every cache and index entry of them is keyed apart, by the adapter's fingerprint. An
    adapter that leaves the tower alone keeps the plain mm_hash and shares the embeddings."""
    return MmHash(digest_hex({"image": mm_hash, "lora": fingerprint}))


# ---------------------------------------------------------------------------------------------
# Block hashes (prefix KV cache)
#
# block_hash[i] = digest((parent, tuple(token_ids of block i), extra_keys_i))
#   parent       = block_hash[i-1], or ROOT_BLOCK_HASH for block 0 (a fixed constant)
#   extra_keys_i = tagged tuples, in this order:
#       ("lora", name)                        every block, when a LoRA adapter is active
#       ("salt", cache_salt)                  block 0 only, when the request carries a salt
#       ("mm", mm_hash, offset_in_item)       each image overlapping the block, in prompt order;
#                                             offset_in_item = first overlapped token's index
#                                             inside the item
# Only full blocks are hashed. Tags keep kinds apart: a salt can never collide with an image id.
# ---------------------------------------------------------------------------------------------

ROOT_BLOCK_HASH = BlockHash(digest_hex("tessera/root-block/v1"))


@dataclass(frozen=True, slots=True)
class MmSpan:
    """An item's identity (its mm_hash) and its placeholder span in the prompt."""

    mm_hash: MmHash
    placeholder: PlaceholderRange


def block_extra_keys(
    block_index: int,
    block_size: int,
    mm_spans: Sequence[MmSpan] = (),
    *,
    cache_salt: str | None = None,
    lora_name: str | None = None,
) -> tuple:
    start, end = block_index * block_size, (block_index + 1) * block_size
    keys: list[tuple] = []
    if lora_name is not None:
        keys.append(("lora", lora_name))
    if cache_salt is not None and block_index == 0:
        keys.append(("salt", cache_salt))
    for span in mm_spans:
        lo, hi = span.placeholder.offset, span.placeholder.end
        if lo < end and hi > start:
            keys.append(("mm", span.mm_hash, max(start, lo) - lo))
    return tuple(keys)


def hash_block(parent: BlockHash, token_ids: Sequence[int], extra_keys: tuple = ()) -> BlockHash:
    """digest_hex((parent, tuple(token_ids), extra_keys)): the definition every fast path must match."""
    tokens = b"".join([b"I%d;" % t for t in token_ids])
    raw = b"L3:" + canonical_bytes(parent) + b"L%d:" % len(token_ids) + tokens + canonical_bytes(extra_keys)
    return BlockHash(blake3.blake3(raw, key=HASH_KEY).hexdigest())


def extend_block_hashes(
    existing: Sequence[BlockHash],
    token_ids: Sequence[int],
    block_size: int,
    mm_spans: Sequence[MmSpan] = (),
    *,
    cache_salt: str | None = None,
    lora_name: str | None = None,
) -> list[BlockHash]:
    """``existing`` plus the hashes of every further full block of ``token_ids``.

    ``existing`` must be the hashes of the first ``len(existing)`` blocks of the same tokens; this
    lets a request hash incrementally as decode fills blocks.

    Each hash equals ``hash_block(parent, block, block_extra_keys(...))`` byte for byte (tested),
    but the canonical serialization is assembled from pre-encoded pieces: this runs for every
    block of every request on the router's hot path, where the generic encoder was the cost.
    """
    hashes = list(existing)
    first, stop = len(hashes), len(token_ids) // block_size
    if first >= stop:
        return hashes
    # One %-format encodes every token exactly as a canonical int ("I" decimal ";"); "|" never
    # occurs in that encoding, so it marks block ends and one split yields each block's bytes.
    token_format = (b"I%d;" * block_size + b"|") * (stop - first)
    encoded_blocks = (token_format % tuple(token_ids[first * block_size : stop * block_size])).split(b"|")
    tails = _extra_key_tails(first, stop, block_size, mm_spans, cache_salt, lora_name)
    plain_tail = _encoded_extra_keys([], lora_name)  # blocks with no salt and no image
    head = b"L%d:" % block_size
    parent_bytes = canonical_bytes(hashes[-1] if hashes else ROOT_BLOCK_HASH)
    new, tail_of, append = blake3.blake3, tails.get, hashes.append
    for index in range(first, stop):
        raw = b"".join((b"L3:", parent_bytes, head, encoded_blocks[index - first], tail_of(index, plain_tail)))
        parent = new(raw, key=HASH_KEY).hexdigest()
        # A blake3 hex digest is 64 ASCII characters: its canonical str encoding is "S64:" + it.
        parent_bytes = b"S64:" + parent.encode()
        append(BlockHash(parent))
    return hashes


def _extra_key_tails(
    first: int, stop: int, block_size: int, mm_spans: Sequence[MmSpan], cache_salt: str | None, lora_name: str | None
) -> dict[int, bytes]:
    """canonical_bytes(block_extra_keys(i, ...)) for each block in [first, stop) whose keys go
    beyond the LoRA key: block 0 when salted, and each block an image overlaps."""
    block_to_keys: dict[int, list[bytes]] = {}  # encoded keys after the LoRA key, in order
    if cache_salt is not None and first == 0:
        block_to_keys[0] = [canonical_bytes(("salt", cache_salt))]
    for span in mm_spans:  # in the caller's order, as block_extra_keys lists them
        lo, hi = span.placeholder.offset, span.placeholder.end
        key_head = b"L3:S2:mm" + canonical_bytes(span.mm_hash) + b"I"
        # Exactly the blocks i with lo < (i+1)*block_size and hi > i*block_size, as in block_extra_keys.
        for index in range(max(first, lo // block_size), min(stop, (hi - 1) // block_size + 1)):
            key = b"%s%d;" % (key_head, max(index * block_size, lo) - lo)
            keys = block_to_keys.get(index)
            if keys is None:
                block_to_keys[index] = [key]
            else:
                keys.append(key)
    return {index: _encoded_extra_keys(keys, lora_name) for index, keys in block_to_keys.items()}


def _encoded_extra_keys(keys: list[bytes], lora_name: str | None) -> bytes:
    """Canonical bytes of the extra-keys tuple: the LoRA key first, then ``keys`` (encoded)."""
    if lora_name is not None:
        keys = [canonical_bytes(("lora", lora_name)), *keys]
    return b"L%d:" % len(keys) + b"".join(keys)


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    mm_spans: Sequence[MmSpan] = (),
    *,
    cache_salt: str | None = None,
    lora_name: str | None = None,
) -> list[BlockHash]:
    """Hashes of every full block of ``token_ids``."""
    return extend_block_hashes([], token_ids, block_size, mm_spans, cache_salt=cache_salt, lora_name=lora_name)
