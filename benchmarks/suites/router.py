"""Router decision time: block hashing, one index lookup and scoring, for a long prompt, against
a real Redis-protocol server on loopback (embedded Valkey by default, or --index-url).

    tessera bench --suite router [--prompt-tokens 4096] [--decisions 2000] [--idle-nodes 0,64,512]

With --idle-nodes, each count of idle nodes (registered, holding nothing) is added to the cluster
in turn: the decision's cost must not grow with it. Prints percentiles and writes JSON (default
benchmarks/results/router.json). The headline columns are Router.route as the gateway calls it
(the router hashes the prompt); "given" passes the block hashes precomputed
(Router.route(..., block_hashes=...)), as a caller that already has them can.

Router.route is a coroutine reading the index through an IndexReader (redis.asyncio over Redis or
Valkey), as on the gateway's event loop; each measurement owns one event loop and runs every
decision to completion on it, timed on the wall clock around that.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path

from benchmarks.suites.common import RESULTS, command, ms, write_json
from services.bench.report import percentile
from services.router.membership import Membership
from services.router.router import Router
from services.stack.node_process import free_port
from services.stack.redis_server import embedded_valkey_binary, start_redis_server
from shared.hashing import MmSpan, block_hashes
from shared.index.backend import CacheIndex, create_index
from shared.index.reader import IndexReader, LocalReader, create_reader
from shared.index.types import IndexEvents, MmEntry, NodeInfo
from shared.types import MmHash, PlaceholderRange


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--index-url", default=None, help="default: start an embedded Valkey on loopback")
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--idle-nodes", default="0", help="comma-separated counts of idle nodes to add to the 6 that hold work")
    parser.add_argument("--out", type=Path, default=RESULTS / "router.json")


def run(args: argparse.Namespace) -> int:
    results = []
    for idle in (int(n) for n in args.idle_nodes.split(",")):
        if args.index_url:
            results.append(decision_times(args.index_url, args.prompt_tokens, args.decisions, args.block_size, idle))
        else:
            with embedded_valkey() as url:
                results.append(decision_times(url, args.prompt_tokens, args.decisions, args.block_size, idle))
    print(f"{'nodes':>6} {'prompt tokens':>14} {'blocks':>7} {'p50 ms':>8} {'p99 ms':>8} {'given p50':>10} {'given p99':>10}")
    for result in results:
        given = result["hashes_given"]
        print(
            f"{result['nodes']:>6} {result['prompt_tokens']:>14} {result['blocks']:>7} {result['p50_ms']:>8.3f} {result['p99_ms']:>8.3f}"
            f" {given['p50_ms']:>10.3f} {given['p99_ms']:>10.3f}"
        )
    machine = {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
    write_json(args.out, {"benchmark": "router", "command": command(args), "machine": machine, "results": results})
    return 0


@contextlib.contextmanager
def embedded_valkey() -> Iterator[str]:
    """A Valkey of its own on a free loopback port, for one measurement; its URL."""
    process, url = start_redis_server(embedded_valkey_binary(), free_port())
    try:
        yield url
    finally:
        process.kill()  # no persistence: nothing to flush
        process.wait()


def decision_times(index_url: str, prompt_tokens: int, decisions: int, block_size: int, num_idle_nodes: int = 0) -> dict:
    """Two prefill nodes holding all and half of the prompt's prefix, an encoder holding its
    image, and ``num_idle_nodes`` more holding nothing; the route is checked once, then timed
    ``decisions`` times both ways."""
    namespace = f"router-bench-{num_idle_nodes}"
    index = create_index(index_url, namespace=namespace)  # the nodes' side: registrations and publishes
    # The router's side, as the gateway reads it. A memory:// reader would see an index of its own,
    # empty: there the router reads the index the nodes wrote.
    reader = LocalReader(index) if index_url.startswith("memory://") else create_reader(index_url, namespace=namespace)
    # One loop for the measurement (asyncio.run per decision would time a loop's setup and teardown).
    loop = asyncio.new_event_loop()
    try:
        return _decision_times(index, reader, loop, prompt_tokens, decisions, block_size, num_idle_nodes)
    finally:
        loop.run_until_complete(reader.close())  # a LocalReader closes the in-process index, which is harmless twice
        loop.close()
        index.close()


def _decision_times(
    index: CacheIndex,
    reader: IndexReader,
    loop: asyncio.AbstractEventLoop,
    prompt_tokens: int,
    decisions: int,
    block_size: int,
    num_idle_nodes: int,
) -> dict:
    nodes = {role: [f"127.0.0.1:{5000 + 10 * k + i}" for i in range(2)] for k, role in enumerate(("encoder", "prefill", "decode"))}
    epochs = {}
    for role, addresses in nodes.items():
        for address in addresses:
            node_id = f"{role}@{address}"
            epochs[node_id] = index.register_node(NodeInfo(node_id, role, address), ttl_s=600)
    for i in range(num_idle_nodes):
        role = ("encoder", "prefill", "decode")[i % 3]
        address = f"127.0.1.{1 + i // 250}:{6000 + i % 250}"
        index.register_node(NodeInfo(f"{role}@{address}", role, address), ttl_s=600)
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
    router = Router(Membership(reader), index=reader, block_size=block_size)
    route = loop.run_until_complete(router.route(tokens, [image]))
    assert route.prefill == nodes["prefill"][0] and route.encoder == nodes["encoder"][1], route
    expected = {nodes["prefill"][0]: len(hashes) * block_size, nodes["prefill"][1]: len(hashes) // 2 * block_size}
    assert route.prefix_tokens_by_node == {a: n for a, n in expected.items() if n}, route
    result = {"nodes": 6 + num_idle_nodes, "prompt_tokens": prompt_tokens, "blocks": len(hashes), "decisions": decisions}
    result.update(_timed(loop, lambda: router.route(tokens, [image]), decisions))
    result["hashes_given"] = _timed(loop, lambda: router.route(tokens, [image], block_hashes=hashes), decisions)
    return result


def _timed(loop: asyncio.AbstractEventLoop, decide: Callable[[], Coroutine], decisions: int) -> dict:
    for _ in range(min(50, decisions)):  # warm up: script cache, connection, allocator
        loop.run_until_complete(decide())
    times = []
    for _ in range(decisions):
        started = time.perf_counter()
        loop.run_until_complete(decide())
        times.append(time.perf_counter() - started)
    return {"p50_ms": ms(percentile(times, 0.50)), "p99_ms": ms(percentile(times, 0.99)), "mean_ms": statistics.mean(times) * 1e3}
