"""Summaries, the side-by-side table, cache hit rates from counter deltas, and the figure."""

from __future__ import annotations

from services.bench import cache_rates, plots, report
from services.bench.runner import RequestRecord


def make_run(label: str, ttfts: list[float], *, failed: int = 0) -> report.Run:
    records = [RequestRecord(i, "u", i == 0, start_s=i * 0.5, ttft_s=t, end_s=i * 0.5 + t + 1, num_tokens=16) for i, t in enumerate(ttfts)]
    records += [RequestRecord(100 + i, "u", False, 0.0, error="APIConnectionError: boom") for i in range(failed)]
    return report.Run(label, "shared_images", {}, wall_s=4.0, records=records, cache_hit_rates={"prefix": 0.5})


def test_summary_counts_quantiles_and_throughput():
    summary = make_run("a", [0.1, 0.2, 0.3, 0.4], failed=1).summary()
    assert summary["requests_ok"] == 4 and summary["requests_failed"] == 1
    assert summary["ttft_p50_s"] == 0.3 and summary["first_touch_ttft_p50_s"] == 0.1
    assert summary["output_tokens_per_s"] == 16.0 and summary["prefix_cache_hit_rate"] == 0.5


def test_compare_table_has_a_ratio_column(tmp_path):
    a, b = make_run("tessera", [0.2, 0.2]), make_run("vllm", [0.4, 0.4])
    report.save(a, tmp_path / "a.json")
    loaded = report.load(tmp_path / "a.json")
    assert loaded.summary() == a.summary()
    lines = report.table([loaded, b]).splitlines()
    assert lines[0].split() == ["tessera", "vllm", "ratio"]
    assert [line.split() for line in lines if line.startswith("ttft_p50_s")] == [["ttft_p50_s", "0.200", "0.400", "2.00x"]]


def test_hit_rates_from_counter_deltas_for_tessera_and_vllm():
    before = {"tessera_processor_cache_hits_total": 10, "tessera_processor_cache_misses_total": 5}
    after = {
        "tessera_processor_cache_hits_total": 13,
        "tessera_processor_cache_misses_total": 6,
        "tessera_prefix_cache_hits_total": 30,
        "tessera_prefix_cache_misses_total": 10,
        "tessera_remote_kv_cache_hits_total": 0,  # no pulls in the run: no rate
    }
    assert cache_rates.hit_rates(before, after) == {"processor": 0.75, "prefix": 0.75}
    assert cache_rates.hit_rates({}, {"vllm:prefix_cache_hits_total": 1, "vllm:prefix_cache_queries_total": 4}) == {"prefix": 0.25}


def test_tower_runs_per_new_image_from_both_tiers_counters(tmp_path):
    before = {"tessera_encoder_items_encoded_total": 2, "tessera_prefill_images_encoded_locally_total": 1}
    after = {"tessera_encoder_items_encoded_total": 5, "tessera_prefill_images_encoded_locally_total": 2}
    assert cache_rates.tower_runs(before, after) == 4
    assert cache_rates.tower_runs({}, {"vllm:prefix_cache_hits_total": 1}) is None  # an endpoint that does not say
    run = make_run("tessera", [0.1, 0.2, 0.3, 0.4])  # one first-touch request: one new image
    run.tower_runs = 2.0
    assert run.summary()["tower_runs_per_new_image"] == 2.0
    report.save(run, tmp_path / "r.json")
    assert report.load(tmp_path / "r.json").tower_runs == 2.0
    assert "tower_runs_per_new_image" not in make_run("vllm", [0.1]).summary()


def test_figure_is_a_png(tmp_path):
    path = plots.plot([make_run("a", [0.1, 0.3]), make_run("b", [0.2, 0.5])], tmp_path / "figure.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
