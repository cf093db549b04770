"""Elasticity: how fast a node joins, how fast a dead one leaves the rotation, and how many
requests a node loss costs, on a real `tessera serve` stack with two nodes of every role.

    tessera bench --suite elastic                           # tiny model, 16 streams per kill
    tessera bench --suite elastic --model small --streams 24 --max-tokens 64

Measured:
* join: an encoder started by hand with only --index-url; seconds from spawn to SERVING, to being
  listed by the gateway (/health), and to its first encode under a load of new images;
* kill: for each role, one node is SIGKILLed while streams flow (half streaming, half sent right
  after); requests failed (goal 0), requests retried and streams migrated (gateway /metrics
  deltas), and seconds from the kill to the gateway no longer listing the node (its heartbeat
  TTL lapses; the gateway stops *choosing* it after the first failed call, sooner).
Prints a table and writes JSON (default benchmarks/results/elastic.json).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import threading
import time
from pathlib import Path

import httpx
from openai import OpenAI

from benchmarks.suites.common import RESULTS, command, machine, write_json
from services.bench.local_stack import launch, stop_stack
from services.bench.workloads import image_url, synthetic_image, user_turn
from services.stack.node_process import free_port, start_node, wait_serving
from services.transport.index_access import PASSWORD_ENV
from services.transport.internal_auth import SECRET_ENV, InternalAuth
from services.transport.node_stats import read_stats

ROLES = ("decode", "prefill", "encoder", "preprocess")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--streams", type=int, default=16, help="streamed requests per kill (half flowing at the kill)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=RESULTS / "elastic.json")


class Stack:
    def __init__(self, model: str, workdir: Path) -> None:
        self.model = model
        self.state_file = workdir / "elastic-state.json"
        self.port = free_port()
        self.log = open(workdir / "elastic-stack.log", "w")
        roles = ["--preprocess", "2", "--encoders", "2", "--prefill", "2", "--decode", "2"]
        self.process = launch(model, self.port, ["--state-file", str(self.state_file), *roles, "--no-restart"], self.log)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("tessera serve exited early")
            if self.state_file.exists() and self.health_nodes() is not None:
                return
            time.sleep(0.5)
        raise RuntimeError("the stack did not start")

    def health_nodes(self) -> set[str] | None:
        try:
            reply = httpx.get(self.url + "/health", timeout=10)
        except httpx.HTTPError:
            return None
        return {n["address"] for n in reply.json()["nodes"]} if reply.status_code == 200 else None

    def state(self) -> dict:
        return json.loads(self.state_file.read_text())

    def counter(self, name: str) -> float:
        for line in httpx.get(self.url + "/metrics", timeout=30).text.splitlines():
            if line.startswith(f"tessera_{name} "):
                return float(line.split()[1])
        return 0.0

    def stop(self) -> None:
        stop_stack(self.process)
        self.log.close()


def _cases(seed: int, n: int) -> list[list[dict]]:
    """``n`` requests (message lists), each bringing an image of its own."""
    return [user_turn(image_url(synthetic_image(112, 112, seed=seed + i)), f"Question {i}: describe it.") for i in range(n)]


def _stream(client: OpenAI, model: str, messages: list[dict], max_tokens: int, flowing: threading.Semaphore, results: list) -> None:
    try:
        chunks = client.chat.completions.create(
            model=model, messages=messages, stream=True, temperature=0, max_tokens=max_tokens, extra_body={"ignore_eos": True}
        )
        first = True
        for chunk in chunks:
            if first and chunk.choices and chunk.choices[0].delta.content:
                flowing.release()
                first = False
        results.append(True)
    except Exception:
        flowing.release()
        results.append(False)


def _load(stack: Stack, model: str, cases, max_tokens: int, during=None) -> list[bool]:
    """Stream half the cases; once they all flow run ``during``, then stream the rest at once."""
    client = OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    results: list[bool] = []
    flowing = threading.Semaphore(0)
    half = len(cases) // 2
    threads = [threading.Thread(target=_stream, args=(client, model, c, max_tokens, flowing, results)) for c in cases]
    for thread in threads[:half]:
        thread.start()
    for _ in range(half):
        flowing.acquire(timeout=300)
    if during is not None:
        during()
    for thread in threads[half:]:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    return results


def measure_kill(stack: Stack, model: str, role: str, num_streams: int, max_tokens: int, seed: int) -> dict:
    victim = stack.state()["roles"][role]
    before = {n: stack.counter(n) for n in ("gateway_node_failures_total", "gateway_migrations_total")}
    killed_at: list[float] = []

    def kill() -> None:
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at.append(time.monotonic())

    results = _load(stack, model, _cases(seed, num_streams), max_tokens, during=kill)
    out_of_rotation = None
    while time.monotonic() - killed_at[0] < 60:
        nodes = stack.health_nodes() or set()
        if victim["grpc_address"] not in nodes:
            out_of_rotation = time.monotonic() - killed_at[0]
            break
        time.sleep(0.1)
    return {
        "role": role,
        "requests": len(results),
        "failed": results.count(False),
        "retried": stack.counter("gateway_node_failures_total") - before["gateway_node_failures_total"],
        "migrated": stack.counter("gateway_migrations_total") - before["gateway_migrations_total"],
        "kill_to_unlisted_s": out_of_rotation,
    }


def measure_join(stack: Stack, model: str, num_streams: int, max_tokens: int, workdir: Path) -> dict:
    log = open(workdir / "elastic-join.log", "w")
    spawned = time.monotonic()
    process, grpc_address = start_node("encoder", model=model, index_url=stack.state()["valkey"]["url"], log=log)
    try:
        wait_serving(grpc_address, 300, process)
        serving = time.monotonic() - spawned
        while grpc_address not in (stack.health_nodes() or set()):
            time.sleep(0.05)
        listed = time.monotonic() - spawned
        first_work: list[float] = []
        stop = threading.Event()

        def watch() -> None:
            auth = InternalAuth(os.environ[SECRET_ENV].encode())
            while not stop.is_set():
                if read_stats("encoder", grpc_address, auth, timeout_s=5).counters["encoder_items_encoded_total"] > 0:
                    first_work.append(time.monotonic() - spawned)
                    return
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        listed_at = time.monotonic()
        _load(stack, model, _cases(900, num_streams), max_tokens)
        stop.set()
        watcher.join()
        return {
            "spawn_to_serving_s": serving,
            "spawn_to_listed_s": listed,
            "listed_to_first_work_s": first_work[0] + spawned - listed_at if first_work else None,
            "spawn_to_first_work_s": first_work[0] if first_work else None,
        }
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def run(args: argparse.Namespace) -> int:
    # One secret and one index password for the stack and the node this script adds to it (the
    # launcher keeps configured ones).
    os.environ.setdefault(SECRET_ENV, secrets.token_urlsafe(32))
    os.environ.setdefault(PASSWORD_ENV, secrets.token_urlsafe(32))
    workdir = Path(os.environ.get("TMPDIR", "/tmp"))
    stack = Stack(args.model, workdir)
    try:
        join = measure_join(stack, args.model, args.streams, args.max_tokens, workdir)
        kills = [measure_kill(stack, args.model, role, args.streams, args.max_tokens, seed=100 * (i + 1)) for i, role in enumerate(ROLES)]
    finally:
        stack.stop()
    print(
        f"join (encoder): serving {join['spawn_to_serving_s']:.2f} s after spawn, listed {join['spawn_to_listed_s']:.2f} s, "
        f"first encode {join['spawn_to_first_work_s'] or float('nan'):.2f} s"
    )
    print(f"{'killed':<11}{'requests':>9}{'failed':>8}{'retried':>9}{'migrated':>10}{'unlisted after':>16}")
    for k in kills:
        unlisted = f"{k['kill_to_unlisted_s']:.2f} s" if k["kill_to_unlisted_s"] is not None else "-"
        print(f"{k['role']:<11}{k['requests']:>9}{k['failed']:>8}{k['retried']:>9.0f}{k['migrated']:>10.0f}{unlisted:>16}")
    failed = [k["failed"] for k in kills]
    result = {
        "command": command(args),
        "machine": machine(),
        "model": args.model,
        "streams_per_kill": args.streams,
        "max_tokens": args.max_tokens,
        "join": join,
        "kills": kills,
        "failed_per_kill_median": statistics.median(failed),
    }
    write_json(args.out, result)
    return 0
