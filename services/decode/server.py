"""gRPC Decode service: streams a request's tokens. A stream that goes away (cancelled, or past its
deadline) aborts its request; a node at its limit of streams, or out of KV pages, refuses new ones
as busy (services/transport/node_admission.py)."""

from __future__ import annotations

import asyncio
import functools

from opentelemetry import trace

from protos.gen import pb, rpc
from services.decode.coalesce import OutputCoalescer
from services.decode.node import DecodeNode, KVTransferTimeoutError
from services.engine.connector import KVPagesExhaustedError
from services.engine.engine import RequestRejectedError
from services.engine.output_processor import RequestOutput
from services.engine.remote_request import PromptItem, build_request
from services.engine.sampling_wire import logprobs_from_pb, logprobs_to_pb, sampling_from_pb
from services.transport.convert import item_from_pb
from services.transport.grpc_server import Lifecycle, new_server, serve_forever
from services.transport.internal_auth import InternalAuth
from services.transport.kv_peer import add_kv_peer
from services.transport.node_admission import NodeAdmission, abort_overloaded
from services.transport.node_error import ErrorKind, NodeError, NodeRef, abort_with
from services.transport.stats_wire import stats_response
from shared.loop_handoff import LoopHandoff
from shared.process_stats import node_snapshot


class DecodeServicer(rpc.DecodeServicer):
    def __init__(self, node: DecodeNode, admission: NodeAdmission) -> None:
        self.node = node
        self.admission = admission
        self._handoff: LoopHandoff | None = None  # made on the serving loop, at the first stream

    def _to_loop(self) -> LoopHandoff:
        if self._handoff is None:
            self._handoff = LoopHandoff(asyncio.get_running_loop())
        return self._handoff

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one servicer per process, lives as long
    def token_text(self, token_id: int) -> str:
        """A token's own text, for logprobs (U+FFFD when the token is part of a character)."""
        return self.node.engine.outputs.tokenizer.decode([token_id])

    async def Decode(self, request: pb.DecodeRequest, context):
        # Refused as busy: the pages the prefill node already pushed for it are not wanted here.
        async with self.admission.admitted(context, on_refused=lambda: self.node.inbox.discard(request.request_id)):
            async for chunk in self._decode(request, context):
                yield chunk

    async def _decode(self, request: pb.DecodeRequest, context):
        items = [PromptItem(*item_from_pb(i)) for i in request.mm_items]
        engine_request = build_request(
            request.request_id,
            list(request.prompt_token_ids),
            items,
            sampling_from_pb(request.sampling),
            request.cache_salt or None,
            self.node.positions,
        )
        engine_request.num_cached_tokens = request.num_cached_tokens
        engine_request.output_token_ids = list(request.prior_output_token_ids)  # a migrated request
        handoff = self._to_loop()
        queue: asyncio.Queue = asyncio.Queue()
        finished = False
        try:
            span = trace.get_current_span()
            try:
                pages = await asyncio.to_thread(self.node.wait_for_pages, request.request_id)
                span.add_event("kv_pages_received")
                first_logprobs = logprobs_from_pb(request.first_token_logprob) if request.HasField("first_token_logprob") else None
                first = self.node.first_output(engine_request, request.first_token_id, first_logprobs)
                if not first.finished and not self.node.can_adopt(engine_request):
                    raise KVPagesExhaustedError("decode node has no free KV pages for this request; retry later")
            except KVPagesExhaustedError as exc:
                await abort_overloaded(context, NodeRef("decode"), str(exc))
            except KVTransferTimeoutError as exc:
                await abort_with(context, NodeError(ErrorKind.KV_TRANSFER_TIMEOUT, str(exc)))
            except RequestRejectedError as exc:  # it can never run here (too long for the model or the KV pool)
                await abort_with(context, NodeError(ErrorKind.INVALID_REQUEST, str(exc)))
            # The first token goes out now, before adoption waits for the engine's step in progress.
            finished = first.finished
            yield self._chunk(first)
            if finished:
                return
            try:
                to_client = OutputCoalescer(lambda out: handoff.call(queue.put_nowait, out), every_output=request.stream)
                await asyncio.wrap_future(self.node.adopt(engine_request, pages, to_client))
                span.add_event("adopted")
            except KVPagesExhaustedError as exc:  # taken since can_adopt: the gateway continues elsewhere
                await abort_overloaded(context, NodeRef("decode"), str(exc))
            while not finished:
                output = await queue.get()
                if isinstance(output, BaseException):
                    await abort_with(context, NodeError(ErrorKind.REQUEST_FAILED, f"decode failed: {output}"))
                finished = output.finished
                yield self._chunk(output)
        finally:
            if not finished:
                # The client went away, its deadline passed (grpc.aio cancels this task either
                # way), or it failed: stop it, which frees its KV pages.
                self.node.abort(request.request_id)

    def _chunk(self, output: RequestOutput) -> pb.DecodeChunk:
        return pb.DecodeChunk(
            token_ids=output.new_token_ids,
            text=output.text,
            finished=output.finished,
            finish_reason=output.finish_reason or "",
            logprobs=[logprobs_to_pb(lp, self.token_text) for lp in output.new_logprobs],
        )

    async def Stats(self, request, context) -> pb.StatsResponse:
        return stats_response("decode", node_snapshot(self.node.metrics, self.admission.metrics), self.node.data_address)


async def serve(node: DecodeNode, address: str, lifecycle: Lifecycle, auth: InternalAuth, admission: NodeAdmission) -> None:
    server = new_server(auth)
    rpc.add_DecodeServicer_to_server(DecodeServicer(node, admission), server)
    kv_peer = add_kv_peer(server, node)
    await serve_forever(server, address, ["tessera.v1.Decode", kv_peer], lifecycle, auth)
