"""gRPC Prefill service: pulls missing embeddings from the encoder, then runs PrefillNode."""

from __future__ import annotations

import asyncio
import os

import grpc

from protos.gen import pb, rpc
from services.engine.engine import RequestRejectedError
from services.engine.remote_request import PromptItem, build_request
from services.prefill.node import EmbeddingsUnavailableError, PrefillNode
from services.transport.convert import item_from_pb, item_to_pb, sampling_from_pb
from services.transport.grpc_server import CHANNEL_OPTIONS, abort_with, new_server, serve_forever
from shared.tracing import outgoing_metadata

MISSING_PIXELS_KEY = "tessera-missing-pixels"


class PrefillServicer(rpc.PrefillServicer):
    def __init__(self, node: PrefillNode, encoder_address: str) -> None:
        self.node = node
        self.default_encoder = encoder_address
        self._encoders: dict[str, rpc.EncodeStub] = {}

    def _encoder(self, address: str) -> rpc.EncodeStub:
        stub = self._encoders.get(address)
        if stub is None:
            stub = self._encoders[address] = rpc.EncodeStub(grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS))
        return stub

    async def Prefill(self, request: pb.PrefillRequest, context) -> pb.PrefillResponse:
        items = [PromptItem(*item_from_pb(i)) for i in request.mm_items]
        rid = request.request_id
        lacking = await asyncio.to_thread(self.node.claim_local_embeddings, rid, items)
        try:
            if lacking:
                reply = await self._encoder(request.encoder_address or self.default_encoder).Encode(
                    pb.EncodeRequest(items=[item_to_pb(i.mm_hash, i.placeholder, i.grid_thw) for i in lacking], target_data_address=self.node.data_address),
                    timeout=120,
                    metadata=outgoing_metadata(),
                )
                if reply.missing_pixels:
                    context.set_trailing_metadata(((MISSING_PIXELS_KEY, ",".join(reply.missing_pixels)),))
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "encoder lacks pixels for some images")
                await asyncio.to_thread(self.node.receive_embeddings, rid, lacking)
            engine_request = build_request(
                rid, list(request.prompt_token_ids), items, sampling_from_pb(request.sampling), request.cache_salt or None, self.node.merge_size
            )
            result = await asyncio.to_thread(self.node.prefill, engine_request, request.decode_data_address)
        except grpc.aio.AioRpcError as exc:
            self.node.release(rid, items)
            await abort_with(context, grpc.StatusCode.UNAVAILABLE, f"encoder unavailable: {exc.details()}", 503)
        except EmbeddingsUnavailableError as exc:
            self.node.release(rid, items)
            await abort_with(context, grpc.StatusCode.UNAVAILABLE, str(exc), 503)
        except RequestRejectedError as exc:
            self.node.release(rid, items)
            await abort_with(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc), 400)
        except BaseException:
            self.node.release(rid, items)
            raise
        return pb.PrefillResponse(first_token_id=result.first_token_id, num_cached_tokens=result.num_cached_tokens, mrope_delta=result.mrope_delta)

    async def Stats(self, request, context) -> pb.StatsResponse:
        return pb.StatsResponse(role="prefill", pid=os.getpid(), counters=self.node.counters(), data_address=self.node.data_address)


async def serve(node: PrefillNode, address: str, encoder_address: str) -> None:
    server = new_server()
    rpc.add_PrefillServicer_to_server(PrefillServicer(node, encoder_address), server)
    await serve_forever(server, address, ["tessera.v1.Prefill"], on_stop=node.close)
