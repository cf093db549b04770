"""gRPC Decode service: streams a request's tokens. A stream that goes away (cancelled, or past its
deadline) aborts its request; a node at its limit of streams, or out of KV pages, refuses new ones
as busy (services/transport/node_admission.py)."""

from __future__ import annotations

import contextlib

from protos.gen import pb, rpc
from services.decode.job import DecodeFailedError, DecodeJob
from services.decode.node import DecodeNode, KVTransferTimeoutError
from services.engine.connector import KVPagesExhaustedError
from services.engine.engine import RequestRejectedError
from services.engine.lora.node_adapters import MissingAdapterError
from services.engine.output_processor import RequestOutput
from services.engine.remote_request import PromptItem
from services.engine.sampling_wire import logprobs_from_pb, logprobs_to_pb, sampling_from_pb, token_texts
from services.transport.convert import item_from_pb, lora_from_pb
from services.transport.grpc_server import Lifecycle, new_server, serve_forever
from services.transport.internal_auth import InternalAuth
from services.transport.kv_peer import add_kv_peer
from services.transport.lora_service import add_lora_adapters
from services.transport.node_admission import NodeAdmission, abort_overloaded
from services.transport.node_error import ErrorKind, NodeError, NodeRef, abort_with
from services.transport.stats_wire import stats_response
from shared.process_stats import node_snapshot


class DecodeServicer(rpc.DecodeServicer):
    def __init__(self, node: DecodeNode, admission: NodeAdmission) -> None:
        self.node = node
        self.admission = admission
        self.token_text = token_texts(node.engine.outputs.tokenizer)

    async def Decode(self, request: pb.DecodeRequest, context):
        # Refused as busy: the pages the prefill node already pushed for it are not wanted here.
        async with self.admission.admitted(context, on_refused=lambda: self.node.inbox.discard(request.request_id)):
            try:
                # aclosing: a stream the client leaves closes the node's, which aborts the request.
                async with contextlib.aclosing(self.node.stream(decode_job_from_pb(request))) as outputs:
                    async for output in outputs:
                        yield self._chunk(output)
            except KVPagesExhaustedError as exc:  # no room for it here: the gateway continues elsewhere
                await abort_overloaded(context, NodeRef("decode"), str(exc))
            except KVTransferTimeoutError as exc:
                await abort_with(context, NodeError(ErrorKind.KV_TRANSFER_TIMEOUT, str(exc)))
            except MissingAdapterError as exc:  # loaded here by the gateway, then sent again: these pages are not wanted
                self.node.inbox.discard(request.request_id)
                await abort_with(context, NodeError(ErrorKind.MISSING_ADAPTER, str(exc)))
            except RequestRejectedError as exc:  # it can never run here (too long for the model or the KV pool)
                await abort_with(context, NodeError(ErrorKind.INVALID_REQUEST, str(exc)))
            except DecodeFailedError as exc:
                await abort_with(context, NodeError(ErrorKind.REQUEST_FAILED, str(exc)))

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


def decode_job_from_pb(request: pb.DecodeRequest) -> DecodeJob:
    first_logprobs = logprobs_from_pb(request.first_token_logprob) if request.HasField("first_token_logprob") else None
    return DecodeJob(
        request_id=request.request_id,
        prompt_token_ids=list(request.prompt_token_ids),
        items=[PromptItem(*item_from_pb(i)) for i in request.mm_items],
        sampling=sampling_from_pb(request.sampling),
        first_token_id=request.first_token_id,
        first_token_logprobs=first_logprobs,
        num_cached_tokens=request.num_cached_tokens,
        cache_salt=request.cache_salt or None,
        prior_output_token_ids=list(request.prior_output_token_ids),
        every_output=request.stream,
        lora=lora_from_pb(request),
    )


async def serve(node: DecodeNode, address: str, lifecycle: Lifecycle, auth: InternalAuth, admission: NodeAdmission) -> None:
    server = new_server(auth)
    rpc.add_DecodeServicer_to_server(DecodeServicer(node, admission), server)
    kv_peer, loras = add_kv_peer(server, node), add_lora_adapters(server, node.adapters)
    await serve_forever(server, address, ["tessera.v1.Decode", kv_peer, loras], lifecycle, auth)
