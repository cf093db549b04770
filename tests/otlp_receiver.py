"""A real OTLP/gRPC trace receiver (the collector's TraceService) on a loopback port, keeping
every span it is sent: what a test points ``OTEL_EXPORTER_OTLP_ENDPOINT`` at."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    attributes: dict
    event_names: tuple[str, ...]


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: list[ReceivedSpan] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest, context) -> trace_service_pb2.ExportTraceServiceResponse:
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {a.key: _value(a.value) for a in span.attributes}
                    events = tuple(e.name for e in span.events)
                    received.append(ReceivedSpan(resource.get("service.name", ""), span.name, span.trace_id.hex(), attributes, events))
        with self._lock:
            self.spans.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, predicate, timeout_s: float = 30.0) -> list[ReceivedSpan]:
        """The spans received, once ``predicate(spans)`` holds (bounded wait)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            time.sleep(0.1)
        raise AssertionError(f"the OTLP receiver did not get the expected spans in {timeout_s:.0f}s; got {len(spans)}")


def _value(value) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None
