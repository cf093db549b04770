"""Which nodes of each role the gateway may use.

With an index, the live node records *are* the cluster: a refresh task on the event loop
(``refresh_s``) lists them (``update``), and at once when a lookup reports a new membership version
(``note_version``: a node joined or left, so the next request sees it; only the changed nodes'
records are read). Lookups thus never list the cluster, and cost the same at 4 nodes or 500;
each role's nodes are kept sorted between listings, so reading them costs that role's size, not
the cluster's.
Through an index outage the last-known set is kept; so is a role's last-known set for ``keep_s``
when an index that answers lists none of its nodes (a restarted, empty index, before the nodes
have registered again). Without an index, a static address list per role stands in.

A node that failed a call is quarantined for ``quarantine_s`` (about the heartbeat TTL, after
which its record lapses anyway if it is dead), so other requests stop choosing it at once, not
when its TTL runs out; a node that registers again (a new epoch, a restart) is out of quarantine
at once.

It lives on the gateway's event loop: its reads of the index are awaited (shared/index/reader.py),
and everything else is plain code that no other thread touches, so it takes no lock.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from shared.index.reader import IndexReader
from shared.index.types import IndexUnavailableError, NodeInfo, NodeState

log = logging.getLogger("tessera.membership")
ROUTED_ROLES = ("preprocess", "encoder", "prefill", "decode")


@dataclass(slots=True)
class NodeWork:
    """This gateway's work in flight on one node: exact and current, where a heartbeat's load is
    up to a TTL/3 old (scoring.py weighs each)."""

    num_calls: int = 0  # requests routed there whose call there has not ended
    num_local_encodes: int = 0  # a prefill node's encodes of its own requests' images
    num_pending_tokens: int = 0  # prompt tokens routed to a prefill node, not yet prefilled
    num_encode_tokens: int = 0  # image tokens sent to an encoder to encode, not yet encoded

    def add(self, other: NodeWork, sign: int = 1) -> None:
        self.num_calls += sign * other.num_calls
        self.num_local_encodes += sign * other.num_local_encodes
        self.num_pending_tokens += sign * other.num_pending_tokens
        self.num_encode_tokens += sign * other.num_encode_tokens


class Membership:
    def __init__(
        self,
        index: IndexReader | None,
        static: Mapping[str, tuple[str, ...]] | None = None,
        *,
        refresh_s: float = 1.0,
        quarantine_s: float = 5.0,
        keep_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if index is None and not static:
            raise ValueError("membership needs an index or static address lists")
        self.index = index
        self.refresh_s = refresh_s
        self.quarantine_s = quarantine_s
        self.keep_s = keep_s
        self._role_to_last_seen: dict[str, float] = {}
        self._clock = clock
        self._nodes: dict[str, NodeState] = {}
        self._role_to_nodes: dict[str, tuple[NodeState, ...]] = {}  # sorted by address; rebuilt on change
        self._role_to_address_to_node: dict[str, dict[str, NodeState]] = {}  # the same nodes, by address
        if static:
            for role, addresses in static.items():
                for address in addresses:
                    node_id = f"{role}@{address}"
                    self._nodes[node_id] = NodeState(NodeInfo(node_id, role, address), 0, 0.0, 0.0)
        self._index_roles()
        self._address_to_quarantine: dict[str, tuple[float, int]] = {}  # until, epoch at failure
        self._address_to_work: dict[str, NodeWork] = {}  # this gateway's own work
        self.num_refresh_failures = 0
        self._membership_version: int | None = None
        self._task: asyncio.Task | None = None

    # -- reading ------------------------------------------------------------------------------
    def nodes(self, role: str, *, exclude: frozenset[str] = frozenset()) -> list[NodeState]:
        """Live nodes of ``role`` not in ``exclude`` (gRPC addresses); quarantined ones only when
        nothing else is left."""
        now = self._clock()
        candidates = [s for s in self._role_to_nodes.get(role, ()) if s.info.grpc_address not in exclude]
        healthy = [s for s in candidates if not self._quarantined(s, now)] if self._address_to_quarantine else candidates
        return healthy or candidates

    def sample(self, role: str, *, exclude: frozenset[str], holders: Collection[str], k: int, rng: random.Random) -> list[NodeState] | None:
        """For a role of more than ``k`` nodes: its usable nodes among ``holders`` (addresses,
        in address order), then ``k`` other usable ones drawn at random, where usable means not
        in ``exclude`` and not in quarantine. Its cost is O(holders + k + exclusions), not the
        role's size: the draw takes k indices plus one per node it may have to skip. None when
        the role has ``k`` nodes or fewer, or nothing usable was found (then ``nodes``, which
        falls back on quarantined nodes)."""
        now = self._clock()
        nodes = self._role_to_nodes.get(role, ())
        if len(nodes) <= k:
            return None
        by_address = self._role_to_address_to_node[role]

        def usable(state: NodeState) -> bool:
            return state.info.grpc_address not in exclude and not self._quarantined(state, now)

        held = sorted((by_address[a] for a in holders if a in by_address and usable(by_address[a])), key=lambda s: s.info.grpc_address)
        held_addresses = {s.info.grpc_address for s in held}
        num_draws = min(len(nodes), k + len(exclude) + len(self._address_to_quarantine) + len(held_addresses))
        drawn = (nodes[i] for i in rng.sample(range(len(nodes)), num_draws))
        others = [s for s in drawn if s.info.grpc_address not in held_addresses and usable(s)][:k]
        return held + others if held or others else None

    def resolve(self, node_to_epoch: Mapping[str, int]) -> dict[str, NodeState]:
        """The member records of the nodes an index lookup named (id -> the epoch their entries
        carry), those whose member record has that epoch: a name the membership does not hold
        (a record that failed its seal or disagrees with the cluster's settings, a node pruned
        or restarted since) is credited with nothing."""
        return {n: s for n, epoch in node_to_epoch.items() if (s := self._nodes.get(n)) is not None and s.epoch == epoch}

    def find(self, address: str) -> NodeState | None:
        return next((s for s in self._nodes.values() if s.info.grpc_address == address), None)

    def snapshot(self) -> dict[str, NodeState]:
        return dict(self._nodes)

    # -- updating -----------------------------------------------------------------------------
    def update(self, live: Mapping[str, NodeState]) -> None:
        """The index's current live nodes (from a lookup or a refresh)."""
        now = self._clock()
        listed_roles = {s.info.role for s in live.values()}
        kept = {
            node_id: state
            for node_id, state in self._nodes.items()
            if state.info.role not in listed_roles and now - self._role_to_last_seen.get(state.info.role, now) < self.keep_s
        }
        for role in listed_roles:
            self._role_to_last_seen[role] = now
        self._nodes = {**kept, **live}
        self._index_roles()

    def _index_roles(self) -> None:
        role_to_nodes: dict[str, list[NodeState]] = {}
        for state in self._nodes.values():
            role_to_nodes.setdefault(state.info.role, []).append(state)
        self._role_to_nodes = {role: tuple(sorted(nodes, key=lambda s: s.info.grpc_address)) for role, nodes in role_to_nodes.items()}
        self._role_to_address_to_node = {role: {s.info.grpc_address: s for s in nodes} for role, nodes in role_to_nodes.items()}

    async def note_version(self, version: int) -> None:
        """The membership version a lookup saw. A new one (a node joined or left) updates the
        nodes now, before the caller's decision, so a joiner is a candidate for the very next request:
        from the index's log of changes, reading only the changed nodes' records (churn in a
        cluster of N nodes would otherwise cost N records per join, kill or drain), or by
        listing them all when the log no longer reaches back to the version known."""
        known = self._membership_version
        if version == known:
            return
        self._membership_version = version
        if known is None or not await self._apply_changes(known):
            await self.refresh()

    async def _apply_changes(self, since: int) -> bool:
        assert self.index is not None
        try:
            changes = await self.index.membership_changes(since)
        except IndexUnavailableError:
            return False
        if changes is None:
            return False
        for node_id in changes.gone:
            self._nodes.pop(node_id, None)
        self._nodes.update(changes.nodes)
        self._index_roles()
        self._membership_version = max(self._membership_version or 0, changes.version)
        return True

    def num_in_flight(self, address: str) -> int:
        """This gateway's calls on ``address`` not yet ended."""
        return self.work_on(address).num_calls

    def work_on(self, address: str) -> NodeWork:
        """A copy of this gateway's work in flight on ``address``."""
        work = self._address_to_work.get(address)
        return NodeWork() if work is None else replace(work)

    def in_flight(
        self,
        *addresses: str,
        local_encodes: Iterable[str] = (),
        pending_tokens: Mapping[str, int] | None = None,
        encode_tokens: Mapping[str, int] | None = None,
    ) -> InFlight:
        """Count this gateway's work until released (a load signal): a call on each of
        ``addresses``, a local encode on each of ``local_encodes``, ``pending_tokens`` (address
        -> prompt tokens to prefill there) and ``encode_tokens`` (address -> image tokens to
        encode there). Use it as a context manager, or release it by hand when the work ends
        elsewhere."""
        counted: dict[str, NodeWork] = {}
        for address in addresses:
            counted.setdefault(address, NodeWork()).num_calls += 1
        for address in local_encodes:
            counted.setdefault(address, NodeWork()).num_local_encodes += 1
        for address, num_tokens in (pending_tokens or {}).items():
            counted.setdefault(address, NodeWork()).num_pending_tokens += num_tokens
        for address, num_tokens in (encode_tokens or {}).items():
            counted.setdefault(address, NodeWork()).num_encode_tokens += num_tokens
        self._count(counted, 1)
        return InFlight(self, counted)

    def _count(self, counted: Mapping[str, NodeWork], sign: int) -> None:
        for address, work in counted.items():
            self._address_to_work.setdefault(address, NodeWork()).add(work, sign)

    def report_failure(self, address: str) -> None:
        state = self.find(address)
        now = self._clock()
        # Quarantines already served end here, so the map holds only current ones (``sample``
        # draws one extra node per entry).
        self._address_to_quarantine = {a: entry for a, entry in self._address_to_quarantine.items() if entry[0] > now}
        self._address_to_quarantine[address] = (now + self.quarantine_s, state.epoch if state else 0)

    async def refresh(self) -> bool:
        if self.index is None:
            return True
        try:
            live = await self.index.live_nodes()
        except IndexUnavailableError as exc:
            self.num_refresh_failures += 1
            log.warning("index unreachable (%s); keeping the last-known %d nodes", exc, len(self._nodes))
            return False
        self.update(live)
        return True

    async def start(self) -> None:
        """List the nodes, then keep refreshing them every ``refresh_s`` on this event loop."""
        if self.index is None:
            return
        await self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="membership-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:  # until stop() cancels it
            await asyncio.sleep(self.refresh_s)
            await self.refresh()

    def _quarantined(self, state: NodeState, now: float) -> bool:
        entry = self._address_to_quarantine.get(state.info.grpc_address)
        if entry is None:
            return False
        until, epoch = entry
        if now >= until or state.epoch > epoch:  # served its time, or restarted since it failed
            self._address_to_quarantine.pop(state.info.grpc_address, None)
            return False
        return True


class InFlight:
    """This gateway's count of one piece of work on some nodes; released once, however often
    ``release`` is called (a with-block's exit and a failure path may both do it)."""

    __slots__ = ("_counted", "_membership")

    def __init__(self, membership: Membership, counted: Mapping[str, NodeWork]) -> None:
        self._membership: Membership | None = membership
        self._counted = counted

    def release(self) -> None:
        membership, self._membership = self._membership, None
        if membership is not None:
            membership._count(self._counted, -1)

    def __enter__(self) -> InFlight:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
