"""Each process's share of the machine's CPUs: its OpenMP/torch thread count, wait policy and,
optionally, the cores it may run on.

Why: every role is its own process with its own OpenMP team. libgomp's default (ACTIVE) wait
policy keeps a team spinning on its cores after every parallel region; on a box where the
roles share cores, each team's spinning takes the cores the other roles are waiting to compute
on: changing the wait policy alone multiplied the one-command stack's throughput on 2 cores
(docs/benchmarks.md, "CPU shares").

The rule (the launcher applies it with ``plan_shares``; a lone node with ``share_for_this_node``):
  * wait policy PASSIVE everywhere: a waiting thread sleeps instead of spinning. An idle team then
    costs nothing, and a node under a CPU quota is not throttled for spinning.
  * threads: the compute roles (encoder, prefill, decode) split the CPUs evenly,
    ``max(1, num_cpus // num_compute_processes)`` each, since under load all of them compute at
    once. Preprocess (PIL and numpy, little torch) and the gateway get one thread.
  * except when the compute processes outnumber the cores (one thread each): every compute
    process then gets a thread per core. Their threads sleep when idle (PASSIVE), so a process
    computing alone has every core, and under load the OS shares them: a lone request's encode
    and prefill are faster, and loaded runs were no worse. Decode got its threads first: with one,
    every stream stuttered while an image was encoded beside it (docs/benchmarks.md,
    "A thread per core for every compute process").
  * CPUs: what this process may use, the fewest of its affinity mask and its cgroup CPU quota
    (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), so a pod limited to 2 CPUs on a 64-core
    node runs 2 threads, not 64.
  * affinity (opt-in): when the compute shares fit the CPUs without overlap, each compute process
    is pinned to its own cores, which keeps its caches warm; oversubscribed, nothing is pinned.
Operator settings win: a variable already in the environment (``OMP_NUM_THREADS``,
``OMP_WAIT_POLICY``) is never overridden.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

COMPUTE_ROLES = frozenset({"encoder", "prefill", "decode"})
AFFINITY_VAR = "TESSERA_CPU_AFFINITY"  # comma-separated core ids a process pins itself to


@dataclass(frozen=True, slots=True)
class CpuShare:
    num_threads: int
    wait_policy: str = "PASSIVE"
    cpus: tuple[int, ...] | None = None  # cores to pin to; None: no pinning

    def to_env(self) -> dict[str, str]:
        """The variables a child process reads at startup (OpenMP reads them as it loads)."""
        env = {"OMP_NUM_THREADS": str(self.num_threads), "MKL_NUM_THREADS": str(self.num_threads), "OMP_WAIT_POLICY": self.wait_policy}
        if self.cpus is not None:
            env[AFFINITY_VAR] = ",".join(str(cpu) for cpu in self.cpus)
        return env


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (e.g. 1.5), or None when unlimited."""
    v2 = root / "cpu.max"
    if v2.exists():
        quota, _, period = v2.read_text().strip().partition(" ")
        if quota == "max" or not period:
            return None
        return int(quota) / int(period)
    quota_file, period_file = root / "cpu" / "cpu.cfs_quota_us", root / "cpu" / "cpu.cfs_period_us"
    if quota_file.exists() and period_file.exists():
        quota_us = int(quota_file.read_text().strip())
        return None if quota_us <= 0 else quota_us / int(period_file.read_text().strip())
    return None


def available_cpus(*, affinity: Sequence[int] | None = None, limit: float | None = None) -> int:
    """Whole CPUs this process may use: its affinity mask, capped by its cgroup quota (rounded
    down, at least 1: a 1.5-CPU quota runs one thread, not two that get throttled)."""
    num_cpus = len(affinity if affinity is not None else os.sched_getaffinity(0))
    if limit is not None:
        num_cpus = min(num_cpus, max(1, math.floor(limit)))
    return max(1, num_cpus)


def plan_shares(role_of_process: Mapping[str, str], cpus: Sequence[int], *, pin: bool = False) -> dict[str, CpuShare]:
    """Process name -> its share, for processes colocated on ``cpus``."""
    compute = [name for name, role in role_of_process.items() if role in COMPUTE_ROLES]
    num_threads = max(1, len(cpus) // max(1, len(compute)))
    fits = pin and len(compute) * num_threads <= len(cpus)
    shares = {}
    for name, role in role_of_process.items():
        if role not in COMPUTE_ROLES:
            shares[name] = CpuShare(num_threads=1)
            continue
        slot = compute.index(name)
        pinned = tuple(cpus[slot * num_threads : (slot + 1) * num_threads]) if fits else None
        shared_cores = not fits and cores_shared(len(compute), len(cpus))
        shares[name] = CpuShare(num_threads=len(cpus) if shared_cores else num_threads, cpus=pinned)
    return shares


def cores_shared(num_compute_processes: int, num_cpus: int) -> bool:
    """Whether colocated compute processes outnumber the cores: each then gets every core (the
    rule above), and whatever two of them compute at once runs on the same cores."""
    return num_compute_processes > num_cpus


def share_for_this_node(role: str, env: Mapping[str, str] = os.environ) -> CpuShare:
    """A node's share when no launcher assigned one: all the CPUs its quota allows, or one thread
    for a non-compute role; variables already set in ``env`` win."""
    default_threads = available_cpus(limit=cgroup_cpu_limit()) if role in COMPUTE_ROLES else 1
    num_threads = _positive_int(env.get("OMP_NUM_THREADS")) or default_threads
    cpus = tuple(int(cpu) for cpu in env[AFFINITY_VAR].split(",")) if env.get(AFFINITY_VAR) else None
    return CpuShare(num_threads=num_threads, wait_policy=env.get("OMP_WAIT_POLICY", "PASSIVE"), cpus=cpus)


def apply_before_torch(share: CpuShare, env: dict[str, str] | os._Environ = os.environ) -> None:
    """Put ``share`` into effect in this process. Must run before torch is imported: libgomp reads
    OMP_* once, as it loads. Pins the process when the share names cores."""
    for key, value in share.to_env().items():
        env.setdefault(key, value)
    if share.cpus is not None:
        os.sched_setaffinity(0, share.cpus)


def apply_torch_threads(share: CpuShare) -> None:
    """torch's intra-op pool, once torch is loaded (OMP_NUM_THREADS sizes it too; this also covers
    a torch imported before ``apply_before_torch`` ran)."""
    import torch

    if torch.get_num_threads() != share.num_threads:
        torch.set_num_threads(share.num_threads)


def _positive_int(value: str | None) -> int | None:
    try:
        number = int(value) if value else None
    except ValueError:
        return None
    return number if number is not None and number > 0 else None
