"""The request path across roles: preprocess -> prefill (which pulls embeddings from the encoder)
-> decode, as plain Python over gRPC stubs. Yields token events; raises GatewayError with the
status a client should see.

Missing pixels (the preprocess node's mirror said the encoder had an image it has since evicted)
are resent once from the processor cache, or by re-running preprocessing with force_send_pixels.
Any role that is down or times out gives a 503 naming that role, fast: calls carry deadlines and
do not wait for a dead peer to come back.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import grpc

from protos.gen import pb, rpc
from services.engine.sampling import SamplingParams
from services.gateway.errors import GatewayError
from services.transport.convert import sampling_to_pb
from services.transport.grpc_server import CHANNEL_OPTIONS, HTTP_STATUS_KEY
from shared.tracing import outgoing_metadata, tracer

MISSING_PIXELS_KEY = "tessera-missing-pixels"


@dataclass(frozen=True, slots=True)
class RoleAddresses:
    preprocess: str
    encoder: str
    prefill: str
    decode: str


@dataclass(frozen=True, slots=True)
class TokenEvent:
    token_ids: list[int]
    text: str  # full text so far
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int


class Pipeline:
    def __init__(self, addresses: RoleAddresses, *, timeout_s: float = 300.0, connect_timeout_s: float = 5.0) -> None:
        self.addresses = addresses
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        channel = lambda addr: grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)  # noqa: E731
        self.preprocess = rpc.PreprocessStub(channel(addresses.preprocess))
        self.encoder = rpc.EncodeStub(channel(addresses.encoder))
        self.prefill = rpc.PrefillStub(channel(addresses.prefill))
        self.decode = rpc.DecodeStub(channel(addresses.decode))
        self._data_addresses: dict[str, str] = {}

    def stats(self) -> dict[str, pb.StatsResponse]:
        out = {}
        for role, stub in (("preprocess", self.preprocess), ("encoder", self.encoder), ("prefill", self.prefill), ("decode", self.decode)):
            try:
                out[role] = stub.Stats(pb.StatsRequest(), timeout=self.connect_timeout_s)
            except grpc.RpcError:
                continue
        return out

    def data_address(self, role: str) -> str:
        address = self._data_addresses.get(role)
        if address is None:
            stub = {"encoder": self.encoder, "prefill": self.prefill, "decode": self.decode}[role]
            address = self._call(role, stub.Stats, pb.StatsRequest(), self.connect_timeout_s).data_address
            self._data_addresses[role] = address
        return address

    def run(self, body: dict, sampling: SamplingParams, *, cache_salt: str | None = None, request_id: str | None = None) -> Iterator[TokenEvent]:
        request_id = request_id or f"chatcmpl-{uuid.uuid4().hex}"
        # One trace per request: every downstream call carries this span's context.
        with tracer().start_as_current_span("gateway.generate", attributes={"tessera.request_id": request_id}):
            yield from self._run(body, sampling, cache_salt, request_id)

    def _run(self, body: dict, sampling: SamplingParams, cache_salt: str | None, request_id: str) -> Iterator[TokenEvent]:
        encoder_address = self.data_address("encoder")
        prep = self._preprocess(body, encoder_address, force=False)
        prefill = self._prefill(request_id, prep, sampling, cache_salt, body, encoder_address)
        decode_request = pb.DecodeRequest(
            request_id=request_id,
            prompt_token_ids=prep.prompt_token_ids,
            first_token_id=prefill.first_token_id,
            mrope_delta=prefill.mrope_delta,
            sampling=sampling_to_pb(sampling),
            num_cached_tokens=prefill.num_cached_tokens,
            mm_items=prep.mm_items,
            cache_salt=cache_salt or "",
        )
        stream = self._call("decode", self.decode.Decode, decode_request, self.timeout_s)
        prompt_tokens = len(prep.prompt_token_ids)
        try:
            for chunk in stream:
                yield TokenEvent(list(chunk.token_ids), chunk.text, chunk.finished, chunk.finish_reason or None, prompt_tokens, prefill.num_cached_tokens)
                if chunk.finished:
                    return
        except grpc.RpcError as exc:
            raise self._to_gateway_error("decode", exc) from None
        finally:
            stream.cancel()  # no-op when complete; frees the decode node's KV when abandoned
        raise GatewayError(503, "the decode service ended the stream early")

    def _preprocess(self, body: dict, encoder_address: str, *, force: bool) -> pb.PreprocessResponse:
        request = pb.PreprocessRequest(
            request_json=json.dumps(body), encoder_id=self.addresses.encoder, encoder_data_address=encoder_address, force_send_pixels=force
        )
        return self._call("preprocess", self.preprocess.Preprocess, request, self.timeout_s)

    def _prefill(self, request_id, prep, sampling, cache_salt, body, encoder_address) -> pb.PrefillResponse:
        request = pb.PrefillRequest(
            request_id=request_id,
            prompt_token_ids=prep.prompt_token_ids,
            mm_items=prep.mm_items,
            cache_salt=cache_salt or "",
            decode_data_address=self.data_address("decode"),
            sampling=sampling_to_pb(sampling),
        )
        for attempt in range(2):
            try:
                return self.prefill.Prefill(request, timeout=self.timeout_s, metadata=outgoing_metadata())
            except grpc.RpcError as exc:
                missing = _trailing(exc, MISSING_PIXELS_KEY)
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or not missing or attempt == 1:
                    raise self._to_gateway_error("prefill", exc) from None
                reply = self._call(
                    "preprocess",
                    self.preprocess.ResendPixels,
                    pb.ResendPixelsRequest(mm_hashes=missing.split(","), encoder_id=self.addresses.encoder, encoder_data_address=encoder_address),
                    self.timeout_s,
                )
                if reply.not_found:
                    self._preprocess(body, encoder_address, force=True)
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
            self._data_addresses.pop(role, None)
            return GatewayError(503, f"the {role} service is unavailable: {exc.details() or code.name}")
        return GatewayError(500, f"the {role} service failed: {exc.details() or code.name}")


def _trailing(exc: grpc.RpcError, key: str) -> str | None:
    try:
        metadata = exc.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - some errors carry no call metadata
        return None
    for k, v in metadata:
        if k == key:
            return v
    return None
