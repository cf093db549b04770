"""A run's results under `vllm bench serve`'s field names and meanings, so a Tessera run and a
vLLM run sit in one table (``tessera bench --compare`` reads either file).

Per request (successful ones only, as vLLM counts them):
  ttft  first content chunk, from the request's send;
  tpot  (e2el - ttft) / (output tokens - 1), for requests of more than one token;
  itl   the gaps between consecutive content chunks;
  e2el  send to last chunk.
Each metric gets mean_, median_, std_ and p{N}_ fields in milliseconds (numpy's linear
percentiles, as vLLM). Goodput counts the requests within every given SLO (ms) per second.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from services.bench.runner import RequestRecord

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
SLO_METRICS = ("ttft", "tpot", "e2el")
# The scalar fields `--compare` shows, in order.
TABLE_FIELDS = (
    "completed",
    "failed",
    "duration",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    *(f"{kind}_{metric}_ms" for metric in ("ttft", "tpot", "itl", "e2el") for kind in ("mean", "median", "p99")),
)


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """``["ttft:2000", "tpot:100"]`` -> {"ttft": 2000.0, "tpot": 100.0}, as vLLM's --goodput."""
    slos = {}
    for item in items:
        name, _, value = item.partition(":")
        if name not in SLO_METRICS or not value:
            raise ValueError(f"--goodput takes {', '.join(m + ':MS' for m in SLO_METRICS)}; got {item!r}")
        if float(value) <= 0:
            raise ValueError(f"an SLO must be positive: {item!r}")
        slos[name] = float(value)
    return slos


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """One successful request's latencies, in seconds (None where it has none)."""

    ttft: float | None
    tpot: float | None
    e2el: float | None
    itls: list[float]


def inter_token_latencies(record: RequestRecord) -> list[float]:
    return [b - a for a, b in zip(record.token_times_s, record.token_times_s[1:])]


def request_metrics(record: RequestRecord) -> RequestMetrics:
    e2el = record.end_s - record.start_s if record.end_s is not None else None
    tpot = None
    if e2el is not None and record.ttft_s is not None and record.num_tokens > 1:
        tpot = (e2el - record.ttft_s) / (record.num_tokens - 1)
    return RequestMetrics(record.ttft_s, tpot, e2el, inter_token_latencies(record))


def vllm_result(
    records: Sequence[RequestRecord],
    duration_s: float,
    *,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    goodput_slos: Mapping[str, float] | None = None,
    request_rate: float | None = None,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
) -> dict:
    ok = [r for r in records if r.error is None]
    per_request = [request_metrics(r) for r in ok]
    input_tokens, output_tokens = sum(r.prompt_tokens for r in ok), sum(r.num_tokens for r in ok)
    result: dict = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / duration_s if duration_s else 0.0,
        "request_goodput": _goodput(per_request, goodput_slos, duration_s) if goodput_slos else None,
        "output_throughput": output_tokens / duration_s if duration_s else 0.0,
        "total_token_throughput": (input_tokens + output_tokens) / duration_s if duration_s else 0.0,
        "max_concurrency": max_concurrency,
        "request_rate": "inf" if request_rate is None else request_rate,
        "burstiness": burstiness,
        "input_lens": [r.prompt_tokens for r in records],
        "output_lens": [r.num_tokens for r in records],
        "ttfts": [r.ttft_s or 0.0 for r in records],
        "itls": [inter_token_latencies(r) for r in records],
        "errors": [r.error or "" for r in records],
    }
    for metric in ("ttft", "tpot", "e2el"):
        values = [getattr(m, metric) for m in per_request]
        _add_metric(result, metric, [v for v in values if v is not None], percentiles)
    _add_metric(result, "itl", [gap for m in per_request for gap in m.itls], percentiles)
    return result


def _add_metric(result: dict, name: str, values_s: list[float], percentiles: Sequence[float]) -> None:
    values_ms = np.asarray(values_s or [0.0]) * 1000.0
    result[f"mean_{name}_ms"] = float(values_ms.mean())
    result[f"median_{name}_ms"] = float(np.median(values_ms))
    result[f"std_{name}_ms"] = float(values_ms.std())
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        result[f"p{word}_{name}_ms"] = float(np.percentile(values_ms, p))


def _goodput(per_request: list[RequestMetrics], slos: Mapping[str, float], duration_s: float) -> float:
    def good(metrics: RequestMetrics) -> bool:
        values = {name: getattr(metrics, name) for name in slos}
        return all(values[name] is not None and values[name] * 1000.0 <= slo for name, slo in slos.items())

    return sum(good(m) for m in per_request) / duration_s if duration_s else 0.0


def is_vllm_result(data: Mapping) -> bool:
    return "request_throughput" in data and "mean_ttft_ms" in data


def table(labels: Sequence[str], results: Sequence[Mapping]) -> str:
    """The TABLE_FIELDS of each result side by side; with two, a ratio column (second / first)."""
    rows = [["", *labels] + (["ratio"] if len(results) == 2 else [])]
    for name in TABLE_FIELDS:
        values = [result.get(name) for result in results]
        row = [name, *("-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v) for v in values)]
        if len(results) == 2:
            a, b = values
            numeric = isinstance(a, int | float) and isinstance(b, int | float) and a
            row.append(f"{b / a:.2f}x" if numeric else "-")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
