"""Making a request's image embeddings resident in the prefill engine's encoder cache: a request
rebuilt from the wire carries no pixels (remote_request.py). Which items, and when, is the
window's choice (embedding_window.py, embedding_feed.py); this module brings them.

Images already held are claimed. Of the rest, those the router chose this node to encode arrive as
pixels in the inbox and are encoded by the node's own tower; the others are fetched from the
encoder, which pushes them to the inbox, or first from the node the router named as their
holder (another encoder, or a prefill node: ``ship``), the encoder encoding what that one no
longer has. Claims and imports run on the engine thread and each holds a reference for the
request, so nothing it needs is evicted before it is computed; PrefillNode.run releases them
when the request ends.

An image is fetched or encoded by one request at a time: the inbox hands a pushed message to one
waiter only, so a second request for an image in flight waits for that work and claims the
result (doing it itself if that failed); that bookkeeping lives on the serving loop, which
awaits it. The tower runs on a compute thread of its own beside the engine, not inside an engine
step, where a pass would hold back every prompt whose embeddings were ready; one pass at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from services.engine import connector
from services.engine.engine import Engine, RequestRejectedError
from services.engine.engine_loop import EngineLoop
from services.engine.remote_request import PromptItem
from services.engine.request import Request
from services.models.family import VisionEncoder
from services.models.lora.adapter import LoraAdapter
from services.models.lora.tower import TowerLoras
from services.prefill.embedding_index import EmbeddingIndex
from services.prefill.embedding_window import Window, plan_window
from services.prefill.job import PrefillJob, Upstream
from services.prefill.local_pixels import LocalEncodeUnavailableError, MissingPixelsError, PixelsMatchFn, take_pixels
from services.transport.tensor_channel import TensorInbox, TensorSender
from shared.compute_thread import ComputeThread
from shared.node_metrics import Counter, counter
from shared.types import MmHash

log = logging.getLogger("tessera.prefill.embeddings")
NO_TOWER = "this prefill node has no vision tower (started with --local-encode false)"
# Awaited when an import finds the cache full: the request runs meanwhile and frees rows.
OnFull = Callable[[], Awaitable[None]]
# The job's local-encode pixels by mm_hash, given the items about to be encoded (taken from the
# inbox as they are first needed, then held: embedding_feed.py).
LocalPixels = Callable[[list[PromptItem]], Awaitable[dict[MmHash, torch.Tensor]]]


def _runs_by_source(job: PrefillJob, items: Sequence[PromptItem]) -> list[tuple[str | None, list[PromptItem]]]:
    """``items`` cut into runs of consecutive items from one source: None for this node's own
    tower, else the holder named for them, or the encoder."""
    runs: list[tuple[str | None, list[PromptItem]]] = []
    for item in items:
        source = None if item.mm_hash in job.local_encode else job.image_to_source.get(item.mm_hash) or job.encoder_address or ""
        if runs and runs[-1][0] == source:
            runs[-1][1].append(item)
        else:
            runs.append((source, [item]))
    return runs


class EmbeddingsUnavailableError(RuntimeError):
    """The encoder never pushed some embeddings it was asked for."""

    def __init__(self, missing: list[str], encoder: str) -> None:
        super().__init__(f"embeddings unavailable for {len(missing)} image(s)")
        self.missing = missing
        self.encoder = encoder


@dataclass(slots=True)
class EmbeddingMetrics:
    num_pulled: Counter = counter("prefill_embeddings_pulled_total", "Images' embeddings pushed here by an encoder")
    num_local_encodes: Counter = counter(
        "prefill_images_encoded_locally_total", "Images whose pixels came here to be encoded by this node's own tower"
    )
    tower_seconds: Counter = counter("prefill_tower_seconds_total", "Seconds this node's own vision tower ran")
    num_windows_while_running: Counter = counter(
        "prefill_embedding_windows_total", "Windows of a request's embeddings brought while it ran (more than the cache had room for)"
    )
    num_shipped: Counter = counter("prefill_embeddings_shipped_total", "Images' embeddings this node shipped to another prefill node")
    # Claims: a request's images found in the engine's embedding cache, or not.
    num_hits: Counter = counter("embedding_cache_hits_total", "A request's images found in the embedding cache")
    num_misses: Counter = counter("embedding_cache_misses_total", "A request's images not in the embedding cache")


class ResidentEmbeddings:
    def __init__(
        self,
        loop: EngineLoop,
        inbox: TensorInbox,
        index: EmbeddingIndex,
        vision: VisionEncoder | None,
        pixels_match: PixelsMatchFn,
        *,
        wait_s: float,
    ) -> None:
        self.loop = loop
        self.tower_loras: TowerLoras | None = None  # LoRA adapters on the tower: a local encode runs the request's
        self.inbox = inbox
        self.index = index  # touched on the engine thread only
        self.vision = vision
        self.pixels_match = pixels_match
        self.wait_s = wait_s
        self._mm_hash_to_fetch: dict[MmHash, asyncio.Event] = {}  # images in flight here; on the loop only
        self.tower = ComputeThread("prefill-tower") if vision is not None else None
        self.metrics = EmbeddingMetrics()
        if vision is not None:
            self.metrics.tower_seconds.read_from(lambda: vision.seconds_encoding)

    async def bring(
        self,
        job: PrefillJob,
        lacking: Sequence[PromptItem],
        upstream: Upstream,
        on_full: OnFull,
        pixels: LocalPixels,
        adapter: LoraAdapter | None = None,
    ) -> None:
        """Make ``lacking`` (items of ``job`` the cache lacked when planned, in prompt order)
        resident for its request: encoded here, shipped by their named holder, or pushed by the
        encoder. They are imported in prompt order (a run of items from one source at a time),
        so what the request holds is always a run it can compute through. An import that finds
        no room awaits ``on_full`` and retries. Raises on failure, leaving the references taken
        so far for ``release``. ``pixels``: the job's local-encode pixels, taken once.
        ``adapter``: the request's LoRA adapter, whose tower updates a local encode runs."""
        for source, run in _runs_by_source(job, lacking):
            if source is None:
                await self._encode_here(job.request_id, run, await pixels(run), on_full, adapter)
            else:
                await self._bring_remote(job, run, source, upstream, on_full)

    async def _bring_remote(self, job: PrefillJob, items: list[PromptItem], source: str, upstream: Upstream, on_full: OnFull) -> None:
        rid = job.request_id
        from_encoder = items
        if source != (job.encoder_address or ""):
            try:
                from_encoder = await self._fetch(rid, items, source, upstream, job, on_full)
            except Exception as exc:  # a holder that cannot ship costs only the saving: the encoder encodes
                log.info("holder %s did not ship %d image(s) (%s); asking the encoder", source, len(items), exc)
                from_encoder = await asyncio.wrap_future(self._claim(rid, items))  # those it did ship are held
        if not from_encoder:
            return
        if not job.encoder_address:
            raise RequestRejectedError("images need embeddings but no encoder_address was given")
        missing = await self._fetch(rid, from_encoder, job.encoder_address, upstream, job, on_full)
        if missing:
            raise MissingPixelsError([i.mm_hash for i in missing], "encoder lacks pixels for some images")

    async def take_local_pixels(
        self, job: PrefillJob, needed: Sequence[PromptItem], taken: Collection[MmHash]
    ) -> dict[MmHash, torch.Tensor]:
        """The pixels pushed here for items of ``job`` this node encodes and has not ``taken``:
        ``needed`` awaited, the others taken if here, to be held for the request's later windows
        (in the inbox they would age)."""
        here = list({i.mm_hash: i for i in job.items if i.mm_hash in job.local_encode and i.mm_hash not in taken}.values())
        return await self._receive_pixels(job.local_pixels_key_prefix, here, [i for i in needed if i.mm_hash not in taken])

    def plan(self, request: Request, items: Sequence[PromptItem]) -> Future[Window]:
        """The request's next window (embedding_window.py), its resident items claimed, on the
        engine thread, as a future. It starts where the engine computes the request next: past
        its computed tokens, or past its cached prefix before it is first scheduled (items the
        prefix covers are never brought). Once the request has left the engine (answered, or
        aborted), nothing is claimed for it any more."""

        def plan(engine: Engine) -> Window:
            for item in items:  # every image reaching this node passes here, on the engine thread
                self.index.remember_grid(item.mm_hash, item.grid_thw)
            if request.status.is_finished:
                return Window(complete=True)
            start = request.num_computed_tokens
            if start == 0:
                start = engine.kv.find_cached_prefix(request).num_blocks * engine.kv.block_size
            window = plan_window(engine.encoder_cache, request.request_id, items, start)
            self.metrics.num_hits.inc(window.num_claimed)
            self.metrics.num_misses.inc(len(window.lacking))
            return window

        return self.loop.call(plan)

    def _claim(self, request_id: str, items: Sequence[PromptItem]) -> Future[list[PromptItem]]:
        """Reference the items of ``items`` this node holds, on the engine thread; the future
        gives those it lacks."""

        def claim(engine: Engine) -> list[PromptItem]:
            return [i for i in items if not engine.encoder_cache.check_and_update_cache(request_id, i.mm_hash)]

        return self.loop.call(claim)

    def release(self, request_id: str, items: Sequence[PromptItem]) -> None:
        self.loop.call(lambda engine: engine.encoder_cache.free_request(request_id, [i.mm_hash for i in items]))

    def drop_pixels(self, job: PrefillJob) -> None:
        """Drop what is left in the inbox of the pixels pushed here for ``job``: those of items
        found resident here were never taken."""
        for mm_hash in job.local_encode:
            self.inbox.discard(job.local_pixels_key_prefix + mm_hash)

    async def _fetch(
        self, request_id: str, lacking: list[PromptItem], source: str, upstream: Upstream, job: PrefillJob, on_full: OnFull
    ) -> list[PromptItem]:
        """Import ``lacking`` from ``source`` (an encoder, or a prefill node shipping what it
        holds); returns those it could neither ship nor encode (no pixels there)."""
        unavailable: list[PromptItem] = []
        # Twice: an image another request was fetching, and failed to, is fetched here once.
        for _ in range(2):
            mine, others = self._begin(lacking)
            try:
                if mine:
                    tower = job.lora if job.lora is not None and job.lora.tower else None  # the encoder runs its adapter
                    missing = set(await upstream.encode(source, mine, self.inbox.address, job.deadline_s, tower))
                    unavailable += [i for i in mine if i.mm_hash in missing]
                    await self._receive(request_id, [i for i in mine if i.mm_hash not in missing], source, on_full)
            finally:
                self._end(mine)
            lacking = await self._await_others(request_id, others) if others else []
            if not lacking:
                return unavailable
        raise EmbeddingsUnavailableError([i.mm_hash for i in lacking], source)

    async def ship(self, mm_hashes: Sequence[MmHash], target: str, sender: TensorSender) -> list[MmHash]:
        """Push the embeddings held here of ``mm_hashes`` to ``target``'s inbox, as an encoder
        would (the router named this node as their holder for a request on another prefill
        node); returns those not held. An image being fetched or encoded here is waited for."""
        await self._settled(mm_hashes)
        outputs = await asyncio.wrap_future(self.loop.call(lambda engine: {h: engine.runner.encoder_outputs.get(h) for h in mm_hashes}))
        for mm_hash, embeds in outputs.items():
            if embeds is not None:
                # A send waits for room in the peer's queue: a thread's wait, not the loop's.
                await asyncio.to_thread(sender.send, target, mm_hash, {"embeds": embeds.to("cpu")}, {"rows": embeds.shape[0]})
                self.metrics.num_shipped.inc()
        return [h for h, embeds in outputs.items() if embeds is None]

    async def _settled(self, mm_hashes: Sequence[MmHash]) -> None:
        """Once no work of this node on ``mm_hashes`` is in flight (each waited for up to ``wait_s``)."""
        for mm_hash in mm_hashes:
            event = self._mm_hash_to_fetch.get(mm_hash)
            if event is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), self.wait_s)

    def _begin(self, items: list[PromptItem]) -> tuple[list[PromptItem], list[PromptItem]]:
        """Split ``items`` into those the caller fetches or encodes, and those another request
        already does."""
        mine, others = [], []
        for item in items:
            if item.mm_hash in self._mm_hash_to_fetch:
                others.append(item)
            else:
                self._mm_hash_to_fetch[item.mm_hash] = asyncio.Event()
                mine.append(item)
        return mine, others

    def _end(self, items: list[PromptItem]) -> None:
        """The caller's work on ``items`` is over (imported or failed): wake their waiters."""
        for item in items:
            event = self._mm_hash_to_fetch.pop(item.mm_hash, None)
            if event is not None:
                event.set()

    async def _await_others(self, request_id: str, items: list[PromptItem]) -> list[PromptItem]:
        """Await other requests' work on ``items``, then claim them; returns those still
        lacking (that work failed, or the image was evicted since)."""
        await self._settled([item.mm_hash for item in items])
        return await asyncio.wrap_future(self._claim(request_id, items))

    async def _receive(self, request_id: str, items: list[PromptItem], encoder: str, on_full: OnFull) -> None:
        """Await pushed embeddings of ``items`` and import them; raises if any never arrive."""
        missing = []
        for item in items:
            message = await self.inbox.arrival(item.mm_hash, self.wait_s, sender=encoder, what="embeddings of image")
            if message is None:
                missing.append(item.mm_hash)
                continue
            await self._import(request_id, item, message.tensors["embeds"], on_full)
            self.metrics.num_pulled.inc()
        if missing:
            raise EmbeddingsUnavailableError(missing, encoder)

    async def _receive_pixels(self, key_prefix: str, items: list[PromptItem], lacking: list[PromptItem]) -> dict[MmHash, torch.Tensor]:
        """Pixels pushed here for ``items``, for those among ``lacking``: local_pixels.take_pixels."""
        if self.vision is None:
            raise LocalEncodeUnavailableError(NO_TOWER)
        return await take_pixels(self.inbox, key_prefix, items, lacking, wait_s=self.wait_s, pixels_match=self.pixels_match)

    async def _encode_here(
        self, request_id: str, items: list[PromptItem], pixels: dict[MmHash, torch.Tensor], on_full: OnFull, adapter: LoraAdapter | None
    ) -> None:
        """Encode ``items`` with this node's tower and import them as if an encoder had sent them;
        an image another request is already encoding or fetching is awaited, and encoded here
        after all if that fails."""
        mine, others = self._begin(items)
        try:
            await self._encode_and_import(request_id, mine, pixels, on_full, adapter)
        finally:
            self._end(mine)
        if others:
            await self._encode_and_import(request_id, await self._await_others(request_id, others), pixels, on_full, adapter)

    async def _encode_and_import(
        self, request_id: str, items: list[PromptItem], pixels: dict[MmHash, torch.Tensor], on_full: OnFull, adapter: LoraAdapter | None
    ) -> None:
        if not items:
            return
        if self.vision is None or self.tower is None:
            raise LocalEncodeUnavailableError(NO_TOWER)
        vision = self.vision
        self.metrics.num_local_encodes.inc(len(items))
        embeds = await self.tower.call(self._encode, vision, [pixels[i.mm_hash] for i in items], [i.grid_thw for i in items], adapter)
        for item, rows in zip(items, embeds):
            await self._import(request_id, item, rows, on_full)

    def _encode(
        self, vision: VisionEncoder, pixels: list[torch.Tensor], grids: list[tuple[int, int, int]], adapter: LoraAdapter | None
    ) -> list[torch.Tensor]:
        """One tower pass, with ``adapter``'s tower updates where it has any (on the tower thread)."""
        with self.tower_loras.running(adapter) if self.tower_loras is not None else contextlib.nullcontext():
            return vision.encode(pixels, grids)

    async def _import(self, request_id: str, item: PromptItem, embeds: torch.Tensor, on_full: OnFull) -> None:
        """Import ``embeds`` into the engine's cache for the request, on the engine thread. While
        the cache has no room, await ``on_full`` (the request runs meanwhile, freeing what it
        has computed past) and retry, for up to ``wait_s``."""
        if embeds.shape[0] != item.placeholder.length:
            raise ValueError(f"embeddings for {item.mm_hash} have {embeds.shape[0]} rows, expected {item.placeholder.length}")
        give_up_at = time.monotonic() + self.wait_s

        def import_into(engine: Engine) -> bool:
            return connector.import_embeddings(engine, request_id, item.mm_hash, embeds)

        while not await asyncio.wrap_future(self.loop.call(import_into)):
            if time.monotonic() >= give_up_at:
                raise RuntimeError("prefill node's embedding cache is full; retry later")
            await on_full()
