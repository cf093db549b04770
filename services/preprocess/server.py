"""gRPC Preprocess service: converts at the edge and calls PreprocessNode. A node at its limit of
calls refuses new requests as busy (services/transport/node_admission.py); PushPixels continues
a request already admitted, so it is never refused."""

from __future__ import annotations

import asyncio

from protos.gen import pb, rpc
from services.models.media_cost import media_costs_to_json
from services.models.pooling import PoolingKind, read_pooling_config
from services.preprocess.errors import PreprocessError
from services.preprocess.node import PreprocessNode
from services.preprocess.prompt_wire import prompt_from_wire
from services.transport.convert import item_to_pb, lora_from_pb
from services.transport.grpc_server import Lifecycle, new_server, serve_forever
from services.transport.internal_auth import InternalAuth
from services.transport.node_admission import NodeAdmission
from services.transport.node_error import ErrorKind, NodeError, NodeRef, abort_with
from services.transport.stats_wire import stats_response
from services.transport.tensor_channel import TensorSendTimeoutError
from shared.hashing import MmSpan, block_hashes
from shared.process_stats import node_snapshot
from shared.types import MmHash


class PreprocessServicer(rpc.PreprocessServicer):
    def __init__(self, node: PreprocessNode, admission: NodeAdmission) -> None:
        self.node = node
        self.admission = admission

    async def Preprocess(self, request: pb.PreprocessRequest, context) -> pb.PreprocessResponse:
        async with self.admission.admitted(context):
            return await self._preprocess(request, context)

    async def _preprocess(self, request: pb.PreprocessRequest, context) -> pb.PreprocessResponse:
        try:
            prompt = prompt_from_wire(request.prompt)
            media = await self.node.prepare_media(prompt)  # videos, on the node's decode pool
            lora = lora_from_pb(request)
            result = await asyncio.to_thread(self.node.preprocess, prompt, skip_indexed=request.skip_indexed_pixels, media=media, lora=lora)
        except PreprocessError as exc:
            await abort_with(context, NodeError(exc.kind, f"{exc.code}: {exc.message}"))
        hashes: list[str] = []
        if request.block_size > 0:
            # Hashed here, where the tokens are, so the router's decision is one index lookup.
            spans = [MmSpan(i.mm_hash, i.placeholder) for i in result.mm_items]
            lora_id = lora.fingerprint if lora is not None else None
            hashes = block_hashes(
                result.prompt_token_ids, request.block_size, spans, cache_salt=request.cache_salt or None, lora_name=lora_id
            )
        return pb.PreprocessResponse(
            block_hashes=hashes,
            prompt_token_ids=result.prompt_token_ids,
            mm_items=[item_to_pb(i.mm_hash, i.placeholder, i.image.grid_thw, i.placement) for i in result.mm_items],
        )

    async def PushPixels(self, request: pb.PushPixelsRequest, context) -> pb.PushPixelsResponse:
        try:
            not_found, transfer = await asyncio.to_thread(
                self.node.push_pixels,
                [MmHash(h) for h in request.mm_hashes],
                target_id=request.target_id,
                target_address=request.target_data_address,
                force=request.force,
                key_prefix=request.key_prefix,
            )
        except TensorSendTimeoutError as exc:  # the target's inbox is not draining: it is the failed node
            role = "prefill" if request.key_prefix else "encoder"
            await abort_with(context, NodeError(ErrorKind.NODE_FAILED, str(exc), NodeRef(role, request.target_id)))
        return pb.PushPixelsResponse(
            not_found=not_found, pixel_bytes_sent=transfer.num_bytes_sent, pixel_bytes_skipped=transfer.num_bytes_skipped
        )

    async def Detokenize(self, request: pb.DetokenizeRequest, context) -> pb.DetokenizeResponse:
        try:
            text = await asyncio.to_thread(self.node.detokenize, list(request.token_ids))
        except PreprocessError as exc:
            await abort_with(context, NodeError(exc.kind, f"{exc.code}: {exc.message}"))
        return pb.DetokenizeResponse(text=text)

    async def MediaCost(self, request: pb.MediaCostRequest, context) -> pb.MediaCostResponse:
        return pb.MediaCostResponse(cost_model_json=media_costs_to_json(self.node.preprocessor.media_costs()))

    async def ModelInfo(self, request: pb.ModelInfoRequest, context) -> pb.ModelInfoResponse:
        preprocessor = self.node.preprocessor
        config = preprocessor.model_config
        pooling = read_pooling_config(preprocessor.model.path, config.hf, config.text.hidden_size)
        every_row = pooling.kind is not PoolingKind.LAST
        eos_token_ids = list(config.eos_token_ids)
        return pb.ModelInfoResponse(eos_token_ids=eos_token_ids, vocab_size=preprocessor.vocab_size, pools_every_prompt_row=every_row)

    async def Stats(self, request, context) -> pb.StatsResponse:
        return stats_response("preprocess", node_snapshot(self.node.metrics, self.admission.metrics))


async def serve(node: PreprocessNode, address: str, lifecycle: Lifecycle, auth: InternalAuth, admission: NodeAdmission) -> None:
    server = new_server(auth)
    rpc.add_PreprocessServicer_to_server(PreprocessServicer(node, admission), server)
    await serve_forever(server, address, ["tessera.v1.Preprocess"], lifecycle, auth)
