"""OpenTelemetry tracing: one trace per request across gateway -> preprocess -> encoder ->
prefill -> decode, with W3C trace context carried in gRPC metadata.

Off by default. ``TESSERA_TRACE_EXPORTER`` picks the exporter:
  none (default)   no spans are recorded
  console          spans printed to stderr as JSON
  jsonl:DIR        one JSON line per span in DIR/<service>-<pid>.jsonl (no collector needed)
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter, SpanExportResult

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
                }
                out.write(json.dumps(record) + "\n")
        return SpanExportResult.SUCCESS


def configure_tracing(service: str) -> bool:
    """Install the configured exporter for this process; returns whether tracing is on."""
    global _enabled
    setting = os.environ.get(EXPORTER_ENV, "none").strip()
    if setting in ("", "none"):
        return False
    if setting == "console":
        exporter: SpanExporter = ConsoleSpanExporter()
    elif setting.startswith("jsonl:"):
        exporter = JsonLinesSpanExporter(Path(setting[len("jsonl:") :]) / f"{service}-{os.getpid()}.jsonl")
    else:
        raise ValueError(f"{EXPORTER_ENV} must be none, console or jsonl:DIR, got {setting!r}")
    provider = TracerProvider(resource=Resource.create({"service.name": f"tessera-{service}"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _enabled = True
    return True


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
