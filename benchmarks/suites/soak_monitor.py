"""What the soak benchmark samples every few seconds, on a thread of its own so that the traffic's
event loop cannot delay it: the RSS of every stack process (VmRSS from /proc; pids from
``tessera serve --state-file``, re-read each time, so a restarted role is seen) and the cache
gauges of every node (shared/cache_gauges.py, read with each node's Stats RPC: per node, where
the gateway's /metrics only has the cluster's sums). Stats is an internal call: it carries the
token derived from TESSERA_INTERNAL_SECRET, which must be the stack's own secret.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from services.transport.internal_auth import InternalAuth, InternalPlaneSettings
from services.transport.internal_channel import ROLE_TO_STUB
from services.transport.node_stats import read_stats
from shared.cache_gauges import CacheUsage, cache_usage


@dataclass(slots=True)
class Sample:
    t_s: float  # from the run's start
    rss_bytes: dict[str, int]  # process name -> resident set
    caches: dict[str, CacheUsage]  # "<node>/<cache>" -> occupancy and budget
    num_restarts: int  # roles and Valkey restarted so far, per the state file


def read_rss_bytes(pid: int) -> int | None:
    """VmRSS of ``pid``; None once it has exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None  # a zombie has no VmRSS line


def stack_pids(state: dict, launcher_pid: int | None) -> dict[str, int]:
    """Process name -> pid: every role by its stack name (``encoder``, ``encoder-1``, ...,
    ``gateway``), ``valkey``, and the ``launcher`` when this script started it."""
    pids = {name: role["pid"] for name, role in state["roles"].items() if role.get("pid")}
    if state.get("valkey", {}).get("pid"):
        pids["valkey"] = state["valkey"]["pid"]
    if launcher_pid is not None:
        pids["launcher"] = launcher_pid
    return pids


def num_restarts(state: dict) -> int:
    return sum(role.get("restarts", 0) for role in state["roles"].values()) + state.get("valkey", {}).get("restarts", 0)


@dataclass(slots=True)
class Monitor:
    state_file: Path
    launcher_pid: int | None
    interval_s: float
    t0: float  # time.monotonic() at the run's start
    samples: list[Sample] = field(default_factory=list)
    num_sample_errors: int = 0
    first_sample_error: str | None = None
    _auth: InternalAuth = field(default_factory=lambda: InternalAuth.from_settings(InternalPlaneSettings()))
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="soak-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling, then take one last sample (the run's end)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.samples.append(self.sample())

    def _run(self) -> None:
        while True:
            try:
                self.samples.append(self.sample())
            except (OSError, ValueError, KeyError) as exc:  # a state file mid-rewrite: skip this sample, not the rest
                self.num_sample_errors += 1
                self.first_sample_error = self.first_sample_error or f"sample: {exc!r}"
            if self._stop.wait(self.interval_s):
                return

    def sample(self) -> Sample:
        state = json.loads(self.state_file.read_text())  # replaced atomically by the launcher
        rss = {name: read_rss_bytes(pid) for name, pid in stack_pids(state, self.launcher_pid).items()}
        caches: dict[str, CacheUsage] = {}
        for name, role in state["roles"].items():
            role_name = name.split("-")[0]
            if role_name not in ROLE_TO_STUB:
                continue  # the gateway: no caches of its own
            for usage in cache_usage(self._gauges(role_name, role["grpc_address"])):
                caches[f"{name}/{usage.cache}"] = usage
        return Sample(time.monotonic() - self.t0, {n: b for n, b in rss.items() if b is not None}, caches, num_restarts(state))

    def _gauges(self, role: str, address: str) -> dict[str, float]:
        try:
            return dict(read_stats(role, address, self._auth, timeout_s=5).gauges)
        except grpc.RpcError as exc:  # a node restarting, or a secret that is not the stack's
            self.num_sample_errors += 1
            self.first_sample_error = self.first_sample_error or f"{address}: {exc.code().name} {exc.details()}"
            return {}
