"""The preprocessing pipeline. One call turns a Prompt (prompt.py) into model-ready
inputs:

  check (prompt_input.py) -> render prompt (chat template) -> per image: its identity
  (image_identity.py: bytes or a bound uuid -> mm_hash of its pixels), processor
  cache (hit skips the image processor) -> per video: its temporal groups (video_items.py)
  -> the family expands the image and video markers and tokenizes -> check length -> positions
  (the family's: M-RoPE or 1-D; a video group's placement in its clip travels with its item)

One image may fill several placeholder spans (Gemma3's Pan-and-Scan: the full view, then each
crop). Each span is its own item downstream, with mm_hash_of_part(image, k) as its identity, so
encoders, caches and the index treat crops like images.

Skipping pixels: a caller may pass ``indexed_grids``, which names the images whose embeddings a
live encoder already holds, with their patch grids (the cache index's placeholder metadata). On a
processor-cache miss such an image is not run through the image processor at all: its grid gives
the placeholder length and M-RoPE positions, and it carries no pixels (nothing downstream needs
them while that encoder holds its embeddings; a caller that does need them asks again without
``indexed_grids``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import jinja2
import torch
from PIL import Image

from services.models.family import ImageOptions, PlaceholderCountError, ProcessedImage
from services.models.hf_config import chat_template
from services.models.media_cost import MediaCosts
from services.models.registry import ModelRef
from services.models.tokenizer import load_tokenizer
from services.preprocess.adapter_items import AdaptedItems
from services.preprocess.config import PreprocessConfig
from services.preprocess.errors import InvalidRequestError, InvalidVideoDataError, PlaceholderMismatchError, PromptTooLongError
from services.preprocess.image_decode import decode_image
from services.preprocess.image_identity import ImageIdentifier
from services.preprocess.media_uuids import MediaUuids
from services.preprocess.processor_cache import BoundedMemo, ProcessorCache
from services.preprocess.prompt import ImageInput, Prompt
from services.preprocess.prompt_input import CheckedPrompt, check_prompt
from services.preprocess.truncation import truncated
from services.preprocess.video_items import DecodedClip, VideoPipeline
from shared.cache_gauges import CacheGauges, cache_gauges
from shared.hashing import mm_hash_of_part
from shared.index.uuid_bindings import InProcessBindings, UuidBindings
from shared.node_metrics import Counter, Gauge, counter, gauge
from shared.types import GroupPlacement, LoraRef, MmHash, PlaceholderRange

# The images (by mm_hash) that some live encoder holds -> their patch grids (t, h, w).
IndexedGrids = Callable[[list[MmHash]], Mapping[MmHash, tuple[int, int, int]]]


@dataclass(frozen=True, slots=True)
class MmItem:
    mm_hash: MmHash
    placeholder: PlaceholderRange
    image: ProcessedImage
    processor_cache_hit: bool
    placement: GroupPlacement | None = None  # a video's temporal group, positioned within its clip


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


@dataclass(slots=True)
class PreprocessorMetrics:
    """The processor cache (in images, and bytes held) and the encoded-file memo, read from them."""

    num_cache_hits: Counter = counter("processor_cache_hits_total", "Images found in the processor cache")
    num_cache_misses: Counter = counter("processor_cache_misses_total", "Images run through the image processor")
    num_cache_evictions: Counter = counter("processor_cache_evictions_total", "Processed images evicted from the processor cache")
    cache_bytes: Gauge = gauge("processor_cache_bytes", "Bytes of processed images cached (processor_cache_used_bytes)")
    cache: CacheGauges = cache_gauges("processor", "bytes")
    file_hash_memo: CacheGauges = cache_gauges("file_hash_memo", "entries")
    num_videos_decoded: Counter = counter("video_clips_decoded_total", "Video clips decoded (a clip whose groups were all cached is not)")
    video_decode_seconds: Counter = counter("video_decode_seconds_total", "Seconds spent reading headers and decoding sampled frames")


class Preprocessor:
    def __init__(self, model: ModelRef, config: PreprocessConfig | None = None, *, bindings: UuidBindings | None = None) -> None:
        """``bindings``: where client media uuids are bound (the cluster's index); by default
        this process's own."""
        self.model = model
        self.config = config or PreprocessConfig()
        self.tokenizer = load_tokenizer(model.path)
        self.chat_template = chat_template(model.path, self.tokenizer)
        # apply_chat_template's own parameters, which chat_template_kwargs may not set.
        self._template_parameters = frozenset(inspect.signature(self.tokenizer.apply_chat_template).parameters) - {"kwargs"}
        self.family = model.family
        self.model_config = self.family.read_config(model.path)
        self.vocab_size: int = self.model_config.shape.vocab_size
        options = ImageOptions(
            min_pixels=self.config.min_pixels, max_pixels=self.config.max_pixels, do_pan_and_scan=self.config.pan_and_scan
        )
        self.image_processor = self.family.image_processor(model.path, options)
        self.processor_cache = ProcessorCache(self.config.processor_cache_bytes)
        if bindings is None:
            bindings = InProcessBindings(ttl_s=self.config.uuid_binding_ttl_s, max_entries=self.config.max_uuid_bindings)
        self.uuids = MediaUuids(bindings)
        video_processor = self.family.video_processor(model.path, self.model_config, self.image_processor)
        self._videos: VideoPipeline | None = None  # None: the family takes no video
        if video_processor is not None:
            self._videos = VideoPipeline(video_processor, model.model_id, self.config, self.processor_cache, self.uuids)
        self.images = ImageIdentifier(model.model_id, self.image_processor.kwargs_for_hash, self.config, self.uuids)
        # A part's mm_hash -> (its image's mm_hash, part index): the processor cache holds whole
        # images, so a push of one Pan-and-Scan crop finds its pixels through its image.
        self._part_to_image: BoundedMemo[MmHash, tuple[MmHash, int]] = BoundedMemo(self.config.file_hash_memo_entries)
        self.adapted = AdaptedItems(self.config.file_hash_memo_entries)  # items under a LoRA adapter on the tower
        self.metrics = self._metrics()

    def _metrics(self) -> PreprocessorMetrics:
        metrics, cache, stats, memo = PreprocessorMetrics(), self.processor_cache, self.processor_cache.stats, self.images.file_memo
        metrics.num_cache_hits.read_from(lambda: stats.num_hits)
        metrics.num_cache_misses.read_from(lambda: stats.num_misses)
        metrics.num_cache_evictions.read_from(lambda: stats.num_evictions)
        metrics.cache_bytes.read_from(lambda: stats.num_bytes)
        metrics.cache.read_from(lambda: stats.num_bytes, lambda: cache.capacity_bytes)
        metrics.file_hash_memo.read_from(lambda: len(memo), lambda: memo.max_entries)
        if self._videos is not None:
            videos = self._videos
            metrics.num_videos_decoded.read_from(lambda: videos.num_decoded)
            metrics.video_decode_seconds.read_from(lambda: videos.decode_seconds)
        return metrics

    def preprocess(
        self,
        prompt: Prompt,
        *,
        indexed_grids: IndexedGrids | None = None,
        fetched: Mapping[str, bytes] | None = None,
        decoded: Mapping[MmHash, DecodedClip] | None = None,
        lora: LoraRef | None = None,
    ) -> PreprocessedRequest:
        """``fetched``: encoded bytes of remote media already fetched (by URL), so the caller can
        fetch them outside any lock this call runs under; ``decoded``: clips a node's decode pool
        has decoded (by clip identity), the rest are decoded here. ``lora``: the request's
        adapter; one that changes the tower gives every item an mm_hash of its own
        (adapter_items.py)."""
        fetched = fetched or {}
        parsed = check_prompt(prompt, max_images=self.config.max_images_per_request, max_videos=self.config.max_videos_per_request)
        pipeline = self.videos if parsed.videos else None  # a family without video says so before anything runs
        text = self._prompt(parsed)
        identified = [self.images.identify(image, fetched) for image in parsed.images]
        cached = [self.processor_cache.get(mm_hash) for mm_hash, _ in identified]
        misses = [mm_hash for (mm_hash, _), hit in zip(identified, cached) if hit is None]
        grids = indexed_grids(misses) if indexed_grids is not None and misses else {}
        hashed = [
            self._materialize(image, mm_hash, pil, hit, grids.get(mm_hash), fetched)
            for image, (mm_hash, pil), hit in zip(parsed.images, identified, cached)
        ]
        options = pipeline.settle(prompt.video_options) if pipeline else None
        videos = [pipeline.items(video, options, fetched, decoded or {}) for video in parsed.videos] if pipeline else []
        parts_per_image = [self.image_processor.split(image) for _, image, _ in hashed]
        try:
            expanded, ranges = self.family.expand_prompt(
                self.model_config, self.tokenizer, text, parts_per_image, [v.video for v in videos]
            )
        except PlaceholderCountError as exc:
            raise PlaceholderMismatchError(str(exc)) from None
        expanded = truncated(expanded, prompt.truncation, self.tokenizer.truncation_side, has_media=bool(ranges))
        if len(expanded) > self.config.max_prompt_tokens:
            raise PromptTooLongError(
                f"prompt is {len(expanded)} tokens after image and video expansion; the limit is {self.config.max_prompt_tokens}"
            )
        parts = [
            (self._part_hash(mm_hash, k, len(image_parts)), part, hit, None)
            for (mm_hash, _, hit), image_parts in zip(hashed, parts_per_image)
            for k, part in enumerate(image_parts)
        ]
        parts += [
            (group_hash, group, v.processor_cache_hit, placement)
            for v in videos
            for group_hash, group, placement in zip(v.group_hashes, v.video.groups, v.video.placements)
        ]
        placed = sorted(zip(parts, ranges), key=lambda pair: pair[1].offset)  # items in prompt order
        items = [MmItem(mm_hash, placeholder, part, hit, placement) for (mm_hash, part, hit, placement), placeholder in placed]
        ranges, grids = [item.placeholder for item in items], [item.image.grid_thw for item in items]
        positions, delta = self.family.positions(self.model_config, len(expanded), ranges, grids, [item.placement for item in items])
        items = self.adapted.apply(items, lora)
        return PreprocessedRequest(prompt_token_ids=expanded, mm_items=items, mrope_positions=positions, mrope_delta=delta)

    def media_costs(self) -> MediaCosts:
        """How the gateway prices this model's media before admitting them (media_cost.py)."""
        video = self._videos.processor.clip_cost(self._videos.defaults) if self._videos is not None else None
        return MediaCosts(self.image_processor.cost_model(), video)

    @property
    def videos(self) -> VideoPipeline:
        if self._videos is None:
            raise InvalidVideoDataError(f"{self.model.name} ({self.model_config.model_type}) takes no video input")
        return self._videos

    def _part_hash(self, image_hash: MmHash, index: int, num_parts: int) -> MmHash:
        if num_parts == 1:
            return image_hash
        part_hash = mm_hash_of_part(image_hash, index)
        self._part_to_image.put(part_hash, (image_hash, index))
        return part_hash

    def pixels_of(self, mm_hash: MmHash) -> ProcessedImage | None:
        """The processed pixels of an image or of one part of it (a Pan-and-Scan crop), while the
        processor cache holds them; None once evicted or when this node never processed them.
        An item's mm_hash under a tower adapter has the pixels of its plain one."""
        mm_hash = self.adapted.plain(mm_hash)
        owner = self._part_to_image.get(mm_hash)
        if owner is None:  # a whole image (one lookup each way, so the cache's hit counts stay true)
            return self.processor_cache.get(mm_hash)
        image_hash, index = owner
        image = self.processor_cache.get(image_hash)
        if image is None or image.pixel_values is None:
            return None
        return self.image_processor.split(image)[index]

    def detokenize(self, token_ids: Sequence[int]) -> str:
        self._check_vocabulary(token_ids, "token id")
        return self.tokenizer.decode(list(token_ids))

    def _check_vocabulary(self, token_ids: Sequence[int], what: str) -> None:
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            # "out of vocabulary", as vLLM words it (clients match on it)
            raise InvalidRequestError(f"{what} {bad[0]}, out of vocabulary: outside the vocabulary of {self.vocab_size}")

    def render_prompt(self, messages: Sequence[dict], *, tools: list[dict] | None = None, template_kwargs: dict | None = None) -> str:
        """The chat template's text. A template that refuses the conversation (Gemma3's asks
        for alternating user/assistant turns) is the request's fault: a 400 with its message."""
        template_kwargs = dict(template_kwargs or {})
        # As vLLM: chat_template_kwargs may set the generation prompt (on by default) and ask
        # for the final message to be continued (off); not both.
        add_generation_prompt = template_kwargs.pop("add_generation_prompt", True)
        continue_final_message = template_kwargs.pop("continue_final_message", False)
        for name, value in (("add_generation_prompt", add_generation_prompt), ("continue_final_message", continue_final_message)):
            if not isinstance(value, bool):
                raise InvalidRequestError(f"chat_template_kwargs.{name} must be true or false")
        if add_generation_prompt and continue_final_message:
            raise InvalidRequestError("continue_final_message and add_generation_prompt cannot both be true")
        if self._template_parameters & set(template_kwargs):
            names = ", ".join(sorted(self._template_parameters & set(template_kwargs)))
            raise InvalidRequestError(f"chat_template_kwargs may only set template variables, not {names}")
        if self.chat_template is None:
            raise InvalidRequestError(f"{self.model.name} ships no chat template: send a prompt (/v1/completions) instead of messages")
        try:
            return self.tokenizer.apply_chat_template(
                list(messages),
                tools=tools,
                chat_template=self.chat_template,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                **template_kwargs,
            )
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(f"the chat template cannot render these messages: {exc}") from None
        except ValueError as exc:  # transformers' own checks, e.g. a final message it cannot continue
            raise InvalidRequestError(f"cannot render these messages: {exc}") from None

    def _prompt(self, parsed: CheckedPrompt) -> str | list[int]:
        """The rendered prompt text, or the request's token ids (checked against the vocabulary);
        the family tokenizes text together with its image expansion."""
        if parsed.token_ids is not None:
            self._check_vocabulary(parsed.token_ids, "prompt_token_ids contains id")
            return list(parsed.token_ids)
        if parsed.text is not None:
            return parsed.text
        return self.render_prompt(parsed.template_messages or [], tools=parsed.tools, template_kwargs=parsed.template_kwargs)

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
            return mm_hash, ProcessedImage(None, indexed_grid, self.image_processor.num_tokens(indexed_grid)), False
        if pil is None:
            pil = decode_image(self.images.read(image_input, fetched), self.config)
        processed = self.image_processor.process(pil)
        self.processor_cache.put(mm_hash, processed)
        return mm_hash, processed, False
