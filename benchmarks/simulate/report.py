"""The simulation's table, its growth with the node count, and the simulation's goals.

Goals, checked at the largest node count of the run (512 in the default run) for cache_aware:
  decision p99 <= 2 ms; index work per request (server commands and bytes, all index traffic)
  within 10% between the smallest and largest node counts, under steady load (up to the last
  session's arrival, run.py's _arrivals_end says why; the whole run's is shown beside it);
  tower runs per distinct image <= 1.01; hit rate >= 3x round_robin's (the compute-weighted hit
  rate, metrics.py).
"""

from __future__ import annotations

GROWTH_METRICS = (
    "tower_runs_per_distinct_image",
    "prefill_tokens_per_novel_token",
    "compute_hit_rate",
    "ttft_p50_s",
    "ttft_p99_s",
    "decision_p50_ms",
    "decision_p99_ms",
    "index_commands_per_request",
    "index_bytes_per_request",
    "steady_index_commands_per_request",
    "steady_index_bytes_per_request",
    "lookup_commands",
    "lookup_bytes",
    "index_mib_per_million_entries",
)
COLUMNS = (  # header, width, row -> value, format
    ("policy", 11, lambda r: r["policy"], "s"),
    ("nodes", 5, lambda r: r["nodes"], "d"),
    ("reqs", 6, lambda r: r["requests"], "d"),
    ("lost", 4, lambda r: r["lost"], "d"),
    ("tower/img", 9, lambda r: r["tower_runs_per_distinct_image"], ".3f"),
    ("pf/novel", 8, lambda r: r["prefill_tokens_per_novel_token"], ".3f"),
    ("hit pfx", 7, lambda r: r["prefix_hit_rate"], ".3f"),
    ("hit img", 7, lambda r: r["image_hit_rate"], ".3f"),
    ("hit cmp", 7, lambda r: r["compute_hit_rate"], ".3f"),
    ("ttft50 s", 8, lambda r: r["ttft_p50_s"], ".3f"),
    ("ttft99 s", 8, lambda r: r["ttft_p99_s"], ".2f"),
    ("dec50 ms", 8, lambda r: r["decision_p50_ms"], ".3f"),
    ("dec99 ms", 8, lambda r: r["decision_p99_ms"], ".3f"),
    ("cpu99 ms", 8, lambda r: r["decision_cpu_p99_ms"], ".3f"),
    ("ops/req", 7, lambda r: r["index"]["server_commands"], ".1f"),
    ("KB/req", 7, lambda r: r["index"]["bytes"] / 1e3, ".1f"),
    ("steady ops", 10, lambda r: (r.get("index_steady") or {}).get("server_commands"), ".1f"),
    ("lkp ops", 7, lambda r: (r["lookup"] or {}).get("server_commands"), ".1f"),
    ("lkp KB", 6, lambda r: None if not r["lookup"] else (r["lookup"]["bytes_in"] + r["lookup"]["bytes_out"]) / 1e3, ".1f"),
    ("MiB/Mblk", 8, lambda r: r["index_memory"]["mib_per_million_entries"], ".0f"),
)


def flat(row: dict) -> dict:
    """The growth metrics of one result row, by name."""
    lookup = row["lookup"] or {}
    return {
        **{name: row.get(name) for name in GROWTH_METRICS[:7]},
        "index_commands_per_request": row["index"]["server_commands"],
        "index_bytes_per_request": row["index"]["bytes"],
        "steady_index_commands_per_request": (row.get("index_steady") or {}).get("server_commands"),
        "steady_index_bytes_per_request": (row.get("index_steady") or {}).get("bytes"),
        "lookup_commands": lookup.get("server_commands"),
        "lookup_bytes": lookup["bytes_in"] + lookup["bytes_out"] if lookup else None,
        "index_mib_per_million_entries": row["index_memory"]["mib_per_million_entries"],
    }


def growth(results: list[dict]) -> dict[str, dict[str, float | None]]:
    """Per policy, each metric at the largest node count over the same at the smallest."""
    out = {}
    for policy in dict.fromkeys(r["policy"] for r in results):
        rows = sorted((r for r in results if r["policy"] == policy), key=lambda r: r["nodes"])
        if len(rows) < 2:
            continue
        first, last = flat(rows[0]), flat(rows[-1])
        out[policy] = {"from_nodes": rows[0]["nodes"], "to_nodes": rows[-1]["nodes"]}
        out[policy].update({name: _ratio(last[name], first[name]) for name in GROWTH_METRICS})
    return out


def goals(results: list[dict]) -> dict:
    ours = sorted((r for r in results if r["policy"] == "cache_aware"), key=lambda r: r["nodes"])
    if not ours:
        return {}
    largest = ours[-1]
    baseline = next((r for r in results if r["policy"] == "round_robin" and r["nodes"] == largest["nodes"]), None)
    out: dict = {"at_nodes": largest["nodes"]}
    p99 = largest["decision_p99_ms"]
    out["decision_p99_ms"] = {"value": p99, "goal": "<= 2", "met": p99 is not None and p99 <= 2.0}
    if len(ours) > 1:
        first, last = flat(ours[0]), flat(largest)
        steady = ("steady_index_commands_per_request", "steady_index_bytes_per_request")
        ratios = {name: _ratio(last[name], first[name]) for name in (*steady, "index_commands_per_request", "index_bytes_per_request")}
        within = all(ratios[name] is not None and 0.9 <= ratios[name] <= 1.1 for name in steady)
        out["index_work_growth"] = {"value": ratios, "from_nodes": ours[0]["nodes"], "goal": "within 10%", "met": within}
    towers = largest["tower_runs_per_distinct_image"]
    out["tower_runs_per_distinct_image"] = {"value": towers, "goal": "<= 1.01", "met": towers is not None and towers <= 1.01}
    if baseline is not None:
        ratio = _ratio(largest["compute_hit_rate"], baseline["compute_hit_rate"])
        out["hit_rate_vs_round_robin"] = {"value": ratio, "goal": ">= 3", "met": ratio is not None and ratio >= 3.0}
    return out


def table(results: list[dict]) -> str:
    lines = [" ".join(f"{header:>{width}}" for header, width, _, _ in COLUMNS)]
    for row in results:
        cells = []
        for _, width, value, fmt in COLUMNS:
            v = value(row)
            cells.append(f"{'-':>{width}}" if v is None else f"{v:>{width}{fmt}}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def growth_table(grown: dict) -> str:
    lines = [f"{'growth':>30} " + " ".join(f"{p:>11}" for p in grown)]
    for name in GROWTH_METRICS:
        cells = [grown[p].get(name) for p in grown]
        lines.append(f"{name:>30} " + " ".join(f"{'-':>11}" if c is None else f"{c:>10.2f}x" for c in cells))
    return "\n".join(lines)


def goals_lines(checked: dict) -> str:
    lines = [f"goals at {checked.get('at_nodes')} nodes (cache_aware):"]
    for name, goal in checked.items():
        if isinstance(goal, dict):
            lines.append(f"  {name}: {_show(goal['value'])} (goal {goal['goal']}): {'met' if goal['met'] else 'NOT met'}")
    return "\n".join(lines)


def _show(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_show(v)}" for k, v in value.items())
    return "-" if value is None else f"{value:.3f}"


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None
