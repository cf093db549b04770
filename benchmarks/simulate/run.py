"""One simulation run: one routing policy on a cluster of ``nodes`` modelled nodes, against a real
index (a fresh Redis/Valkey namespace) and the real router.

Roles: a third of the nodes are encoders, a third decode nodes, the rest prefill nodes (which may
encode images themselves: adaptive dispatch). Sessions start as a Poisson process whose rate makes
the offered load ``rate_per_node`` turns per virtual second per node, so every cluster size runs
at the same load per node and, with a workload scaled by the node count (the suite scales the
sessions and the image catalogue), the same work per node: what changes with the node count is
the cluster's width, which is what the index and the router must not pay for.

Every node heartbeats its load every ``heartbeat_s`` and the gateway's membership lists the live
nodes every ``refresh_s`` (both virtual; the router also lists them at once when a lookup sees the
membership version move). Churn, spread over the middle 80% of the sessions' arrivals: for each
of join, kill and drain, ``churn`` times the node count events (at least one when ``churn`` > 0),
on the roles in turn, never taking a role's last live node.

Policies: ``cache_aware`` (Router with cache lookups and the configured encode dispatch),
``round_robin`` (Router without cache lookups, the classic baseline: the index serves membership
only, so no prefix pulls either), ``llmd`` (services/router/policies.py, LlmdPolicy). After the run, the router's last
lookups are replayed alone (cache_aware only) to give a lookup's own server work.

The router and the membership are asyncio-native (they await an IndexReader); here they read the
run's synchronous indexes through LocalReader, and a run drives each awaited call to completion on
one event loop of its own (see ``simulate``).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from benchmarks.simulate.cluster import ROLES, Capacities, Cluster, Costs, SimNode
from benchmarks.simulate.events import EventQueue
from benchmarks.simulate.index_stats import ServerStats, delta, named_url, top_commands
from benchmarks.simulate.metrics import Metrics
from benchmarks.simulate.request_path import Request, RequestPath
from benchmarks.simulate.workload import Session, WorkloadConfig, sessions
from services.router.membership import Membership
from services.router.pending_encodes import PendingEncodes
from services.router.policies import make_policy
from services.router.router import Router
from shared.index.backend import create_index
from shared.index.reader import LocalReader

POLICIES = ("cache_aware", "round_robin", "llmd")


@dataclass(frozen=True, slots=True)
class RunConfig:
    policy: str
    nodes: int
    workload: WorkloadConfig
    costs: Costs = Costs()
    capacities: Capacities = Capacities()
    churn: float = 0.03
    heartbeat_s: float = 5.0 / 3  # the publisher's ttl/3 at the default 5 s TTL
    refresh_s: float = 1.0  # Membership's default
    encode_dispatch: str = "adaptive"
    llmd_lru_blocks: int = Capacities().kv_blocks
    lookups_replayed: int = 200


def split_roles(nodes: int) -> dict[str, int]:
    if nodes < 3:
        raise ValueError("a cluster needs at least 3 nodes (one per role)")
    return {"encoder": nodes // 3, "prefill": nodes - 2 * (nodes // 3), "decode": nodes // 3}


@dataclass(slots=True)
class _Churn:
    joins: int = 0
    kills: int = 0
    drains: int = 0
    retired: list[str] = field(default_factory=list)


def simulate(config: RunConfig, index_url: str) -> dict:
    if config.policy not in POLICIES:
        raise ValueError(f"unknown policy {config.policy!r}; choose one of {', '.join(POLICIES)}")
    namespace = f"simulate-{config.policy}-{config.nodes}-{config.workload.seed}"
    stats = ServerStats(index_url)
    indexes = {client: create_index(named_url(index_url, client), namespace=namespace) for client in ("router", "nodes", "membership")}
    # The simulator is a discrete-event loop of its own, not the gateway's event loop: each of the
    # router's and the membership's coroutines is run to completion where the sync code called it,
    # on one loop the run owns (not asyncio.run per call, which would build and tear down a loop
    # each decision and add that to the decision's wall-clock time). Their reads go through
    # LocalReader to the run's sync indexes (a Redis one blocks the loop while it waits: harmless
    # here, where nothing else runs on the loop and the decision is timed on the wall clock).
    loop = asyncio.new_event_loop()
    try:
        return _Run(config, indexes, stats, loop).run()
    finally:
        loop.close()
        for index in indexes.values():
            index.close()
        stats.close()


class _Run:
    def __init__(self, config: RunConfig, indexes: dict, stats: ServerStats, loop: asyncio.AbstractEventLoop) -> None:
        self.config, self.stats, self.loop = config, stats, loop
        self.events = EventQueue()
        self.roles = split_roles(config.nodes)
        self.memory_before = stats.snapshot()["used_memory"]
        self.cluster = Cluster(indexes["nodes"], config.capacities)
        for role in ROLES:
            for _ in range(self.roles[role]):
                self.cluster.add(role)
        self.membership = Membership(LocalReader(indexes["membership"]), clock=lambda: self.events.now)
        self.loop.run_until_complete(self.membership.refresh())
        self.lookup_index = indexes["router"]  # the router reads it through a LocalReader; the replay directly
        self.policy = self._policy()
        self.lookup_index.lookup([], [])  # a warm gateway: connection open, lookup script loaded
        self.metrics = Metrics(config.workload.block_size)
        self.path = RequestPath(
            self.events,
            self.cluster,
            self.policy,
            self.membership,
            config.costs,
            self.metrics,
            self._done,
            self.loop,
            lookups_kept=config.lookups_replayed,
        )
        self.churn = _Churn()
        self.sessions_left = config.workload.sessions
        self.steady: tuple[dict, int, float] | None = None  # (index stats, requests, virtual time) at the last arrival
        self._rng = random.Random(f"simulate/{config.workload.seed}/churn")

    def _policy(self):
        config, block_size = self.config, self.config.workload.block_size
        policy = make_policy(config.policy, llmd_lru_blocks=config.llmd_lru_blocks)
        index = LocalReader(self.lookup_index) if config.policy == "cache_aware" else None
        # llm-d's scheduler has no adaptive dispatch: its images stay on the encoder tier.
        dispatch = "encoder" if config.policy == "llmd" else config.encode_dispatch
        pending = PendingEncodes(clock=lambda: self.events.now)
        return Router(self.membership, policy, index, block_size=block_size, encode_dispatch=dispatch, pending_encodes=pending)

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> dict:
        config, events = self.config, self.events
        arrivals = sessions(config.workload)
        self._next_session(arrivals)
        for node in self.cluster.nodes.values():
            events.at(self._rng.uniform(0, config.heartbeat_s), self._heartbeat, node)
        events.at(config.refresh_s, self._refresh)
        self._schedule_churn()
        before = self.stats.snapshot()
        started = time.perf_counter()
        workload = config.workload
        max_time_s = 10 * workload.sessions / workload.session_rate + 3600.0
        finished = events.run(
            lambda: self.sessions_left == 0, max_events=5_000 * max(1, workload.sessions * workload.max_turns), max_time_s=max_time_s
        )
        wall_s = time.perf_counter() - started
        after = self.stats.snapshot()
        result = {"policy": config.policy, "nodes": config.nodes, "roles": self.roles, "finished": finished, "wall_s": wall_s}
        result.update(self.metrics.summary(config.costs, events.now, self.roles, self.cluster.nodes.values()))
        requests = self.metrics.requests
        result["unfinished"] = requests - self.metrics.completed - self.metrics.lost  # 0 unless a bound stopped the run
        result["index"] = delta(before, after, requests)
        result["index"]["top_commands_per_request"] = top_commands(before, after, requests)
        result["index"]["heartbeats_per_request"] = self.cluster.num_heartbeats / max(1, requests)
        result["index"]["publishes_per_request"] = self.cluster.num_publishes / max(1, requests)
        if self.steady is not None:
            snapshot, num_requests, until_s = self.steady
            result["index_steady"] = delta(before, snapshot, num_requests) | {"requests": num_requests, "until_s": until_s}
        entries = self.cluster.num_kv_entries + self.cluster.num_mm_entries
        used = after["used_memory"] - self.memory_before
        result["index_memory"] = {
            "used_bytes": used,
            "kv_entries": self.cluster.num_kv_entries,
            "mm_entries": self.cluster.num_mm_entries,
            "mib_per_million_entries": used / entries * 1e6 / 2**20 if entries else None,
        }
        result["churn"] = {"joins": self.churn.joins, "kills": self.churn.kills, "drains": self.churn.drains}
        result["lookup"] = self._replay_lookups() if config.policy == "cache_aware" else None
        return result

    def _replay_lookups(self) -> dict:
        """The router's last lookups again, alone: a lookup's own server work and bytes."""
        recent = list(self.path.recent)
        before = self.stats.snapshot()
        started = time.perf_counter()
        holders = dict.fromkeys(ROLES, 0)
        for mm_hashes, block_hashes in recent:
            for state in self.membership.resolve(self.lookup_index.lookup(mm_hashes, block_hashes).node_to_epoch).values():
                holders[state.info.role] += 1
        wall_s = time.perf_counter() - started
        work = delta(before, self.stats.snapshot(), len(recent))
        client = work["by_client"]["router"]
        return {
            "lookups": len(recent),
            "server_commands": work["server_commands"],
            "server_usec": work["server_usec"],
            "bytes_in": client["bytes_in"],
            "bytes_out": client["bytes_out"],
            "wall_ms": wall_s / max(1, len(recent)) * 1e3,
            "holders": {role: n / max(1, len(recent)) for role, n in holders.items()},  # nodes a lookup names
        }

    # -- sessions -----------------------------------------------------------------------------------
    def _next_session(self, arrivals) -> None:
        session = next(arrivals, None)
        if session is not None:
            self.events.at(session.start_s, self._start_session, session, arrivals)

    def _start_session(self, session: Session, arrivals) -> None:
        self._next_session(arrivals)
        self._start_turn(session)
        if session.number == self.config.workload.sessions - 1:
            self._arrivals_end()

    def _arrivals_end(self) -> None:
        """The window of steady load ends with the last session's arrival: its index work per
        request leaves out the run's tail, where the longest sessions finish while every node
        still heartbeats (node-seconds, not requests, and a longer tail the more sessions)."""
        self.steady = (self.stats.snapshot(), self.metrics.requests, self.events.now)

    def _start_turn(self, session: Session) -> None:
        turn = session.next_turn()
        if turn is None:
            self.sessions_left -= 1
            return
        self.path.start(Request(turn, session, self.events.now))

    def _done(self, request: Request, completed: bool) -> None:
        if not completed:  # lost: the session ends with it
            self.sessions_left -= 1
            return
        self.events.after(request.turn.think_s, self._start_turn, request.session)

    # -- the cluster's own events ---------------------------------------------------------------
    def _heartbeat(self, node: SimNode) -> None:
        if node.serving:
            self.cluster.heartbeat(node)
            self.events.after(self.config.heartbeat_s, self._heartbeat, node)

    def _refresh(self) -> None:
        self.loop.run_until_complete(self.membership.refresh())
        self.events.after(self.config.refresh_s, self._refresh)

    def _schedule_churn(self) -> None:
        config = self.config
        if config.churn <= 0:
            return
        count = max(1, round(config.churn * config.nodes))
        span = config.workload.sessions / config.workload.session_rate
        role_turns = 0
        for kind in ("join", "kill", "drain"):
            for i in range(count):
                when = span * (0.1 + 0.8 * (i + self._rng.random()) / count)
                self.events.at(when, self._churn_event, kind, ROLES[role_turns % len(ROLES)])
                role_turns += 1

    def _churn_event(self, kind: str, role: str) -> None:
        if kind == "join":
            node = self.cluster.add(role)
            self.churn.joins += 1
            self.events.after(self._rng.uniform(0, self.config.heartbeat_s), self._heartbeat, node)
            return
        live = self.cluster.live(role)
        if len(live) < 2:
            return
        node = self._rng.choice(live)
        if kind == "kill":
            self.path.kill(node)
            self.churn.kills += 1
        else:
            self.cluster.drain(node)
            self.cluster.retire(node)
            self.churn.drains += 1
