"""Typed, validated configuration of the preprocessing library and service.

Every field can come from a CLI flag or a ``TESSERA_PREPROCESS_<FIELD>`` environment variable.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path

from services.models.video import VideoOptions
from shared.settings import add_dataclass_arguments, dataclass_from_sources

ENV_PREFIX = "TESSERA_PREPROCESS_"


@dataclass(frozen=True, slots=True)
class PreprocessConfig:
    # Encoded size limit per image, checked before decoding.
    max_image_bytes: int = 20 * 1024 * 1024
    # Decoded pixel limit per image, checked from the header before pixels are allocated.
    max_image_pixels: int = 40_000_000
    max_images_per_request: int = 16
    # Videos (services/preprocess/video_decode.py): encoded bytes, duration, frames the sampler
    # may pick and their decoded pixels, all checked before any frame is decoded; videos per
    # request; the threads that decode them (off the node's one working thread).
    max_video_bytes: int = 64 * 1024 * 1024  # the gateway's body limit: a data URL is no larger
    max_video_seconds: float = 3600.0
    max_video_frames: int = 768
    max_video_decoded_pixels: int = 768 * 1920 * 1080
    max_videos_per_request: int = 4
    video_decode_threads: int = 2
    # The deployment's video processor settings, a JSON object as vLLM's --mm-processor-kwargs
    # takes it (fps or num_frames, min_frames, max_frames, min_pixels, max_pixels); a request's
    # mm_processor_kwargs override them. Empty: the model's.
    mm_processor_kwargs: str = ""
    # Prompt length limit after placeholder expansion.
    max_prompt_tokens: int = 32768
    # Remote http(s) images and videos are fetched, as vLLM fetches them, from hosts that resolve
    # to public addresses only (checked per redirect, the address pinned for the connection:
    # remote_fetch.py). allowed_image_domains narrows that to those domains (empty: any public
    # host); allow_remote_images off refuses every remote URL.
    allow_remote_images: bool = True
    allowed_image_domains: tuple[str, ...] = ()
    remote_fetch_timeout_s: float = 10.0
    # Allow-listed hosts must still resolve to public addresses unless this is on (a private
    # image server inside the cluster, or tests on loopback).
    allow_private_image_addresses: bool = False
    # Local file paths are accepted only under this directory.
    local_media_dir: Path | None = None
    # Byte budget of the processor cache (pixel tensors); 0 disables it.
    processor_cache_bytes: int = 512 * 1024 * 1024
    # Entries of the encoded-file -> mm_hash memo (80 bytes each), and of the Pan-and-Scan
    # crop -> image memo; 0 disables them.
    file_hash_memo_entries: int = 65536
    # Client media uuids bind to the bytes first sent with them (shared/index/uuid_bindings.py),
    # kept in the index where there is one (every node sees them): a binding lives this long
    # after its last use, and at most this many live at once (about 200 bytes each).
    uuid_binding_ttl_s: float = 3600.0
    max_uuid_bindings: int = 100_000
    # Overrides the model's image-processor pixel bounds; part of mm_hash's processor kwargs.
    min_pixels: int | None = None
    max_pixels: int | None = None
    # Gemma3's Pan-and-Scan: a wide or tall image also gets up to 4 crops, each its own span of
    # image tokens (off by default, as in transformers); part of mm_hash's processor kwargs.
    # Families without crops ignore it.
    pan_and_scan: bool = False

    def __post_init__(self) -> None:
        positive = ("max_image_bytes", "max_image_pixels", "max_images_per_request", "max_prompt_tokens", "max_video_bytes")
        positive += ("max_video_seconds", "max_video_frames", "max_video_decoded_pixels", "max_videos_per_request", "video_decode_threads")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.processor_cache_bytes < 0 or self.file_hash_memo_entries < 0:
            raise ValueError("processor_cache_bytes and file_hash_memo_entries must be >= 0")
        self.video_defaults()  # a bad value fails at start-up, naming the setting
        if self.uuid_binding_ttl_s <= 0 or self.max_uuid_bindings < 1:
            raise ValueError("uuid_binding_ttl_s must be positive and max_uuid_bindings at least 1")
        if self.remote_fetch_timeout_s <= 0:
            raise ValueError("remote_fetch_timeout_s must be positive")
        if self.allowed_image_domains and not self.allow_remote_images:
            raise ValueError("allowed_image_domains is set but allow_remote_images is off")
        if self.min_pixels is not None and self.max_pixels is not None and self.min_pixels > self.max_pixels:
            raise ValueError("min_pixels must not exceed max_pixels")

    def video_defaults(self) -> VideoOptions:
        if not self.mm_processor_kwargs:
            return VideoOptions()
        try:
            given = json.loads(self.mm_processor_kwargs)
            if not isinstance(given, dict):
                raise ValueError("not a JSON object")
            return VideoOptions(**given)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"mm_processor_kwargs {self.mm_processor_kwargs!r}: {exc}") from None

    @classmethod
    def add_cli_arguments(cls, parser: argparse.ArgumentParser) -> None:
        add_dataclass_arguments(parser, cls, "preprocessing")

    @classmethod
    def from_sources(cls, args: argparse.Namespace | None = None, env: dict[str, str] | None = None) -> PreprocessConfig:
        """CLI flags win over environment variables, which win over defaults."""
        config = dataclass_from_sources(cls, ENV_PREFIX, args, env)
        # Domains compare case-insensitively.
        return replace(config, allowed_image_domains=tuple(d.lower() for d in config.allowed_image_domains))
