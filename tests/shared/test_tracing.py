from __future__ import annotations

import pytest

from shared import tracing


def test_tracing_is_off_by_default(monkeypatch):
    monkeypatch.delenv(tracing.EXPORTER_ENV, raising=False)
    assert tracing.configure_tracing("unit") is False
    assert tracing.outgoing_metadata() == [] and not tracing.tracing_enabled()


def test_unknown_exporter_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(tracing.EXPORTER_ENV, "zipkin")
    with pytest.raises(ValueError, match="none, console or jsonl:DIR"):
        tracing.configure_tracing("unit")


def test_the_standard_otel_variables_choose_the_exporters():
    assert tracing.span_processors("unit", {}) == []
    assert tracing.span_processors("unit", {"OTEL_TRACES_EXPORTER": "none"}) == []
    # An endpoint alone turns OTLP on, batched.
    [otlp] = tracing.span_processors("unit", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"})
    assert type(otlp).__name__ == "BatchSpanProcessor"
    assert len(tracing.span_processors("unit", {"OTEL_TRACES_EXPORTER": "otlp,console"})) == 2
    both = tracing.span_processors("unit", {"TESSERA_TRACE_EXPORTER": "console", "OTEL_TRACES_EXPORTER": "console"})
    assert len(both) == 1  # console once, however it was asked for
    with pytest.raises(ValueError, match="unsupported exporter 'zipkin'"):
        tracing.span_processors("unit", {"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ValueError, match="over gRPC"):
        tracing.span_processors("unit", {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})


def test_spans_reach_a_real_otlp_receiver(monkeypatch):
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from tests.otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver().start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)  # the exporter reads its own variables
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
        [processor] = tracing.span_processors("unit", {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
        provider = TracerProvider(resource=Resource.create({"service.name": "tessera-unit"}))
        provider.add_span_processor(processor)
        with provider.get_tracer("test").start_as_current_span("gateway.route", attributes={"tessera.route.encoder": "e:1"}):
            pass
        provider.force_flush()
        [span] = receiver.wait_for(lambda spans: len(spans) == 1, timeout_s=10)
        assert (span.service, span.name, span.attributes) == ("tessera-unit", "gateway.route", {"tessera.route.encoder": "e:1"})
        provider.shutdown()
    finally:
        receiver.stop()
