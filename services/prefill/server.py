"""gRPC Prefill service: pulls missing embeddings from the encoder the gateway names (or takes
the pixels of images the router chose this node to encode itself) and, when worth it, prefix KV
from a peer, then runs PrefillNode. Also serves KVPeer, so other prefill nodes
can pull from it. An encoder that fails is named in the error (FAILED_NODE_KEY): the gateway
retries the request on another one; this servicer never retries by itself. A call that goes away
(cancelled, or past its deadline) aborts its engine request; a node at its limit of calls refuses
new ones as busy (services/transport/node_admission.py)."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace

import grpc

from protos.gen import pb, rpc
from services.engine.engine import RequestRejectedError
from services.engine.remote_request import PromptItem, build_request
from services.engine.sampling import SamplingError
from services.engine.sampling_wire import logprobs_to_pb, sampling_from_pb
from services.prefill.kv_pull import KVSource
from services.prefill.local_pixels import LocalEncodeUnavailableError, MissingPixelsError, PixelsMismatchError
from services.prefill.node import EmbeddingsUnavailableError, PrefillNode, PrefillResult
from services.transport.convert import item_from_pb, item_to_pb
from services.transport.grpc_server import (
    HTTP_STATUS_KEY,
    MISSING_PIXELS_KEY,
    OVERLOADED_KEY,
    Lifecycle,
    abort_with,
    new_server,
    serve_forever,
)
from services.transport.internal_auth import InternalAuth
from services.transport.internal_channel import internal_channel
from services.transport.kv_peer import add_kv_peer
from services.transport.node_admission import NodeAdmission, abort_overloaded
from shared.process_stats import process_counters
from shared.tracing import outgoing_metadata


class PrefillServicer(rpc.PrefillServicer):
    def __init__(self, node: PrefillNode, auth: InternalAuth, admission: NodeAdmission) -> None:
        self.node = node
        self.admission = admission
        self.auth = auth  # encoders and peers are dialled with the cluster's credentials
        self._encoders: dict[str, rpc.EncodeStub] = {}
        self._peers: dict[str, rpc.KVPeerStub] = {}

    def _encoder(self, address: str) -> rpc.EncodeStub:
        stub = self._encoders.get(address)
        if stub is None:
            stub = self._encoders[address] = rpc.EncodeStub(internal_channel(address, self.auth, aio=True))
        return stub

    def _peer(self, address: str) -> rpc.KVPeerStub:
        stub = self._peers.get(address)
        if stub is None:
            stub = self._peers[address] = rpc.KVPeerStub(internal_channel(address, self.auth, aio=True))
        return stub

    async def _pull_kv(self, engine_request, sources: list[KVSource]) -> int:
        """Pull prefix pages from the best peer when the cost model favours it; any failure
        leaves them to be recomputed. Returns the number of prompt tokens pulled."""
        plan = await asyncio.to_thread(self.node.plan_pull, engine_request, sources)
        if plan is None:
            return 0
        try:
            reply = await self._peer(plan.source.grpc_address).ExportKV(
                pb.ExportKVRequest(block_hashes=plan.hashes, target_data_address=self.node.data_address, transfer_id=plan.transfer_id),
                timeout=self.node.kv_pull_timeout_s,
                metadata=outgoing_metadata(),
            )
        except grpc.aio.AioRpcError:
            self.node.record_pull_failure(plan)
            return 0
        imported = await asyncio.to_thread(self.node.receive_kv, plan, reply.num_blocks)
        return imported * self.node.engine.config.block_size

    async def _fetch_embeddings(self, rid: str, lacking: list[PromptItem], encoder_address: str, context) -> None:
        """Pull ``lacking`` from the encoder, sharing fetches already in flight for other requests
        (a fetch of the same image that failed under another request is retried here once)."""
        for _ in range(2):
            mine, others = self.node.begin_pulls(lacking)
            try:
                if mine:
                    reply = await self._encoder(encoder_address).Encode(
                        pb.EncodeRequest(
                            items=[item_to_pb(i.mm_hash, i.placeholder, i.grid_thw) for i in mine],
                            target_data_address=self.node.data_address,
                        ),
                        timeout=120,
                        metadata=outgoing_metadata(),
                    )
                    if reply.missing_pixels:
                        context.set_trailing_metadata(((MISSING_PIXELS_KEY, ",".join(reply.missing_pixels)),))
                        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "encoder lacks pixels for some images")
                    await asyncio.to_thread(self.node.receive_embeddings, rid, mine)
            finally:
                self.node.end_pulls(mine)
            lacking = await asyncio.to_thread(self.node.await_pulls, rid, others) if others else []
            if not lacking:
                return
        raise EmbeddingsUnavailableError([i.mm_hash for i in lacking])

    async def Prefill(self, request: pb.PrefillRequest, context) -> pb.PrefillResponse:
        async with self.admission.admitted(context):
            return await self._prefill(request, context)

    async def _prefill(self, request: pb.PrefillRequest, context) -> pb.PrefillResponse:
        items = [PromptItem(*item_from_pb(i)) for i in request.mm_items]
        rid = request.request_id
        lacking = await asyncio.to_thread(self.node.claim_local_embeddings, rid, items)
        encoder = request.encoder_address
        here = set(request.local_encode_mm_hashes)  # the router chose this node to encode these
        try:
            lacking_here = [i for i in lacking if i.mm_hash in here]
            pixels = await asyncio.to_thread(
                self.node.receive_pixels, request.local_pixels_key_prefix, [i for i in items if i.mm_hash in here], lacking_here
            )
            if pixels:
                await asyncio.to_thread(self.node.encode_here, rid, lacking_here, pixels)
            lacking = [i for i in lacking if i.mm_hash not in here]
            if lacking:
                if not encoder:
                    await abort_with(
                        context, grpc.StatusCode.INVALID_ARGUMENT, "images need embeddings but no encoder_address was given", 400
                    )
                await self._fetch_embeddings(rid, lacking, encoder, context)
            # A migrated request's answer so far is computed like prompt text (same positions).
            token_ids = [*request.prompt_token_ids, *request.prior_output_token_ids]
            sampling = sampling_from_pb(request.sampling)
            num_prior = len(request.prior_output_token_ids)  # they count toward min_tokens
            sampling = replace(sampling, min_tokens=max(0, sampling.min_tokens - num_prior))
            engine_request = build_request(rid, token_ids, items, sampling, request.cache_salt or None, self.node.positions)
            sources = [KVSource(k.grpc_address, k.num_tokens) for k in request.kv_sources]
            num_pulled = await self._pull_kv(engine_request, sources) if sources else 0
            result = await self._run_engine(engine_request, request.decode_data_address)
        except grpc.aio.AioRpcError as exc:
            self.node.release(rid, items)
            await fail_like_encoder(context, exc, encoder)
        except MissingPixelsError as exc:
            self.node.release(rid, items)
            context.set_trailing_metadata(((MISSING_PIXELS_KEY, ",".join(exc.missing)),))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except (LocalEncodeUnavailableError, PixelsMismatchError) as exc:  # this request's own failure
            self.node.release(rid, items)
            await abort_with(context, grpc.StatusCode.INTERNAL, str(exc), 500)
        except EmbeddingsUnavailableError as exc:
            self.node.release(rid, items)
            await abort_with(context, grpc.StatusCode.UNAVAILABLE, f"{exc} from encoder {encoder}", None, failed_node=("encoder", encoder))
        except RequestRejectedError as exc:
            self.node.release(rid, items)
            await abort_with(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc), 400)
        except SamplingError as exc:  # this request's own failure; the batch beside it went on
            self.node.release(rid, items)
            await abort_with(context, grpc.StatusCode.INTERNAL, str(exc), 500)
        except BaseException:
            self.node.release(rid, items)
            raise
        response = pb.PrefillResponse(
            first_token_id=result.first_token_id,
            num_cached_tokens=result.num_cached_tokens,
            mrope_delta=result.mrope_delta,
            num_pulled_tokens=num_pulled,
        )
        if result.first_token_logprobs is not None:
            response.first_token_logprob.CopyFrom(logprobs_to_pb(result.first_token_logprobs))
        return response

    async def _run_engine(self, engine_request, decode_address: str) -> PrefillResult:
        """The engine's part. When the call goes away (the gateway cancelled it, or its deadline
        passed: grpc.aio cancels this task either way) the request is aborted, so the engine stops
        computing a prompt nobody waits for and ships no KV for it."""
        started = time.perf_counter()
        done = self.node.start_prefill(engine_request, decode_address)
        try:
            output = await asyncio.wait_for(asyncio.wrap_future(done), self.node.prefill_timeout_s)
        except BaseException:
            self.node.abort(engine_request.request_id)
            raise
        return self.node.finish_prefill(engine_request, output, time.perf_counter() - started)

    async def Stats(self, request, context) -> pb.StatsResponse:
        counters = {**self.node.counters(), **self.admission.counters(), **process_counters()}
        return pb.StatsResponse(role="prefill", pid=os.getpid(), counters=counters, data_address=self.node.data_address)


async def fail_like_encoder(context, exc: grpc.aio.AioRpcError, encoder: str) -> None:
    """Fail the call the way the encoder failed it: busy is relayed as busy (the gateway tries
    another encoder), the request's own error as that error (never retried), and anything else
    names the encoder as the failed node (retried without it)."""
    trailers = dict(exc.trailing_metadata() or ())
    if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and OVERLOADED_KEY in trailers:
        await abort_overloaded(context, f"encoder={encoder}", exc.details() or "the encoder is busy")
    if HTTP_STATUS_KEY in trailers:
        await abort_with(context, exc.code(), exc.details() or "the encoder refused the request", int(trailers[HTTP_STATUS_KEY]))
    await abort_with(
        context, grpc.StatusCode.UNAVAILABLE, f"encoder {encoder} unavailable: {exc.details()}", None, failed_node=("encoder", encoder)
    )


async def serve(node: PrefillNode, address: str, lifecycle: Lifecycle, auth: InternalAuth, admission: NodeAdmission) -> None:
    server = new_server(auth)
    rpc.add_PrefillServicer_to_server(PrefillServicer(node, auth, admission), server)
    kv_peer = add_kv_peer(server, node)
    await serve_forever(server, address, ["tessera.v1.Prefill", kv_peer], lifecycle, auth)
