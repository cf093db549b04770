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
