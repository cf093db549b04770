"""gRPC Encode service: converts at the edge and calls EncoderNode through an EncodeBatcher; and
the LoraAdapters service (runtime loads of adapters that change the tower).

Concurrent calls are batched (services/encoder/batching.py): they line up here, before reaching
the node, so a call that goes away while it waits (cancelled, or past its deadline) leaves the
line and its images are never encoded for nobody. An encode that fails fails its own call only,
as the request's error (500, not retried): its inputs are what failed, and the node goes on
serving the next batch.
"""

from __future__ import annotations

import grpc

from protos.gen import pb, rpc
from services.encoder.batching import DEFAULT_MAX_BATCH_ROWS, DeadlinePassedError, EncodeBatcher
from services.encoder.node import EncodeItem, EncoderNode
from services.engine.engine import RequestRejectedError
from services.engine.lora.node_adapters import MissingAdapterError
from services.transport.convert import lora_from_pb
from services.transport.grpc_server import Lifecycle, new_server, serve_forever
from services.transport.internal_auth import InternalAuth
from services.transport.lora_service import add_lora_adapters
from services.transport.node_admission import NodeAdmission
from services.transport.node_error import ErrorKind, NodeError, abort_with
from services.transport.stats_wire import stats_response
from shared.process_stats import node_snapshot
from shared.types import MmHash


class EncodeServicer(rpc.EncodeServicer):
    def __init__(self, node: EncoderNode, admission: NodeAdmission, *, max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS) -> None:
        self.node = node
        self.admission = admission
        self.batcher = EncodeBatcher(node.encode_batch, max_batch_rows=max_batch_rows, metrics=node.metrics.batching)

    async def Encode(self, request: pb.EncodeRequest, context) -> pb.EncodeResponse:
        try:
            adapter = await self.node.adapters.resolve(lora_from_pb(request))
        except MissingAdapterError as exc:  # the gateway loads it here and sends the request again
            await abort_with(context, NodeError(ErrorKind.MISSING_ADAPTER, str(exc)))
        except RequestRejectedError as exc:
            await abort_with(context, NodeError(ErrorKind.INVALID_REQUEST, str(exc)))
        items = [EncodeItem(MmHash(i.mm_hash), i.length, tuple(i.grid_thw), adapter) for i in request.items]
        async with self.admission.admitted(context):
            try:
                # A call whose deadline passes while it waits is not encoded: gRPC cancels its
                # task too, but under load that may land only after its batch was taken.
                result = await self.batcher.encode(items, request.target_data_address, timeout_s=context.time_remaining())
            except DeadlinePassedError as exc:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
            except Exception as exc:
                await abort_with(context, NodeError(ErrorKind.REQUEST_FAILED, f"encoding failed for this request: {exc}"))
        return pb.EncodeResponse(missing_pixels=result.missing_pixels, num_encoded=result.num_encoded, num_cache_hits=result.num_cache_hits)

    async def Stats(self, request, context) -> pb.StatsResponse:
        return stats_response("encoder", node_snapshot(self.node.metrics, self.admission.metrics), self.node.data_address)


async def serve(
    node: EncoderNode,
    address: str,
    lifecycle: Lifecycle,
    auth: InternalAuth,
    admission: NodeAdmission,
    *,
    max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
) -> None:
    server = new_server(auth)
    rpc.add_EncodeServicer_to_server(EncodeServicer(node, admission, max_batch_rows=max_batch_rows), server)
    loras = add_lora_adapters(server, node.adapters)
    await serve_forever(server, address, ["tessera.v1.Encode", loras], lifecycle, auth)
