"""The request path across roles, as plain Python over gRPC stubs:
preprocess (skipping the image processor for images a live encoder holds, per the index)
-> route (one index lookup) -> pixels to the chosen encoder, only for images it lacks
-> prefill on the chosen node (it pulls missing embeddings from the chosen encoder, and prefix KV
from the peers the route names when that beats recomputing) -> decode.
Yields token events; raises GatewayError with the status a client should see.

Missing pixels (the preprocess node's mirror said the encoder had an image it has since evicted)
are resent once from the processor cache, or by re-running preprocessing with force_send_pixels.
Any role that is down or times out gives a 503 naming that role, fast: calls carry deadlines and
do not wait for a dead peer to come back.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc

from protos.gen import pb, rpc
from services.engine.sampling import SamplingParams
from services.router.router import Route, RoleNodes, Router
from services.gateway.errors import GatewayError
from services.transport.convert import sampling_to_pb
from services.transport.grpc_server import CHANNEL_OPTIONS, HTTP_STATUS_KEY
from shared.tracing import outgoing_metadata, tracer
from shared.types import BlockHash, MmHash, PlaceholderRange

MISSING_PIXELS_KEY = "tessera-missing-pixels"


@dataclass(frozen=True, slots=True)
class RoleAddresses:
    preprocess: tuple[str, ...]
    encoder: tuple[str, ...]
    prefill: tuple[str, ...]
    decode: tuple[str, ...]

    def all(self) -> list[tuple[str, str]]:
        return [(role, address) for role in ("preprocess", "encoder", "prefill", "decode") for address in getattr(self, role)]


@dataclass(frozen=True, slots=True)
class TokenEvent:
    token_ids: list[int]
    text: str  # full text so far
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int


class Pipeline:
    def __init__(self, addresses: RoleAddresses, *, router: Router | None = None, timeout_s: float = 300.0, connect_timeout_s: float = 5.0) -> None:
        self.addresses = addresses
        self.router = router or Router(RoleNodes(addresses.encoder, addresses.prefill, addresses.decode))
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._stubs: dict[tuple[str, str], object] = {}
        self._data_addresses: dict[str, str] = {}
        self._turns = itertools.count()
        self.last_route: Route | None = None

    def stub(self, role: str, address: str):
        key = (role, address)
        if key not in self._stubs:
            channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
            self._stubs[key] = {"preprocess": rpc.PreprocessStub, "encoder": rpc.EncodeStub, "prefill": rpc.PrefillStub, "decode": rpc.DecodeStub}[role](channel)
        return self._stubs[key]

    def stats(self) -> list[tuple[str, str, pb.StatsResponse]]:
        out = []
        for role, address in self.addresses.all():
            try:
                out.append((role, address, self.stub(role, address).Stats(pb.StatsRequest(), timeout=self.connect_timeout_s)))
            except grpc.RpcError:
                continue
        return out

    def data_address(self, role: str, address: str) -> str:
        data = self._data_addresses.get(address)
        if data is None:
            data = self._call(role, self.stub(role, address).Stats, pb.StatsRequest(), self.connect_timeout_s).data_address
            self._data_addresses[address] = data
        return data

    def run(
        self, body: dict, sampling: SamplingParams, *, cache_salt: str | None = None, request_id: str | None = None, stream: bool = True
    ) -> Iterator[TokenEvent]:
        """Token events: one per token when ``stream``, else just the first and the last (which
        then carries every token since the first)."""
        request_id = request_id or f"chatcmpl-{uuid.uuid4().hex}"
        # One trace per request: every downstream call carries this span's context.
        with tracer().start_as_current_span("gateway.generate", attributes={"tessera.request_id": request_id}):
            yield from self._run(body, sampling, cache_salt, request_id, stream)

    def _run(self, body: dict, sampling: SamplingParams, cache_salt: str | None, request_id: str, stream: bool) -> Iterator[TokenEvent]:
        preprocess_address = self.addresses.preprocess[next(self._turns) % len(self.addresses.preprocess)]
        prep = self._preprocess(preprocess_address, body, cache_salt=cache_salt)
        images = [(MmHash(i.mm_hash), PlaceholderRange(i.offset, i.length)) for i in prep.mm_items]
        hashes = [BlockHash(h) for h in prep.block_hashes] if self.router.index is not None else None
        route = self.router.route(list(prep.prompt_token_ids), images, cache_salt, block_hashes=hashes)
        self.last_route = route
        lacking = [h for h, _ in images if h not in route.images_on_encoder]
        if lacking:
            self._ensure_pixels(preprocess_address, body, lacking, route.encoder, force=False)
        prefill = self._prefill(request_id, prep, sampling, cache_salt, route, lambda missing: self._ensure_pixels(preprocess_address, body, missing, route.encoder, force=True))
        decode_request = pb.DecodeRequest(
            request_id=request_id,
            prompt_token_ids=prep.prompt_token_ids,
            first_token_id=prefill.first_token_id,
            mrope_delta=prefill.mrope_delta,
            sampling=sampling_to_pb(sampling),
            num_cached_tokens=prefill.num_cached_tokens,
            mm_items=prep.mm_items,
            cache_salt=cache_salt or "",
            stream=stream,
        )
        chunks = self._call("decode", self.stub("decode", route.decode).Decode, decode_request, self.timeout_s)
        prompt_tokens = len(prep.prompt_token_ids)
        try:
            for chunk in chunks:
                yield TokenEvent(list(chunk.token_ids), chunk.text, chunk.finished, chunk.finish_reason or None, prompt_tokens, prefill.num_cached_tokens)
                if chunk.finished:
                    return
        except grpc.RpcError as exc:
            raise self._to_gateway_error("decode", exc) from None
        finally:
            chunks.cancel()  # no-op when complete; frees the decode node's KV when abandoned
        raise GatewayError(503, "the decode service ended the stream early")

    def _ensure_pixels(self, preprocess_address: str, body: dict, mm_hashes: list[str], encoder: str, *, force: bool) -> None:
        """Push these images' pixels to ``encoder``. Pixels preprocess does not hold (it skipped
        them because the index said an encoder had them, or evicted them) are made by running
        preprocessing again without skipping, then pushed."""
        not_found = list(self._push_pixels(preprocess_address, mm_hashes, encoder, force=force).not_found)
        if not_found:
            self._preprocess(preprocess_address, body, skip_indexed=False)
            if self._push_pixels(preprocess_address, not_found, encoder, force=force).not_found:
                raise GatewayError(503, "image pixels expired from the preprocess cache mid-request; retry the request")

    def _push_pixels(self, preprocess_address: str, mm_hashes: list[str], encoder: str, *, force: bool) -> pb.ResendPixelsResponse:
        request = pb.ResendPixelsRequest(mm_hashes=mm_hashes, encoder_id=encoder, encoder_data_address=self.data_address("encoder", encoder), force=force)
        return self._call("preprocess", self.stub("preprocess", preprocess_address).ResendPixels, request, self.timeout_s)

    def _preprocess(self, address: str, body: dict, *, skip_indexed: bool = True, cache_salt: str | None = None) -> pb.PreprocessResponse:
        with_index = self.router.index is not None
        request = pb.PreprocessRequest(
            request_json=json.dumps(body),
            skip_indexed_pixels=skip_indexed and with_index,
            block_size=self.router.block_size if with_index else 0,
            cache_salt=cache_salt or "",
        )
        return self._call("preprocess", self.stub("preprocess", address).Preprocess, request, self.timeout_s)

    def _prefill(self, request_id, prep, sampling, cache_salt, route: Route, resend_pixels: Callable[[list[str]], None]) -> pb.PrefillResponse:
        request = pb.PrefillRequest(
            request_id=request_id,
            prompt_token_ids=prep.prompt_token_ids,
            mm_items=prep.mm_items,
            cache_salt=cache_salt or "",
            decode_data_address=self.data_address("decode", route.decode),
            sampling=sampling_to_pb(sampling),
            encoder_address=route.encoder,
            kv_sources=[pb.KVSource(grpc_address=a, num_tokens=n) for a, n in kv_sources(route)],
        )
        stub = self.stub("prefill", route.prefill)
        for attempt in range(2):
            try:
                return stub.Prefill(request, timeout=self.timeout_s, metadata=outgoing_metadata())
            except grpc.RpcError as exc:
                missing = _trailing(exc, MISSING_PIXELS_KEY)
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or not missing or attempt == 1:
                    raise self._to_gateway_error("prefill", exc) from None
                # The encoder lost images our mirror thought it had: push them again.
                resend_pixels(missing.split(","))
        raise AssertionError("unreachable")

    def _call(self, role: str, method, request, timeout: float):
        try:
            return method(request, timeout=timeout, metadata=outgoing_metadata())
        except grpc.RpcError as exc:
            raise self._to_gateway_error(role, exc) from None

    def _to_gateway_error(self, role: str, exc: grpc.RpcError) -> GatewayError:
        code = exc.code()
        status = _trailing(exc, HTTP_STATUS_KEY)
        if status is not None:
            return GatewayError(int(status), exc.details() or f"{role} rejected the request")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
            self._data_addresses.clear()  # a restarted node may come back with another data address
            return GatewayError(503, f"the {role} service is unavailable: {exc.details() or code.name}")
        return GatewayError(500, f"the {role} service failed: {exc.details() or code.name}")


def kv_sources(route: Route, limit: int = 1) -> list[tuple[str, int]]:
    """Peers holding a longer prefix than the chosen prefill node, longest first (the prefill
    node pulls from the longest only, and decides whether that beats recomputing)."""
    own = route.prefix_tokens_by_node.get(route.prefill, 0)
    better = [(a, n) for a, n in route.prefix_tokens_by_node.items() if a != route.prefill and n > own]
    return sorted(better, key=lambda item: (-item[1], item[0]))[:limit]


def _trailing(exc: grpc.RpcError, key: str) -> str | None:
    try:
        metadata = exc.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - some errors carry no call metadata
        return None
    for k, v in metadata:
        if k == key:
            return v
    return None
