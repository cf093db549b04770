"""One figure per run (or per comparison): TTFT CDF, output throughput over time (tokens per
second, 1 s bins of completion time), and cache hit rates. Runs share the axes, so a comparison
reads at a glance. matplotlib renders off-screen (Agg) to a PNG."""

from __future__ import annotations

from pathlib import Path

from services.bench.report import Run


def plot(runs: list[Run], path: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # an install without the bench extra
        raise RuntimeError("plots need matplotlib: pip install 'tessera[bench]'") from exc
    figure, (cdf, throughput, caches) = plt.subplots(1, 3, figsize=(16, 4.5))
    for run in runs:
        ttfts = sorted(r.ttft_s for r in run.records if r.error is None and r.ttft_s is not None)
        if ttfts:
            cdf.step(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))], where="post", label=run.label)
        bins = tokens_per_second(run)
        throughput.plot(range(len(bins)), bins, drawstyle="steps-post", label=run.label)
    cdf.set(title="TTFT CDF", xlabel="seconds", ylabel="fraction of requests", ylim=(0, 1.02))
    throughput.set(title="Output throughput", xlabel="seconds into the run", ylabel="tokens / s")
    _cache_bars(caches, runs)
    for axes in (cdf, throughput):
        axes.grid(alpha=0.3)
        axes.legend()
    figure.suptitle(" vs ".join(f"{run.label} ({run.workload})" for run in runs))
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def tokens_per_second(run: Run) -> list[float]:
    """Output tokens of the requests that completed in each 1-second bin."""
    bins = [0.0] * (int(run.wall_s) + 1)
    for record in run.records:
        if record.error is None and record.end_s is not None:
            bins[min(int(record.end_s), len(bins) - 1)] += record.num_tokens
    return bins


def _cache_bars(axes, runs: list[Run]) -> None:
    names = sorted({name for run in runs for name in run.cache_hit_rates})
    width = 0.8 / max(1, len(runs))
    for i, run in enumerate(runs):
        axes.bar([x + i * width for x in range(len(names))], [run.cache_hit_rates.get(n, 0.0) for n in names], width, label=run.label)
    axes.set_xticks([x + width * (len(runs) - 1) / 2 for x in range(len(names))], names)
    axes.set(title="Cache hit rates", ylabel="hit rate", ylim=(0, 1.05))
    if not names:
        axes.text(0.5, 0.5, "no cache metrics at this endpoint", ha="center", va="center", transform=axes.transAxes)
    axes.legend()
