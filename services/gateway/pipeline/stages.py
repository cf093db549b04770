"""One request's call to each role, shaped from the request and its route; pipeline.py chains
them and owns failover. Every call gets what is left of the request's deadline as its gRPC
deadline, and a gRPC error leaves here classified (services/gateway/pipeline/failures.py).

Pixels go where the route says images are encoded: to the chosen encoder (keyed by mm_hash, with
the preprocess node's mirror skipping what that encoder already holds), or, for the images the
router chose the prefill node to encode itself, to the prefill node under a key per request
attempt. Pixels preprocess no longer holds are made by running preprocessing again without
skipping; pixels a node reports missing at prefill time are pushed again once, forced.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import grpc
from opentelemetry import trace

from protos.gen import pb
from services.engine.sampling_wire import sampling_to_pb
from services.gateway.errors import GatewayError
from services.gateway.pipeline.call_watchdog import CallWatchdog
from services.gateway.pipeline.failures import NodeFailure, classify_rpc_error, remaining_s
from services.gateway.pipeline.request_run import Attempt, PixelTarget
from services.gateway.pipeline.token_events import PromptLogprobs, PromptTokenLogprob, TokenEvent, TokenLogprob
from services.router.route import Route
from services.router.router import Router
from services.transport.convert import lora_to_pb
from services.transport.node_error import ErrorKind, node_error_of
from shared.tracing import outgoing_metadata
from shared.types import LoraRef, MmHash


class Stages:
    def __init__(
        self,
        router: Router,
        stub: Callable[[str, str], object],
        watchdog: CallWatchdog,
        clock: Callable[[], float],
        *,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.router = router
        self.stub = stub
        self.watchdog = watchdog
        self.clock = clock
        self.connect_timeout_s = connect_timeout_s
        self._data_addresses: dict[str, str] = {}  # static lists: what each node said
        self.num_cover_fallbacks = 0  # requests whose covered images were needed after all

    async def data_address(self, role: str, address: str) -> str:
        """Where a node takes tensors: its record's data address, or (static lists, no records)
        what the node's Stats says, asked once."""
        state = self.router.membership.find(address)
        if state is not None and state.info.data_address:
            return state.info.data_address
        data = self._data_addresses.get(address)
        if data is None:
            try:
                stats = await self.stub(role, address).Stats(
                    pb.StatsRequest(), timeout=self.connect_timeout_s, metadata=outgoing_metadata()
                )
            except grpc.RpcError as exc:
                raise classify_rpc_error(role, address, exc) from None
            data = self._data_addresses[address] = stats.data_address
        return data

    async def preprocess(
        self,
        address: str,
        prompt: pb.PromptInput,
        *,
        deadline: float,
        skip_indexed: bool = True,
        cache_salt: str | None = None,
        lora: LoraRef | None = None,
    ) -> pb.PreprocessResponse:
        with_index = self.router.index is not None
        request = pb.PreprocessRequest(
            prompt=prompt,
            skip_indexed_pixels=skip_indexed and with_index,
            block_size=self.router.block_size if with_index else 0,
            cache_salt=cache_salt or "",
            lora=lora_to_pb(lora),
        )
        return await self.call("preprocess", address, self.stub("preprocess", address).Preprocess, request, deadline)

    async def push_images(self, attempt: Attempt, lacking: list[MmHash]) -> None:
        """Pixels of the images the chosen encoder lacks, each to where it will be encoded."""
        for target, hashes in _by_target(attempt, lacking):
            # An encoder's pushes may be skipped by the preprocess node's mirror; a prefill
            # node's never are (it keeps embeddings, not pixels).
            await self.ensure_pixels(attempt, hashes, target, force=target.role == "prefill")

    async def ensure_pixels(self, attempt: Attempt, mm_hashes: list[MmHash], target: PixelTarget, *, force: bool) -> None:
        """Push these images' pixels to ``target``. Pixels preprocess does not hold (it skipped
        them because the index said an encoder had them, or evicted them, or another preprocess
        node made them) are made by running preprocessing again without skipping, then pushed."""
        not_found = [MmHash(h) for h in (await self._push_pixels(attempt, mm_hashes, target, force=force)).not_found]
        if not_found:
            await self.preprocess(attempt.preprocess_address, attempt.run.prompt, skip_indexed=False, deadline=attempt.run.deadline)
            if (await self._push_pixels(attempt, not_found, target, force=force)).not_found:
                raise GatewayError(503, "image pixels expired from the preprocess cache mid-request; retry the request")

    async def _push_pixels(self, attempt: Attempt, mm_hashes: list[MmHash], target: PixelTarget, *, force: bool) -> pb.PushPixelsResponse:
        request = pb.PushPixelsRequest(
            mm_hashes=mm_hashes,
            target_id=target.address,
            target_data_address=await self.data_address(target.role, target.address),
            force=force,
            key_prefix=target.key_prefix,
        )
        address = attempt.preprocess_address
        return await self.call("preprocess", address, self.stub("preprocess", address).PushPixels, request, attempt.run.deadline)

    async def prefill(self, attempt: Attempt) -> pb.PrefillResponse:
        run, route, prep = attempt.run, attempt.route, attempt.prep
        request = pb.PrefillRequest(
            request_id=attempt.request_id,
            prompt_token_ids=prep.prompt_token_ids,
            mm_items=prep.mm_items,
            cache_salt=run.cache_salt or "",
            decode_data_address=await self.data_address("decode", route.decode) if route.decode is not None else "",
            embed=run.embed,
            # A migrated request's prompt logprobs were reported with its first token.
            sampling=sampling_to_pb(replace(run.sampling, prompt_logprobs=None) if run.emitted else run.sampling),
            encoder_address=route.encoder,
            kv_sources=[pb.KVSource(grpc_address=a, num_tokens=n) for a, n in kv_sources(route)],
            prior_output_token_ids=run.emitted,
            local_encode_mm_hashes=sorted(route.local_encode),
            local_pixels_key_prefix=attempt.prefill_target().key_prefix if route.local_encode else "",
            mm_hash_to_source=route.image_to_source,
            lora=lora_to_pb(run.lora),
        )
        method = self.stub("prefill", route.prefill).Prefill
        for resent in (False, True):
            try:
                return await self.call("prefill", route.prefill, method, request, run.deadline, classify=False)
            except grpc.RpcError as exc:
                error = node_error_of(exc)
                if error is None or error.kind is not ErrorKind.MISSING_PIXELS or not error.missing_mm_hashes or resent:
                    raise classify_rpc_error("prefill", route.prefill, exc) from None
                # The node that encodes them lacks their pixels (the encoder evicted images our
                # mirror thought it had, a push to the prefill node came late, or the prefix that
                # covered an image was evicted before the run: the encoder skip's fallback): push.
                if route.images_covered & set(error.missing_mm_hashes):
                    self.num_cover_fallbacks += 1
                for target, hashes in _by_target(attempt, list(error.missing_mm_hashes)):
                    await self.ensure_pixels(attempt, hashes, target, force=True)
        raise AssertionError("unreachable")

    async def decode(self, attempt: Attempt, prefill: pb.PrefillResponse) -> AsyncIterator[TokenEvent]:
        """The decode stream's token events. ``run.emitted`` is read when the call starts (a
        migration continues after those tokens); the caller extends it."""
        run, route, prep = attempt.run, attempt.route, attempt.prep
        assert route.decode is not None, "a generation is routed with a decode node"
        if run.cached_tokens is None:  # what the client is told: the first prefill's, not a migration's
            run.cached_tokens = prefill.num_cached_tokens
        cached_tokens = run.cached_tokens
        decode_request = pb.DecodeRequest(
            request_id=attempt.request_id,
            prompt_token_ids=prep.prompt_token_ids,
            first_token_id=prefill.first_token_id,
            mrope_delta=prefill.mrope_delta,
            sampling=sampling_to_pb(run.sampling),
            num_cached_tokens=cached_tokens,
            mm_items=prep.mm_items,
            cache_salt=run.cache_salt or "",
            stream=run.stream,
            prior_output_token_ids=run.emitted,
            lora=lora_to_pb(run.lora),
        )
        if prefill.HasField("first_token_logprob"):
            decode_request.first_token_logprob.CopyFrom(prefill.first_token_logprob)
        chunks = self.stub("decode", route.decode).Decode(
            decode_request, timeout=self.remaining_s(run.deadline), metadata=outgoing_metadata()
        )
        prompt_tokens, prompt_token_ids = len(prep.prompt_token_ids), tuple(prep.prompt_token_ids)
        scored = prompt_logprobs_of(prefill, prompt_token_ids[0])
        number = 0
        try:
            with self.watchdog.watching(chunks, route.decode) as watch:
                async for chunk in chunks:
                    if number == 0:
                        trace.get_current_span().add_event("first_decode_chunk")
                    logprobs = tuple(
                        TokenLogprob(lp.token_id, lp.token, lp.logprob, tuple(zip(lp.top_token_ids, lp.top_tokens, lp.top_logprobs)))
                        for lp in chunk.logprobs
                    )
                    finish_reason = chunk.finish_reason or None
                    number += 1
                    yield TokenEvent(
                        list(chunk.token_ids),
                        chunk.text,
                        chunk.finished,
                        finish_reason,
                        prompt_tokens,
                        cached_tokens,
                        logprobs,
                        prompt_token_ids,
                        scored if number == 1 else None,
                    )
        except asyncio.CancelledError:
            if watch.fired_alone():  # the watchdog's doing: the node left the cluster
                raise NodeFailure("decode", route.decode, "its node left the cluster mid-stream") from None
            raise
        except grpc.RpcError as exc:
            raise classify_rpc_error("decode", route.decode, exc) from None
        finally:
            chunks.cancel()  # no-op when complete; frees the decode node's KV when abandoned

    def remaining_s(self, deadline: float) -> float:
        return remaining_s(deadline, self.clock())

    async def call(self, role: str, address: str, method, request, deadline: float, *, classify: bool = True):
        """One unary call with what is left of the deadline, watched (services/gateway/pipeline/call_watchdog.py).
        A gRPC error leaves classified, or raw with ``classify=False`` for a caller that reads its
        trailers first."""
        call = method(request, timeout=self.remaining_s(deadline), metadata=outgoing_metadata())
        with self.watchdog.watching(call, address) as watch:
            try:
                return await call
            except asyncio.CancelledError:
                if watch.fired_alone():
                    raise NodeFailure(role, address, "its node left the cluster; the call was cancelled") from None
                raise  # the request's task was cancelled: its client went away
            except grpc.RpcError as exc:
                if not classify:
                    raise
                raise classify_rpc_error(role, address, exc) from None


def _by_target(attempt: Attempt, mm_hashes: list[MmHash]) -> list[tuple[PixelTarget, list[MmHash]]]:
    """Where each image is encoded: the prefill node (its local encodes) or the route's encoder
    (every other image, those a holder named in image_to_source no longer had included)."""
    here = [h for h in mm_hashes if h in attempt.route.local_encode]
    there = [h for h in mm_hashes if h not in attempt.route.local_encode]
    return [(t, hs) for t, hs in ((attempt.prefill_target(), here), (attempt.encoder_target(), there)) if hs]


def kv_sources(route: Route, limit: int = 1) -> list[tuple[str, int]]:
    """Peers holding a longer prefix than the chosen prefill node, longest first (the prefill
    node pulls from the longest only, and decides whether that beats recomputing)."""
    own = route.prefix_tokens_by_node.get(route.prefill, 0)
    better = [(a, n) for a, n in route.prefix_tokens_by_node.items() if a != route.prefill and n > own]
    return sorted(better, key=lambda item: (-item[1], item[0]))[:limit]


def prompt_logprobs_of(prefill: pb.PrefillResponse, first_token_id: int) -> PromptLogprobs | None:
    """The prompt logprobs a prefill reported (when its sampling asked for them);
    ``first_token_id``: the prompt's first token."""
    if not prefill.HasField("first_prompt_token"):
        return None
    entries = tuple(
        PromptTokenLogprob(e.token_id, e.token, e.logprob, e.rank, tuple(zip(e.top_token_ids, e.top_tokens, e.top_logprobs)))
        for e in prefill.prompt_logprobs
    )
    return PromptLogprobs(first_token_id, prefill.first_prompt_token, entries)
