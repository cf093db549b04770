"""A run's summary, its JSON file, and the table that prints one or more runs side by side.

Summary: requests ok and failed; TTFT p50/p90/p99 over all requests and p50 over first touches
(the cold path); TPOT and inter-token latency p50/p99; end-to-end latency p50/p99; throughput in
requests and output tokens per second of wall time; goodput under the run's SLOs; cache hit
rates. A second run in a table gets a ratio column (second / first). The JSON file also carries
`vllm bench serve`'s fields (services/bench/serve_metrics.py), so it compares with vLLM's own.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from services.bench import serve_metrics
from services.bench.portable import write_json
from services.bench.runner import RequestRecord

# Workloads whose first-touch requests each bring one image no earlier request had.
NEW_IMAGE_PER_FIRST_TOUCH = ("shared_images", "multi_turn", "cold_images")


@dataclass(slots=True)
class Run:
    label: str
    workload: str
    settings: dict
    wall_s: float
    records: list[RequestRecord]
    cache_hit_rates: dict[str, float] = field(default_factory=dict)
    tower_runs: float | None = None  # vision-tower runs over the run, from the endpoint's metrics (Tessera's)
    num_new_items: int | None = None  # vision items no earlier request of the run brought (the workload's count)
    seconds_spent: dict[str, float] = field(default_factory=dict)  # by stage (cache_rates.SECONDS)

    def summary(self) -> dict[str, float | int | None]:
        ok = [r for r in self.records if r.error is None]
        ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
        first_touch = [r.ttft_s for r in ok if r.ttft_s is not None and r.first_touch]
        latencies = [r.end_s - r.start_s for r in ok if r.end_s is not None]
        per_request = [serve_metrics.request_metrics(r) for r in ok]
        tpots = [m.tpot for m in per_request if m.tpot is not None]
        itls = [gap for m in per_request for gap in m.itls]
        summary: dict[str, float | int | None] = {
            "requests_ok": len(ok),
            "requests_failed": len(self.records) - len(ok),
            "ttft_p50_s": percentile(ttfts, 0.5),
            "ttft_p90_s": percentile(ttfts, 0.9),
            "ttft_p99_s": percentile(ttfts, 0.99),
            "first_touch_ttft_p50_s": percentile(first_touch, 0.5),
            "tpot_p50_s": percentile(tpots, 0.5),
            "tpot_p99_s": percentile(tpots, 0.99),
            "itl_p50_s": percentile(itls, 0.5),
            "itl_p99_s": percentile(itls, 0.99),
            "latency_p50_s": percentile(latencies, 0.5),
            "latency_p99_s": percentile(latencies, 0.99),
            "requests_per_s": len(ok) / self.wall_s if self.wall_s else None,
            "output_tokens_per_s": sum(r.num_tokens for r in ok) / self.wall_s if self.wall_s else None,
            "wall_s": self.wall_s,
        }
        if self.settings.get("goodput"):
            summary["goodput_requests_per_s"] = self.vllm_fields()["request_goodput"]
        for name, rate in sorted(self.cache_hit_rates.items()):
            summary[f"{name}_cache_hit_rate"] = rate
        num_new_images = sum(r.first_touch for r in self.records)
        if self.tower_runs is not None and num_new_images and self.workload in NEW_IMAGE_PER_FIRST_TOUCH:
            summary["tower_runs_per_new_image"] = self.tower_runs / num_new_images  # 1.00: each image encoded once
        if self.tower_runs is not None and self.num_new_items and self.workload == "video_clips":
            summary["tower_runs_per_new_group"] = self.tower_runs / self.num_new_items  # 1.00: each group encoded once
        for stage, seconds in sorted(self.seconds_spent.items()):
            summary[stage] = seconds
        return summary

    def vllm_fields(self) -> dict:
        return serve_metrics.vllm_result(
            self.records,
            self.wall_s,
            goodput_slos=self.settings.get("goodput") or None,
            request_rate=self.settings.get("request_rate"),
            burstiness=self.settings.get("burstiness", 1.0),
            max_concurrency=self.settings.get("concurrency"),
        )

    def to_json(self) -> dict:
        return {
            **self.vllm_fields(),
            "label": self.label,
            "workload": self.workload,
            "settings": self.settings,
            "wall_s": self.wall_s,
            "summary": self.summary(),
            "cache_hit_rates": self.cache_hit_rates,
            "tower_runs": self.tower_runs,
            "num_new_items": self.num_new_items,
            "seconds_spent": self.seconds_spent,
            "records": [asdict(r) for r in self.records],
        }

    @staticmethod
    def from_json(data: dict) -> Run:
        records = [RequestRecord(**r) for r in data["records"]]
        return Run(
            data["label"],
            data["workload"],
            data["settings"],
            data["wall_s"],
            records,
            data.get("cache_hit_rates", {}),
            data.get("tower_runs"),
            data.get("num_new_items"),
            data.get("seconds_spent", {}),
        )


def save(run: Run, path: Path) -> None:
    write_json(path, run.to_json())


def load(path: Path) -> Run:
    return Run.from_json(json.loads(Path(path).read_text()))


def table(runs: list[Run]) -> str:
    summaries = [run.summary() for run in runs]
    keys = list(dict.fromkeys(key for summary in summaries for key in summary))
    header = ["", *(run.label for run in runs)] + (["ratio"] if len(runs) == 2 else [])
    rows = [header]
    for key in keys:
        values = [summary.get(key) for summary in summaries]
        row = [key, *(_cell(v) for v in values)]
        if len(runs) == 2:
            first, second = values
            row.append(f"{second / first:.2f}x" if isinstance(first, int | float) and isinstance(second, int | float) and first else "-")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
