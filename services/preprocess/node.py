"""Preprocess node: the preprocessing library plus the sender side of the pixel cache mirror.

Preprocessing sends no pixels: the gateway routes the request first, then asks for the pixels
of the images the chosen encoder lacks to be pushed (``push_pixels``) to that encoder, or to a
prefill node that encodes them itself.

For each encoder it feeds, the node mirrors which mm_hashes that encoder already holds (an LRU
of hashes it has sent). An unforced push sends an image only on a mirror miss; a hit sends
nothing and counts the bytes skipped. The mirror can be stale (the encoder evicted an item): the
node that encodes then reports the item missing and the caller pushes again, forced.

With a cache index, a request may also skip processing images that a live encoder already holds
(Preprocessor's ``indexed_grids``); such items have no pixels here, so a push reports them not
found and the caller preprocesses again without skipping.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass

from services.models.registry import ModelRef
from services.preprocess.config import PreprocessConfig
from services.preprocess.errors import PreprocessError
from services.preprocess.media_sources import load_image_bytes, remote_url
from services.preprocess.media_uuids import UuidMetrics
from services.preprocess.preprocessor import IndexedGrids, PreprocessedRequest, Preprocessor, PreprocessorMetrics
from services.preprocess.processor_cache import BoundedMemo
from services.preprocess.prompt import Prompt
from services.preprocess.prompt_input import check_prompt
from services.preprocess.video_pool import PreparedMedia, VideoDecodePool
from services.transport.tensor_channel import OPEN_CHANNEL, ChannelAuth, TensorSender
from shared.cache_gauges import CacheGauges, cache_gauges
from shared.index.backend import CacheIndex
from shared.index.types import IndexUnavailableError
from shared.index.uuid_bindings import UuidBindings
from shared.liveness import Liveness
from shared.node_metrics import Counter, Histogram, counter, histogram
from shared.types import LoraRef, MmHash

MAX_MIRRORS = 64  # encoders mirrored at once (the least recently used one goes first)


@dataclass(frozen=True, slots=True)
class PixelTransfer:
    num_bytes_sent: int
    num_bytes_skipped: int


@dataclass(slots=True)
class PreprocessMetrics:
    preprocessor: PreprocessorMetrics
    uuids: UuidMetrics
    num_requests: Counter = counter("preprocess_requests_total", "Prompts preprocessed")
    num_images_skipped: Counter = counter(
        "preprocess_images_skipped_total", "Images not run through the image processor: a live encoder held their embeddings"
    )
    num_pixel_bytes_sent: Counter = counter("pixel_bytes_sent_total", "Bytes of pixels pushed to encoders and prefill nodes")
    num_pixel_bytes_skipped: Counter = counter("pixel_bytes_skipped_total", "Bytes of pixels not pushed: the encoder's mirror held them")
    pixel_mirror: CacheGauges = cache_gauges("pixel_mirror", "entries")  # over every encoder's mirror
    queue_time: Histogram = histogram("queue_seconds", "A call's wait for the node's one working thread")


class PreprocessNode:
    def __init__(
        self,
        model: ModelRef,
        config: PreprocessConfig,
        *,
        mirror_entries: int = 4096,
        index: CacheIndex | None = None,
        bindings: UuidBindings | None = None,
        liveness: Liveness | None = None,
        channel_auth: ChannelAuth = OPEN_CHANNEL,
    ) -> None:
        """``bindings``: the cluster's client media uuids, beside the index (by default this
        node's own)."""
        self.preprocessor = Preprocessor(model, config, bindings=bindings)
        self.video_decoder = VideoDecodePool(self.preprocessor, config.video_decode_threads)
        self.indexed_grids: IndexedGrids | None = grids_from_index(index) if index is not None else None
        self.sender = TensorSender(auth=channel_auth)
        self.mirror_entries = mirror_entries
        self._encoder_to_mirror: dict[str, BoundedMemo[str, bool]] = {}
        self._lock = threading.Lock()  # the preprocessor and its caches are single-threaded
        # Work runs one request at a time under the lock: one watch tells a hung request.
        self._watch = liveness.watch("preprocess") if liveness is not None else None
        self.num_waiting = 0  # calls waiting for or holding the lock: this node's load
        self.metrics = PreprocessMetrics(self.preprocessor.metrics, self.preprocessor.uuids.metrics)
        mirrors = self._encoder_to_mirror  # list(): one atomic copy under the GIL while a request may add a mirror
        self.metrics.pixel_mirror.read_from(lambda: sum(len(m) for m in list(mirrors.values())), lambda: mirror_entries * len(mirrors))

    def preprocess(
        self, prompt: Prompt, *, skip_indexed: bool = False, media: PreparedMedia | None = None, lora: LoraRef | None = None
    ) -> PreprocessedRequest:
        """``media``: the request's videos as ``prepare_media`` fetched and decoded them (else
        they are fetched and decoded here, on this thread). ``lora``: the request's adapter; one
        that changes the tower keys its items apart (Preprocessor.preprocess), and the index's
        encoders hold only the plain items, so none is skipped for it."""
        skip_indexed = skip_indexed and not (lora is not None and lora.tower)
        media = media or PreparedMedia({}, {})
        fetched = {**self._fetch_remote_images(prompt), **media.fetched}  # before the lock: a slow host delays this request only
        with self._working():
            result = self.preprocessor.preprocess(
                prompt, indexed_grids=self.indexed_grids if skip_indexed else None, fetched=fetched, decoded=media.decoded, lora=lora
            )
            self.metrics.num_images_skipped.inc(sum(1 for item in result.mm_items if item.image.pixel_values is None))
            self.metrics.num_requests.inc()
            return result

    async def prepare_media(self, prompt: Prompt) -> PreparedMedia:
        """The request's videos fetched and decoded on the node's decode pool, side by side and
        off the thread that tokenizes and processes; a clip whose groups are all cached is not
        decoded. Raises the first clip's PreprocessError."""
        return await self.video_decoder.prepare(prompt)

    def detokenize(self, token_ids: list[int]) -> str:
        """The text of ``token_ids``, special tokens included (as vLLM's /detokenize)."""
        with self._lock:  # the tokenizer is the preprocessor's, single-threaded as it is
            return self.preprocessor.detokenize(token_ids)

    def push_pixels(
        self, mm_hashes: list[MmHash], *, target_id: str, target_address: str, force: bool = True, key_prefix: str = ""
    ) -> tuple[list[MmHash], PixelTransfer]:
        """Push cached pixels to an encoder; without ``force``, skip those the mirror says it
        holds. With ``key_prefix`` the target is a prefill node encoding them itself: every image
        is sent, keyed ``key_prefix + mm_hash``, and no mirror records it (the node keeps
        embeddings, not pixels). Returns (hashes no longer cached here, bytes sent and skipped)."""
        with self._working():
            not_found, sent, skipped = [], 0, 0
            mirror = None if key_prefix else self._mirror(target_id)
            for mm_hash in mm_hashes:
                image = self.preprocessor.pixels_of(mm_hash)
                if image is None or image.pixel_values is None:
                    not_found.append(mm_hash)
                elif mirror is not None and not force and mirror.get(mm_hash):
                    skipped += image.num_bytes
                else:
                    sent += self._send_pixels(key_prefix + mm_hash, image, target_address)
                    if mirror is not None:
                        mirror.put(mm_hash, True)
            self.metrics.num_pixel_bytes_sent.inc(sent)
            self.metrics.num_pixel_bytes_skipped.inc(skipped)
            return not_found, PixelTransfer(sent, skipped)

    def _fetch_remote_images(self, prompt: Prompt) -> dict[str, bytes]:
        """Encoded bytes of the request's http(s) images, by URL, fetched on the caller's thread.
        A prompt that fails its checks fetches nothing: preprocessing reports the error."""
        config = self.preprocessor.config
        try:
            checked = check_prompt(prompt, max_images=config.max_images_per_request)
        except PreprocessError:
            return {}
        remote = {url for url in map(remote_url, checked.images) if url is not None}
        return {url: load_image_bytes(url, config) for url in remote}

    def load(self) -> tuple[float, float]:
        return float(self.num_waiting), 0.0

    @contextlib.contextmanager
    def _working(self):
        self.num_waiting += 1  # approximate under concurrency; only a load signal
        queued_at = time.monotonic()
        try:
            with self._lock, self._busy():
                self.metrics.queue_time.observe(time.monotonic() - queued_at)
                yield
        finally:
            self.num_waiting -= 1

    def _busy(self):
        return self._watch.busy() if self._watch is not None else contextlib.nullcontext()

    def _mirror(self, encoder_id: str) -> BoundedMemo[str, bool]:
        """The mirror of one encoder, most recently used last. Encoders come and go in an elastic
        cluster, so at most MAX_MIRRORS are kept: dropping one only costs resending pixels that
        encoder may already hold (a mirror is a hint; a miss is always safe)."""
        mirror = self._encoder_to_mirror.pop(encoder_id, None)
        if mirror is None:
            mirror = BoundedMemo(self.mirror_entries)
            while len(self._encoder_to_mirror) >= MAX_MIRRORS:
                del self._encoder_to_mirror[next(iter(self._encoder_to_mirror))]
        self._encoder_to_mirror[encoder_id] = mirror
        return mirror

    def _send_pixels(self, key: str, image, address: str) -> int:
        return self.sender.send(address, key, {"pixel_values": image.pixel_values}, {"grid_thw": list(image.grid_thw)})

    def close(self) -> None:
        self.sender.close()
        self.video_decoder.close()


def grids_from_index(index: CacheIndex) -> IndexedGrids:
    """Patch grids of the images some live encoder holds, per the index's placeholder metadata;
    nothing when the index is unreachable (the images are then processed as usual)."""

    def lookup(mm_hashes: list[MmHash]) -> dict[MmHash, tuple[int, int, int]]:
        try:
            result = index.lookup(mm_hashes, [])
        except IndexUnavailableError:
            return {}
        return {h: next(iter(holders.values())).grid_thw for h, holders in result.mm_holders.items() if holders}

    return lookup
