"""An image's identity: the mm_hash of its decoded pixels, whatever names it.

  bytes        -> blake3(bytes) -> the memo of files seen (an exact repeat skips decoding)
                  -> else decode and hash the pixels
  uuid + bytes -> the same, once the uuid's binding agrees with the bytes (media_uuids.py); a
                  bound uuid names the pixels' hash directly, so a repeat skips decoding on any
                  node
  uuid alone   -> the pixels' hash its binding names

A uuid never becomes an identity itself, so no cache is keyed by something a client made up.
"""

from __future__ import annotations

import io
from collections.abc import Mapping

import blake3
from PIL import Image

from services.preprocess.config import PreprocessConfig
from services.preprocess.errors import MediaUuidUnboundError
from services.preprocess.image_decode import decode_image
from services.preprocess.media_sources import load_image
from services.preprocess.media_uuids import MediaUuids, has_source
from services.preprocess.processor_cache import BoundedMemo
from services.preprocess.prompt import ImageInput
from shared.hashing import mm_hash_of_pixels
from shared.index.uuid_bindings import ContentBinding
from shared.types import MmHash


class ImageIdentifier:
    def __init__(self, model_id: str, hash_kwargs: dict, config: PreprocessConfig, uuids: MediaUuids) -> None:
        self.model_id = model_id
        self.hash_kwargs = hash_kwargs
        self.config = config
        self.uuids = uuids
        # blake3(encoded file) -> mm_hash of its pixels: lets an exact repeat skip decoding.
        self.file_memo: BoundedMemo[bytes, MmHash] = BoundedMemo(config.file_hash_memo_entries)

    def identify(self, image: ImageInput, fetched: Mapping[str, bytes]) -> tuple[MmHash, Image.Image | None]:
        """(mm_hash, the decoded image when decoding was needed to name it)."""
        if image.uuid is None:
            data = self.read(image, fetched)
            return self._by_bytes(data, blake3.blake3(data).digest())
        if not has_source(image):
            bound = self.uuids.known(image.uuid, "image")
            if bound.mm_hash is None:  # bound by a clip: not an image's uuid
                raise MediaUuidUnboundError(f"uuid {image.uuid!r} is bound to a video, not an image: send the image")
            return MmHash(bound.mm_hash), None
        data = self.read(image, fetched)
        digest = blake3.blake3(data).digest()
        bound = self.uuids.bound_to(image.uuid, digest.hex(), "image")
        if bound is not None and bound.mm_hash is not None:
            return MmHash(bound.mm_hash), None
        mm_hash, pil = self._by_bytes(data, digest)
        width, height = pil.size if pil is not None else _header_size(data)
        self.uuids.bind(image.uuid, ContentBinding(digest.hex(), len(data), width, height, mm_hash), "image")
        return mm_hash, pil

    def read(self, image: ImageInput, fetched: Mapping[str, bytes]) -> bytes:
        """The image's encoded bytes: fetched already, or loaded from its source."""
        if not has_source(image):  # a uuid alone, whose processed pixels are not cached here
            raise MediaUuidUnboundError(f"image uuid {image.uuid!r} names an image whose pixels are no longer cached: send the image again")
        data = fetched.get(image.url) if image.url is not None else None
        return data if data is not None else load_image(image, self.config)

    def _by_bytes(self, data: bytes, file_key: bytes) -> tuple[MmHash, Image.Image | None]:
        memo_hash = self.file_memo.get(file_key)
        if memo_hash is not None:
            return memo_hash, None
        pil = decode_image(data, self.config)
        mm_hash = self.hash_pixels(pil)
        self.file_memo.put(file_key, mm_hash)
        return mm_hash, pil

    def hash_pixels(self, pil: Image.Image) -> MmHash:
        # Palette images store indices; hash the exact RGBA they denote so the palette and its
        # transparency are part of the identity.
        view = pil.convert("RGBA") if pil.mode in ("P", "PA") else pil
        return mm_hash_of_pixels(
            model_id=self.model_id,
            modality="image",
            mode=view.mode,
            size=view.size,
            pixel_bytes=view.tobytes(),
            processor_kwargs=self.hash_kwargs,
        )


def _header_size(data: bytes) -> tuple[int | None, int | None]:
    """The image's size from its header alone (it decoded before, or the memo would not know it)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except Exception:  # named already by its pixels' hash: the size only describes a binding
        return None, None
