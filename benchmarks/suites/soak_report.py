"""The soak benchmark's verdict, from its samples and request outcomes (pure functions, no I/O
except ``write_plot``): per-process memory growth over the run after its warm-up, per-cache peak
occupancy against the budget, request counts and success rates, and which goals were missed.

Growth compares a process's RSS at the first sample after the warm-up (the first 20% of the run:
2 of 10 minutes, when model loading, first-touch allocations and the caches filling to their
budgets are over) with its RSS at the last sample, taken after the traffic stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.suites.soak_monitor import Sample
from benchmarks.suites.soak_traffic import Outcome

MAX_GROWTH_PCT = 5.0
WARMUP_FRACTION = 0.2
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ProcessGrowth:
    name: str
    start_bytes: int  # at the first sample after the warm-up
    end_bytes: int
    peak_bytes: int  # over the whole run

    @property
    def growth_pct(self) -> float:
        return 100.0 * (self.end_bytes - self.start_bytes) / self.start_bytes


@dataclass(frozen=True, slots=True)
class CachePeak:
    name: str  # "<node>/<cache>"
    unit: str
    capacity: float
    peak_used: float
    end_used: float

    @property
    def peak_fraction(self) -> float:
        return self.peak_used / self.capacity if self.capacity > 0 else 0.0

    @property
    def within_budget(self) -> bool:
        return self.peak_used <= self.capacity


@dataclass(slots=True)
class TrafficSummary:
    kind_to_num_ok: dict[str, int] = field(default_factory=dict)
    kind_to_num_failed: dict[str, int] = field(default_factory=dict)
    bad_case_to_statuses: dict[str, dict[str, int]] = field(default_factory=dict)
    num_good: int = 0
    num_good_ok: int = 0
    num_bad: int = 0
    num_bad_4xx: int = 0

    @property
    def success_rate(self) -> float | None:
        """Requests that succeeded, bad requests excluded."""
        return self.num_good_ok / self.num_good if self.num_good else None

    @property
    def bad_4xx_rate(self) -> float | None:
        return self.num_bad_4xx / self.num_bad if self.num_bad else None


def warmup_s(duration_s: float) -> float:
    return WARMUP_FRACTION * duration_s


def process_growth(samples: list[Sample], warmup_end_s: float) -> list[ProcessGrowth]:
    """Every process seen both after the warm-up and in the last sample."""
    if not samples:
        return []
    last = samples[-1]
    out = []
    for name in sorted({name for s in samples for name in s.rss_bytes}):
        after = [s.rss_bytes[name] for s in samples if s.t_s >= warmup_end_s and name in s.rss_bytes]
        if not after or name not in last.rss_bytes:
            continue
        peak = max(s.rss_bytes[name] for s in samples if name in s.rss_bytes)
        out.append(ProcessGrowth(name, after[0], last.rss_bytes[name], peak))
    return out


def cache_peaks(samples: list[Sample]) -> list[CachePeak]:
    out = []
    for name in sorted({name for s in samples for name in s.caches}):
        seen = [s.caches[name] for s in samples if name in s.caches]
        out.append(CachePeak(name, seen[-1].unit, max(u.capacity for u in seen), max(u.used for u in seen), seen[-1].used))
    return out


def summarize_traffic(outcomes: list[Outcome]) -> TrafficSummary:
    summary = TrafficSummary()
    for outcome in outcomes:
        counts = summary.kind_to_num_ok if outcome.ok else summary.kind_to_num_failed
        counts[outcome.kind] = counts.get(outcome.kind, 0) + 1
        if outcome.kind == "bad":
            summary.num_bad += 1
            summary.num_bad_4xx += outcome.ok
            statuses = summary.bad_case_to_statuses.setdefault(outcome.case, {})
            status = str(outcome.status) if outcome.status is not None else "no response"
            statuses[status] = statuses.get(status, 0) + 1
        else:
            summary.num_good += 1
            summary.num_good_ok += outcome.ok
    return summary


def missed_goals(growth: list[ProcessGrowth], peaks: list[CachePeak], traffic: TrafficSummary, num_restarts: int) -> list[str]:
    missed = [f"{g.name}: RSS grew {g.growth_pct:.1f}% (goal < {MAX_GROWTH_PCT:.0f}%)" for g in growth if g.growth_pct >= MAX_GROWTH_PCT]
    missed += [f"{p.name}: {p.peak_used:.0f} {p.unit} used, over its budget of {p.capacity:.0f}" for p in peaks if not p.within_budget]
    if traffic.success_rate is None:
        missed.append("no request other than bad ones was sent")
    elif traffic.num_good_ok < traffic.num_good:
        missed.append(f"{traffic.num_good - traffic.num_good_ok} of {traffic.num_good} requests failed (goal: none)")
    if traffic.num_bad_4xx < traffic.num_bad:
        missed.append(f"{traffic.num_bad - traffic.num_bad_4xx} of {traffic.num_bad} bad requests got no 4xx")
    if num_restarts:
        missed.append(f"{num_restarts} stack process restart(s): a role or Valkey died")
    return missed


def failure_examples(outcomes: list[Outcome], per_kind: int = 3) -> dict[str, list[str]]:
    """The first few errors of each kind (bad requests by case), for the log and the JSON."""
    out: dict[str, list[str]] = {}
    for outcome in outcomes:
        if not outcome.ok:
            key = f"bad:{outcome.case}" if outcome.kind == "bad" else outcome.kind
            examples = out.setdefault(key, [])
            if len(examples) < per_kind:
                examples.append(outcome.error or "")
    return out


def format_table(headers: list[str], rows: list[list[object]]) -> str:
    """Plain text, left-aligned first column, the others right-aligned."""
    cells = [headers, *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if not value.is_integer() else f"{value:.0f}"
    return str(value)


def growth_table(growth: list[ProcessGrowth]) -> str:
    rows = [[g.name, g.start_bytes / MIB, g.end_bytes / MIB, g.peak_bytes / MIB, f"{g.growth_pct:+.2f}%"] for g in growth]
    return format_table(["process", "RSS after warm-up (MiB)", "RSS at end (MiB)", "peak (MiB)", "growth"], rows)


def cache_table(peaks: list[CachePeak]) -> str:
    rows = [
        [p.name, p.unit, p.peak_used, p.capacity, f"{100 * p.peak_fraction:.1f}%", p.end_used, "ok" if p.within_budget else "OVER"]
        for p in peaks
    ]
    return format_table(["cache", "unit", "peak used", "budget", "peak / budget", "used at end", "verdict"], rows)


def traffic_table(traffic: TrafficSummary) -> str:
    kinds = sorted(set(traffic.kind_to_num_ok) | set(traffic.kind_to_num_failed))
    rows = [[k, traffic.kind_to_num_ok.get(k, 0), traffic.kind_to_num_failed.get(k, 0)] for k in kinds]
    return format_table(["kind", "ok", "failed"], rows)


def bad_case_table(traffic: TrafficSummary) -> str:
    rows = [
        [case, ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items()))]
        for case, statuses in sorted(traffic.bad_case_to_statuses.items())
    ]
    return format_table(["bad request", "statuses"], rows)


def rate_line(traffic: TrafficSummary) -> str:
    def pct(rate: float | None) -> str:
        return "-" if rate is None else f"{100 * rate:.2f}%"

    return (
        f"success rate, bad requests excluded: {pct(traffic.success_rate)} ({traffic.num_good_ok}/{traffic.num_good}); "
        f"bad requests answered 4xx: {pct(traffic.bad_4xx_rate)} ({traffic.num_bad_4xx}/{traffic.num_bad})"
    )


def write_plot(samples: list[Sample], warmup_end_s: float, path: Path, title: str) -> Path:
    """RSS per process (MiB) and cache occupancy as a fraction of its budget, over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (memory, caches) = plt.subplots(1, 2, figsize=(16, 8))
    for axes in (memory, caches):  # more lines than the default ten colours
        axes.set_prop_cycle(color=plt.get_cmap("tab20").colors)
    for name in sorted({n for s in samples for n in s.rss_bytes}):
        points = [(s.t_s / 60, s.rss_bytes[name] / MIB) for s in samples if name in s.rss_bytes]
        memory.plot(*zip(*points), label=name)
    for name in sorted({n for s in samples for n in s.caches}):
        points = [(s.t_s / 60, s.caches[name].fraction) for s in samples if name in s.caches]
        caches.plot(*zip(*points), label=name, linewidth=1)
    for axes in (memory, caches):
        axes.axvline(warmup_end_s / 60, color="grey", linestyle="--", linewidth=1)
        axes.grid(alpha=0.3)
        axes.set_xlabel("minutes into the run (dashed: end of warm-up)")
    caches.axhline(1.0, color="red", linewidth=1)
    memory.set(title="RSS per process", ylabel="MiB")
    caches.set(title="Cache occupancy (red: budget)", ylabel="used / budget", ylim=(0, 1.1))
    for axes in (memory, caches):  # below the axes: inside, they hide the lines near the budget
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
