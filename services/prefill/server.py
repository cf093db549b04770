"""gRPC Prefill service, a thin edge over PrefillNode.run: converts the request to a PrefillJob and
the result back, dials the encoders and KV peers the request names (GrpcUpstream), and maps a
failure to the kind of error the gateway acts on. Also serves KVPeer, so other prefill nodes can pull
from this one.

An encoder that fails is named in the error (NODE_FAILED, services/transport/node_error.py): the
gateway retries the request on another one; this servicer never retries by itself. Images whose
pixels never reached the node that encodes them are named in a MISSING_PIXELS error: the gateway
pushes them again. A call that goes away (cancelled, or past its deadline) aborts its engine
request; a node at its limit of calls refuses new ones as busy (services/transport/node_admission.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import grpc

from protos.gen import pb, rpc
from services.engine.engine import RequestRejectedError
from services.engine.lora.node_adapters import MissingAdapterError
from services.engine.remote_request import PromptItem
from services.engine.sampling import SamplingError
from services.engine.sampling_wire import logprobs_to_pb, prompt_logprobs_to_pb, sampling_from_pb, token_texts
from services.prefill.embeddings import EmbeddingsUnavailableError
from services.prefill.job import EmbedSpec, PrefillJob, PrefillResult
from services.prefill.kv_pull import KVSource
from services.prefill.local_pixels import LocalEncodeUnavailableError, MissingPixelsError, PixelsMismatchError
from services.prefill.node import PrefillNode
from services.transport.addresses import AdvertisedAddress
from services.transport.convert import call_deadline_s, item_from_pb, item_to_pb, lora_from_pb, lora_to_pb
from services.transport.grpc_server import Lifecycle, new_server, serve_forever
from services.transport.internal_auth import InternalAuth
from services.transport.internal_channel import internal_channel
from services.transport.kv_peer import add_kv_peer
from services.transport.lora_service import add_lora_adapters
from services.transport.node_admission import NodeAdmission, abort_overloaded
from services.transport.node_error import ErrorKind, NodeError, NodeRef, abort_with, node_error_of
from services.transport.stats_wire import stats_response
from shared.process_stats import node_snapshot
from shared.tracing import outgoing_metadata
from shared.types import BlockHash, LoraRef, MmHash


class PrefillServicer(rpc.PrefillServicer):
    def __init__(self, node: PrefillNode, auth: InternalAuth, admission: NodeAdmission) -> None:
        self.node = node
        self.admission = admission
        self.upstream = GrpcUpstream(auth)  # encoders and peers are dialled with the cluster's credentials
        self.token_text = token_texts(node.engine.outputs.tokenizer)  # for prompt logprobs

    async def Prefill(self, request: pb.PrefillRequest, context) -> pb.PrefillResponse:
        async with self.admission.admitted(context):
            return await self._prefill(request, context)

    async def _prefill(self, request: pb.PrefillRequest, context) -> pb.PrefillResponse:
        try:
            result = await self.node.run(job_from_pb(request, call_deadline_s(context)), self.upstream)
        except EncoderCallError as exc:  # a failed peer pull is recomputed, so only encoders fail a prefill
            await fail_like_encoder(context, exc.rpc_error, exc.encoder)
        except MissingPixelsError as exc:
            await abort_with(context, NodeError(ErrorKind.MISSING_PIXELS, str(exc), missing_mm_hashes=tuple(exc.missing)))
        except (LocalEncodeUnavailableError, PixelsMismatchError) as exc:  # this request's own failure
            await abort_with(context, NodeError(ErrorKind.REQUEST_FAILED, str(exc)))
        except EmbeddingsUnavailableError as exc:
            failed = NodeError(ErrorKind.NODE_FAILED, f"{exc} from encoder {exc.encoder}", NodeRef("encoder", exc.encoder))
            await abort_with(context, failed)
        except MissingAdapterError as exc:
            await abort_with(context, NodeError(ErrorKind.MISSING_ADAPTER, str(exc)))
        except RequestRejectedError as exc:
            await abort_with(context, NodeError(ErrorKind.INVALID_REQUEST, str(exc)))
        except SamplingError as exc:  # this request's own failure; the batch beside it went on
            await abort_with(context, NodeError(ErrorKind.REQUEST_FAILED, str(exc)))
        response = result_to_pb(result, self.token_text)
        if request.sampling.HasField("prompt_logprobs") and request.prompt_token_ids:
            response.first_prompt_token = self.token_text(request.prompt_token_ids[0])
        return response

    async def Stats(self, request, context) -> pb.StatsResponse:
        return stats_response("prefill", node_snapshot(self.node.metrics, self.admission.metrics), self.node.data_address)


def job_from_pb(request: pb.PrefillRequest, deadline: float | None = None) -> PrefillJob:
    return PrefillJob(
        request_id=request.request_id,
        prompt_token_ids=list(request.prompt_token_ids),
        items=[PromptItem(*item_from_pb(i)) for i in request.mm_items],
        sampling=sampling_from_pb(request.sampling),
        decode_address=request.decode_data_address,
        cache_salt=request.cache_salt or None,
        prior_output_token_ids=list(request.prior_output_token_ids),
        encoder_address=request.encoder_address or None,
        image_to_source={MmHash(h): a for h, a in request.mm_hash_to_source.items()},
        local_encode=frozenset(MmHash(h) for h in request.local_encode_mm_hashes),
        local_pixels_key_prefix=request.local_pixels_key_prefix,
        kv_sources=[KVSource(k.grpc_address, k.num_tokens) for k in request.kv_sources],
        deadline_s=deadline,
        lora=lora_from_pb(request),
        embed=EmbedSpec(request.embed.dimensions if request.embed.HasField("dimensions") else None) if request.HasField("embed") else None,
    )


def result_to_pb(result: PrefillResult, token_text: Callable[[int], str]) -> pb.PrefillResponse:
    response = pb.PrefillResponse(
        first_token_id=result.first_token_id,
        num_cached_tokens=result.num_cached_tokens,
        mrope_delta=result.mrope_delta,
        num_pulled_tokens=result.num_pulled_tokens,
        embedding=result.embedding or (),
    )
    if result.first_token_logprobs is not None:
        response.first_token_logprob.CopyFrom(logprobs_to_pb(result.first_token_logprobs))
    response.prompt_logprobs.extend(prompt_logprobs_to_pb(lp, token_text) for lp in result.prompt_logprobs)
    return response


async def fail_like_encoder(context, exc: grpc.aio.AioRpcError, encoder: str) -> None:
    """Fail the call the way the encoder failed it: busy is relayed as busy, and a missing LoRA
    adapter as missing, with the encoder's address (the gateway tries another encoder, or loads
    the adapter there); any other typed error, the request's own, as it came (never retried); and
    a failure without one names the encoder as the failed node (retried without it)."""
    error = node_error_of(exc)
    if error is not None and error.kind is ErrorKind.OVERLOADED:
        await abort_overloaded(context, NodeRef("encoder", encoder), exc.details() or "the encoder is busy")
    if error is not None and error.kind is ErrorKind.MISSING_ADAPTER:  # the gateway loads it on that encoder
        await abort_with(context, NodeError(ErrorKind.MISSING_ADAPTER, exc.details() or "", NodeRef("encoder", encoder)))
    if error is not None:
        await abort_with(context, error)
    failed = NodeError(ErrorKind.NODE_FAILED, f"encoder {encoder} unavailable: {exc.details()}", NodeRef("encoder", encoder))
    await abort_with(context, failed)


class EncoderCallError(Exception):
    """An Encode call failed; ``encoder`` says which encoder (a request's images may come from
    several)."""

    def __init__(self, encoder: str, rpc_error: grpc.aio.AioRpcError) -> None:
        super().__init__(f"encoder {encoder}: {rpc_error.details()}")
        self.encoder = encoder
        self.rpc_error = rpc_error


# An encode call's gRPC timeout when its request carries no deadline (a direct gRPC caller's).
NO_DEADLINE_ENCODE_S = 120.0


class GrpcUpstream:
    """job.Upstream over gRPC, one channel per address."""

    def __init__(self, auth: InternalAuth) -> None:
        self.auth = auth
        self._encoders: dict[str, rpc.EncodeStub] = {}
        self._peers: dict[str, rpc.KVPeerStub] = {}

    async def encode(
        self,
        encoder: str,
        items: Sequence[PromptItem],
        target: AdvertisedAddress,
        deadline_s: float | None = None,
        lora: LoraRef | None = None,
    ) -> list[MmHash]:
        stub = self._encoders.get(encoder)
        if stub is None:
            stub = self._encoders[encoder] = rpc.EncodeStub(internal_channel(encoder, self.auth))
        try:
            reply = await stub.Encode(
                pb.EncodeRequest(
                    items=[item_to_pb(i.mm_hash, i.placeholder, i.grid_thw) for i in items],
                    target_data_address=target,
                    lora=lora_to_pb(lora),
                ),
                timeout=NO_DEADLINE_ENCODE_S if deadline_s is None else max(0.0, deadline_s - time.time()),
                metadata=outgoing_metadata(),
            )
        except grpc.aio.AioRpcError as exc:
            raise EncoderCallError(encoder, exc) from exc
        return [MmHash(h) for h in reply.missing_pixels]

    async def export_kv(
        self, peer: str, hashes: Sequence[BlockHash], target: AdvertisedAddress, transfer_id: str, timeout_s: float
    ) -> int | None:
        stub = self._peers.get(peer)
        if stub is None:
            stub = self._peers[peer] = rpc.KVPeerStub(internal_channel(peer, self.auth))
        try:
            reply = await stub.ExportKV(
                pb.ExportKVRequest(block_hashes=hashes, target_data_address=target, transfer_id=transfer_id),
                timeout=timeout_s,
                metadata=outgoing_metadata(),
            )
        except grpc.aio.AioRpcError:
            return None
        return reply.num_blocks


class EmbeddingShipper(rpc.EncodeServicer):
    """The Encode service of a prefill node: it ships the embeddings it holds to another prefill
    node and reports the rest as lacking, never encoding (it has no pixels for them)."""

    def __init__(self, node: PrefillNode) -> None:
        self.node = node

    async def Encode(self, request: pb.EncodeRequest, context) -> pb.EncodeResponse:
        mm_hashes = [MmHash(item.mm_hash) for item in request.items]
        lacking = await self.node.ship_embeddings(mm_hashes, request.target_data_address)
        return pb.EncodeResponse(missing_pixels=lacking)


async def serve(node: PrefillNode, address: str, lifecycle: Lifecycle, auth: InternalAuth, admission: NodeAdmission) -> None:
    server = new_server(auth)
    rpc.add_PrefillServicer_to_server(PrefillServicer(node, auth, admission), server)
    rpc.add_EncodeServicer_to_server(EmbeddingShipper(node), server)
    kv_peer, loras = add_kv_peer(server, node), add_lora_adapters(server, node.adapters)
    await serve_forever(server, address, ["tessera.v1.Prefill", "tessera.v1.Encode", kv_peer, loras], lifecycle, auth)
