"""The preprocessing pipeline. One call turns a request body into model-ready inputs:

  parse -> render prompt (chat template) -> tokenize -> per image: load bytes, decode, mm_hash,
  processor cache (hit skips the image processor) -> expand placeholders -> check length
  -> M-RoPE positions

Skipping pixels: a caller may pass ``indexed_grids``, which names the images whose embeddings a
live encoder already holds, with their patch grids (the cache index's placeholder metadata). On a
processor-cache miss such an image is not run through the image processor at all: its grid gives
the placeholder length and M-RoPE positions, and it carries no pixels (nothing downstream needs
them while that encoder holds its embeddings; a caller that does need them asks again without
``indexed_grids``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import blake3
import torch
from PIL import Image

from services.preprocess.config import PreprocessConfig
from services.preprocess.errors import InvalidRequestError, PromptTooLongError
from services.preprocess.image_decode import decode_image
from services.preprocess.image_processing import ImageProcessor, ProcessedImage
from services.preprocess.image_sources import load_image_bytes
from services.preprocess.mrope import mrope_positions
from services.preprocess.placeholders import expand_placeholders
from services.preprocess.processor_cache import BoundedMemo, ProcessorCache
from services.preprocess.request_parsing import ImageInput, ParsedRequest, parse_request
from shared.cache_gauges import cache_gauges
from shared.hashing import mm_hash_of_pixels, mm_hash_of_stable_id
from shared.models.registry import ModelRef
from shared.types import MmHash, PlaceholderRange

# The images (by mm_hash) that some live encoder holds -> their patch grids (t, h, w).
IndexedGrids = Callable[[list[MmHash]], Mapping[MmHash, tuple[int, int, int]]]


@dataclass(frozen=True, slots=True)
class MmItem:
    mm_hash: MmHash
    placeholder: PlaceholderRange
    image: ProcessedImage
    processor_cache_hit: bool


@dataclass(frozen=True, slots=True)
class PreprocessedRequest:
    prompt_token_ids: list[int]
    mm_items: list[MmItem]
    mrope_positions: torch.Tensor  # (3, num_prompt_tokens) int64
    mrope_delta: int

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def to_json_dict(self) -> dict:
        return {
            "prompt_token_ids": self.prompt_token_ids,
            "num_prompt_tokens": self.num_prompt_tokens,
            "mm_items": [
                {
                    "mm_hash": item.mm_hash,
                    "offset": item.placeholder.offset,
                    "length": item.placeholder.length,
                    "grid_thw": list(item.image.grid_thw),
                    "processor_cache_hit": item.processor_cache_hit,
                }
                for item in self.mm_items
            ],
            "mrope_delta": self.mrope_delta,
        }


class Preprocessor:
    def __init__(self, model: ModelRef, config: PreprocessConfig | None = None) -> None:
        from transformers import AutoTokenizer

        self.model = model
        self.config = config or PreprocessConfig()
        self.tokenizer = AutoTokenizer.from_pretrained(str(model.path))
        model_config = json.loads((model.path / "config.json").read_text())
        self.image_token_id: int = model_config["image_token_id"]
        text_config = model_config.get("text_config", model_config)
        self.vocab_size: int = text_config["vocab_size"]
        self.image_processor = ImageProcessor(model.path, min_pixels=self.config.min_pixels, max_pixels=self.config.max_pixels)
        self.processor_cache = ProcessorCache(self.config.processor_cache_bytes)
        self._hash_kwargs = self.image_processor.kwargs_for_hash
        # blake3(encoded file) -> mm_hash of its pixels: lets an exact repeat skip decoding.
        self._file_to_mm_hash: BoundedMemo[bytes, MmHash] = BoundedMemo(self.config.file_hash_memo_entries)

    def cache_gauges(self) -> dict[str, float]:
        """Occupancy and budget of the processor cache and the file memo (shared/cache_gauges.py)."""
        memo = self._file_to_mm_hash
        return {
            **cache_gauges("processor", "bytes", self.processor_cache.stats.num_bytes, self.processor_cache.capacity_bytes),
            **cache_gauges("file_hash_memo", "entries", len(memo), memo.max_entries),
        }

    def preprocess(
        self, body: object, *, indexed_grids: IndexedGrids | None = None, fetched: Mapping[str, bytes] | None = None
    ) -> PreprocessedRequest:
        """``fetched``: encoded bytes of remote images already fetched (by reference), so the
        caller can fetch them outside any lock this call runs under."""
        fetched = fetched or {}
        parsed = parse_request(body, max_images=self.config.max_images_per_request)
        token_ids = self._tokenize(parsed)
        identified = [self._identify(image, fetched) for image in parsed.images]
        cached = [self.processor_cache.get(mm_hash) for mm_hash, _ in identified]
        misses = [mm_hash for (mm_hash, _), hit in zip(identified, cached) if hit is None]
        grids = indexed_grids(misses) if indexed_grids is not None and misses else {}
        hashed = [
            self._materialize(image, mm_hash, pil, hit, grids.get(mm_hash), fetched)
            for image, (mm_hash, pil), hit in zip(parsed.images, identified, cached)
        ]
        expanded, ranges = expand_placeholders(token_ids, self.image_token_id, [h[1].num_tokens for h in hashed])
        if len(expanded) > self.config.max_prompt_tokens:
            raise PromptTooLongError(
                f"prompt is {len(expanded)} tokens after image expansion; the limit is {self.config.max_prompt_tokens}"
            )
        items = [
            MmItem(mm_hash=mm_hash, placeholder=placeholder, image=image, processor_cache_hit=hit)
            for (mm_hash, image, hit), placeholder in zip(hashed, ranges)
        ]
        positions, delta = mrope_positions(len(expanded), ranges, [item.image.grid_thw for item in items], self.image_processor.merge_size)
        return PreprocessedRequest(prompt_token_ids=expanded, mm_items=items, mrope_positions=positions, mrope_delta=delta)

    def render_prompt(self, messages: Sequence[dict]) -> str:
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)

    def _tokenize(self, parsed: ParsedRequest) -> list[int]:
        if parsed.prompt_token_ids is not None:
            bad = [t for t in parsed.prompt_token_ids if t >= self.vocab_size]
            if bad:
                raise InvalidRequestError(f"prompt_token_ids contains id {bad[0]}, outside the vocabulary of {self.vocab_size}")
            return list(parsed.prompt_token_ids)
        text = parsed.prompt_text if parsed.prompt_text is not None else self.render_prompt(parsed.template_messages or [])
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _image_bytes(self, reference: str, fetched: Mapping[str, bytes]) -> bytes:
        data = fetched.get(reference)
        return data if data is not None else load_image_bytes(reference, self.config)

    def _identify(self, image_input: ImageInput, fetched: Mapping[str, bytes]) -> tuple[MmHash, Image.Image | None]:
        """(mm_hash, the decoded image if decoding was needed to hash it).

        Lookup order: client stable id, else the encoded-bytes memo (a repeat of the exact same
        file skips decoding), else decode and hash the pixels.
        """
        if image_input.uuid is not None:
            # A stable id names the content: neither the bytes nor the pixels are touched.
            return mm_hash_of_stable_id(
                model_id=self.model.model_id, modality="image", stable_id=image_input.uuid, processor_kwargs=self._hash_kwargs
            ), None
        data = self._image_bytes(image_input.reference, fetched)
        file_key = blake3.blake3(data).digest()
        memo_hash = self._file_to_mm_hash.get(file_key)
        if memo_hash is not None:
            return memo_hash, None
        pil = decode_image(data, self.config)
        mm_hash = self._hash_pixels(pil)
        self._file_to_mm_hash.put(file_key, mm_hash)
        return mm_hash, pil

    def _materialize(
        self,
        image_input: ImageInput,
        mm_hash: MmHash,
        pil: Image.Image | None,
        cached: ProcessedImage | None,
        indexed_grid: tuple[int, int, int] | None,
        fetched: Mapping[str, bytes],
    ) -> tuple[MmHash, ProcessedImage, bool]:
        """(mm_hash, processed image, processor-cache hit): the cached entry, a pixel-less record
        from the index's grid, or a fresh run of the image processor."""
        if cached is None and mm_hash in self.processor_cache:
            cached = self.processor_cache.get(mm_hash)  # a repeat of an image earlier in this request
        if cached is not None:
            return mm_hash, cached, True
        if indexed_grid is not None:
            t, h, w = indexed_grid
            return mm_hash, ProcessedImage(None, (t, h, w), t * h * w // self.image_processor.merge_size**2), False
        if pil is None:
            pil = decode_image(self._image_bytes(image_input.reference, fetched), self.config)
        processed = self.image_processor.process(pil)
        self.processor_cache.put(mm_hash, processed)
        return mm_hash, processed, False

    def _hash_pixels(self, pil: Image.Image) -> MmHash:
        # Palette images store indices; hash the exact RGBA they denote so the palette and its
        # transparency are part of the identity.
        view = pil.convert("RGBA") if pil.mode in ("P", "PA") else pil
        return mm_hash_of_pixels(
            model_id=self.model.model_id,
            modality="image",
            mode=view.mode,
            size=view.size,
            pixel_bytes=view.tobytes(),
            processor_kwargs=self._hash_kwargs,
        )
