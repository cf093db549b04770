"""OpenTelemetry tracing: one trace per request across gateway -> preprocess -> encoder ->
prefill -> decode, with W3C trace context carried in gRPC metadata.

Off by default. Exporters, any combination:
  OTLP             the standard variables: ``OTEL_TRACES_EXPORTER=otlp`` or an
                   ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
                   (gRPC, e.g. http://otel-collector:4317; headers, TLS and timeouts from the
                   other ``OTEL_EXPORTER_OTLP_*`` variables), batched (``OTEL_BSP_*``).
                   ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` name the resource
                   (default service name: tessera-<role>).
  console          ``OTEL_TRACES_EXPORTER=console`` or ``TESSERA_TRACE_EXPORTER=console``:
                   spans printed to stderr as JSON
  jsonl:DIR        ``TESSERA_TRACE_EXPORTER=jsonl:DIR``: one JSON line per span in
                   DIR/<service>-<pid>.jsonl (local use, no collector needed)
Unlike the OpenTelemetry default, an unset ``OTEL_TRACES_EXPORTER`` with no OTLP endpoint means
no tracing, so a plain ``tessera serve`` never dials a collector that is not there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter, SpanExportResult

EXPORTER_ENV = "TESSERA_TRACE_EXPORTER"
_enabled = False


class JsonLinesSpanExporter(SpanExporter):
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as out:
            for span in spans:
                ctx = span.get_span_context()
                record = {
                    "name": span.name,
                    "service": span.resource.attributes.get("service.name"),
                    "trace_id": format(ctx.trace_id, "032x"),
                    "span_id": format(ctx.span_id, "016x"),
                    "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
                    "start_ns": span.start_time,
                    "end_ns": span.end_time,
                    "attributes": dict(span.attributes or {}),
                    "events": [{"name": e.name, "time_ns": e.timestamp, "attributes": dict(e.attributes or {})} for e in span.events],
                }
                out.write(json.dumps(record) + "\n")
        return SpanExportResult.SUCCESS


def configure_tracing(service: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Install the configured exporters for this process; returns whether tracing is on."""
    global _enabled
    processors = span_processors(service, environ)
    if not processors:
        return False
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": f"tessera-{service}"}
    provider = TracerProvider(resource=Resource.create(attributes))
    for processor in processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    _enabled = True
    return True


def span_processors(service: str, environ: Mapping[str, str]) -> list[SpanProcessor]:
    processors: list[SpanProcessor] = []
    local = environ.get(EXPORTER_ENV, "none").strip()
    if local == "console":
        processors.append(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif local.startswith("jsonl:"):
        path = Path(local[len("jsonl:") :]) / f"{service}-{os.getpid()}.jsonl"
        processors.append(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    elif local not in ("", "none"):
        raise ValueError(f"{EXPORTER_ENV} must be none, console or jsonl:DIR, got {local!r}")
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    names = [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp" if endpoint else "none").split(",") if n.strip()]
    for name in names:
        if name == "otlp":
            processors.append(BatchSpanProcessor(_otlp_exporter(environ)))
        elif name == "console" and local != "console":
            processors.append(SimpleSpanProcessor(ConsoleSpanExporter()))
        elif name not in ("none", "console"):
            raise ValueError(f"OTEL_TRACES_EXPORTER: unsupported exporter {name!r} (use otlp, console or none)")
    return processors


def _otlp_exporter(environ: Mapping[str, str]) -> SpanExporter:
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    if protocol != "grpc":
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: tessera exports OTLP over gRPC (port 4317); set it to grpc")
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, TLS, compression and timeout from OTEL_EXPORTER_OTLP_*


def tracing_enabled() -> bool:
    return _enabled


def tracer() -> trace.Tracer:
    return trace.get_tracer("tessera")


def outgoing_metadata() -> list[tuple[str, str]]:
    """The current trace context as gRPC metadata (empty when tracing is off)."""
    if not _enabled:
        return []
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return list(carrier.items())


def context_from_metadata(metadata) -> object:
    return propagate.extract({k: v for k, v in (metadata or ()) if isinstance(v, str)})
