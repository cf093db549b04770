"""Router decision time: block hashing, one index lookup and scoring, for a long prompt, against
a real Redis-protocol server on loopback (embedded Valkey by default, or --index-url).

    python benchmarks/router_bench.py [--prompt-tokens 4096] [--decisions 2000]
Prints percentiles and writes JSON (default benchmarks/results/router.json). The headline row is
Router.route as the gateway calls it (the router hashes the prompt); the second passes the block
hashes precomputed (Router.route(..., block_hashes=...)), as a caller that already has them can.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.router.membership import Membership  # noqa: E402
from services.router.router import Router  # noqa: E402
from shared.hashing import MmSpan, block_hashes  # noqa: E402
from shared.index.backend import create_index  # noqa: E402
from shared.index.types import IndexEvents, MmEntry, NodeInfo  # noqa: E402
from shared.types import MmHash, PlaceholderRange  # noqa: E402
from tests.redis_servers import running_server, valkey_binary  # noqa: E402


def run(index_url: str, prompt_tokens: int, decisions: int, block_size: int) -> dict:
    index = create_index(index_url, namespace="router-bench")
    nodes = {role: [f"127.0.0.1:{5000 + 10 * k + i}" for i in range(2)] for k, role in enumerate(("encoder", "prefill", "decode"))}
    epochs = {}
    for role, addresses in nodes.items():
        for address in addresses:
            node_id = f"{role}@{address}"
            epochs[node_id] = index.register_node(NodeInfo(node_id, role, address), ttl_s=600)
    tokens = list(range(prompt_tokens))
    image = (MmHash("f" * 64), PlaceholderRange(100, 1024))
    hashes = block_hashes(tokens, block_size, [MmSpan(image[0], image[1])])
    # One prefill node holds the whole prefix, the other half of it; one encoder holds the image.
    index.publish(
        f"prefill@{nodes['prefill'][0]}", epochs[f"prefill@{nodes['prefill'][0]}"], IndexEvents(kv_stored={h: "device" for h in hashes})
    )
    index.publish(
        f"prefill@{nodes['prefill'][1]}",
        epochs[f"prefill@{nodes['prefill'][1]}"],
        IndexEvents(kv_stored={h: "device" for h in hashes[: len(hashes) // 2]}),
    )
    index.publish(
        f"encoder@{nodes['encoder'][1]}",
        epochs[f"encoder@{nodes['encoder'][1]}"],
        IndexEvents(mm_stored={image[0]: MmEntry(1024, (1, 64, 64), 1024 * 768 * 4)}),
    )
    router = Router(Membership(index), index=index, block_size=block_size)
    route = router.route(tokens, [image])
    assert route.prefill == nodes["prefill"][0] and route.encoder == nodes["encoder"][1], route
    expected = {nodes["prefill"][0]: len(hashes) * block_size, nodes["prefill"][1]: len(hashes) // 2 * block_size}
    assert route.prefix_tokens_by_node == {a: n for a, n in expected.items() if n}, route
    result = {"prompt_tokens": prompt_tokens, "blocks": len(hashes), "decisions": decisions}
    result.update(_timed(lambda: router.route(tokens, [image]), decisions))
    result["hashes_given"] = _timed(lambda: router.route(tokens, [image], block_hashes=hashes), decisions)
    return result


def _timed(decide, decisions: int) -> dict:
    for _ in range(min(50, decisions)):  # warm up: script cache, connection, allocator
        decide()
    times = []
    for _ in range(decisions):
        started = time.perf_counter()
        decide()
        times.append(time.perf_counter() - started)
    times.sort()
    pct = lambda q: times[min(len(times) - 1, int(q * len(times)))] * 1e3  # noqa: E731
    return {"p50_ms": pct(0.50), "p99_ms": pct(0.99), "mean_ms": statistics.mean(times) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index-url", default=None, help="default: start an embedded Valkey on loopback")
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "router.json")
    args = parser.parse_args()
    if args.index_url:
        result = run(args.index_url, args.prompt_tokens, args.decisions, args.block_size)
    else:
        with running_server(valkey_binary()) as url:
            result = run(url, args.prompt_tokens, args.decisions, args.block_size)
    print(f"{'prompt tokens':>14} {'blocks':>7} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"{result['prompt_tokens']:>14} {result['blocks']:>7} {result['p50_ms']:>8.3f} {result['p99_ms']:>8.3f}")
    given = result["hashes_given"]
    print(f"{'(hashes given)':>14} {result['blocks']:>7} {given['p50_ms']:>8.3f} {given['p99_ms']:>8.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "router",
                "command": " ".join(["python", "benchmarks/router_bench.py", *sys.argv[1:]]),
                "machine": {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]},
                "results": result,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
