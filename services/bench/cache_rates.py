"""Cache hit rates over a run, from the deltas of an endpoint's Prometheus /metrics.

Tessera (the gateway's cluster view): every cache reports ``tessera_<cache>_cache_hits_total`` and
``..._misses_total`` (shared/cache_gauges.py), and its rate is hits / (hits + misses): processor,
encoder and prefill embeddings in images, prefix in prompt tokens, remote KV in blocks pulled from
peers. vLLM: prefix =
``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` (both in tokens). A rate
whose counters did not move (no such work in the run) is absent, not zero.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Counters = dict[str, float]

# rate name -> (hits counter, other counters that with hits make the total)
TESSERA_RATES = {
    cache: (f"tessera_{cache}_cache_hits_total", (f"tessera_{cache}_cache_misses_total",))
    for cache in ("processor", "encoder", "embedding", "prefix", "remote_kv")
}
VLLM_PREFIX = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")


def scrape(base_url: str) -> Counters:
    """Every counter sample, summed over labels; {} when the endpoint has no /metrics."""
    try:
        response = httpx.get(base_url.removesuffix("/").removesuffix("/v1") + "/metrics", timeout=30)
    except httpx.HTTPError:
        return {}
    if response.status_code != 200:
        return {}
    counters: Counters = {}
    for family in text_string_to_metric_families(response.text):
        if family.type != "counter":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                counters[sample.name] = counters.get(sample.name, 0.0) + sample.value
    return counters


TOWER_RUNS = ("tessera_encoder_items_encoded_total", "tessera_prefill_images_encoded_locally_total")


def tower_runs(before: Counters, after: Counters) -> float | None:
    """Vision-tower runs between two scrapes, on encoders and on prefill nodes that encode
    (Tessera's cluster view); None for an endpoint that does not report them."""
    if not any(name in after for name in TOWER_RUNS):
        return None
    return sum(after.get(name, 0.0) - before.get(name, 0.0) for name in TOWER_RUNS)


# Seconds the endpoint's nodes spent, by stage: decoding video, and running vision towers.
SECONDS = {
    "video_decode_s": ("tessera_video_decode_seconds_total",),
    "tower_s": ("tessera_encoder_tower_seconds_total", "tessera_prefill_tower_seconds_total"),
}


def seconds_spent(before: Counters, after: Counters) -> dict[str, float]:
    """Each stage's seconds between two scrapes, where the endpoint reports it (Tessera's)."""
    return {
        stage: sum(after.get(name, 0.0) - before.get(name, 0.0) for name in names)
        for stage, names in SECONDS.items()
        if any(name in after for name in names)
    }


def hit_rates(before: Counters, after: Counters) -> dict[str, float]:
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    rates = {}
    for rate, (hits, others) in TESSERA_RATES.items():
        total = delta(hits) + sum(delta(o) for o in others)
        if total > 0:
            rates[rate] = delta(hits) / total
    vllm_hits, vllm_queries = (delta(name) for name in VLLM_PREFIX)
    if vllm_queries > 0:
        rates["prefix"] = vllm_hits / vllm_queries
    return rates
