"""One request's way through the modelled cluster, as services/gateway/pipeline/pipeline.py takes it.

route (real: Router.route or the llm-d scorer, reserve=True, run to completion on the run's
event loop and timed on the wall clock) -> images
the prefill node lacks: those the route sends to the prefill node's own tower are encoded there,
the others are shipped by the holder the route names for each (``Route.image_to_source``: an
encoder or a prefill node, once any tower pass of it there ends) or come from the route's
encoder, which ships those it holds and runs the tower on the rest (an image already in a tower
pass there is waited for, not encoded again) -> prefill: the prompt's
tokens past the longest prefix the node holds, or that a peer named by the route holds when
services/prefill/kv_pull.py's cost model says pulling beats recomputing -> the reservation is
released, the decode node takes the prompt's KV and decodes the reply in its batch.

Failover as the gateway does it: a call to a node that is dead or draining fails after
``failed_call_s``; so does every stage of every request on a node when it is killed. The node is
reported to the membership (quarantined), excluded for this request, and the request is routed
again. A request past its first token whose decode node dies is migrated: routed again, its
prompt's blocks now cached. When a role has no live node left, the request tries again a second
later (a client's retry). After ``max_attempts`` routings it counts as lost.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks.simulate.cluster import Cluster, Costs, SimNode
from benchmarks.simulate.events import EventQueue
from benchmarks.simulate.metrics import Metrics
from benchmarks.simulate.workload import Session, Turn
from services.router.membership import InFlight, Membership
from services.router.route import NoLiveNodeError, Route
from shared.types import BlockHash, MmHash

MAX_BATCH = 256  # EngineConfig.max_num_seqs


@dataclass(eq=False, slots=True)
class Request:
    turn: Turn
    session: Session
    arrival_s: float
    token: int = 0  # bumped by every new attempt and failure: events of an older one are stale
    attempts: int = 0
    excluded: set[str] = field(default_factory=set)
    route: Route | None = None
    decode_hold: InFlight | None = None
    on_nodes: list[SimNode] = field(default_factory=list)  # nodes whose work includes this request
    first_token_s: float | None = None
    remaining: int = 0  # reply tokens still to decode


class RequestPath:
    def __init__(
        self,
        events: EventQueue,
        cluster: Cluster,
        policy,  # the Router, with any policy (the llm-d baseline too)
        membership: Membership,
        costs: Costs,
        metrics: Metrics,
        on_done: Callable[[Request, bool], None],
        loop: asyncio.AbstractEventLoop,  # the run's: Router.route is a coroutine, awaited nowhere else here
        *,
        max_attempts: int = 20,
        lookups_kept: int = 200,
    ) -> None:
        self.events, self.cluster, self.policy, self.membership = events, cluster, policy, membership
        self.costs, self.metrics, self.on_done, self.max_attempts = costs, metrics, on_done, max_attempts
        self.loop = loop
        self.block_size = metrics.block_size
        self._encoded_once: set[MmHash] = set()
        self.recent: deque[tuple[list[MmHash], list[BlockHash]]] = deque(maxlen=lookups_kept)  # for a replay of lookups

    def start(self, request: Request) -> None:
        turn, metrics = request.turn, self.metrics
        metrics.requests += 1
        metrics.prompt_tokens += len(turn.token_ids)
        metrics.image_uses += len({h for h, _ in turn.images})
        metrics.distinct_images.update(h for h, _ in turn.images)
        self._attempt(request)

    # -- stages -----------------------------------------------------------------------------------
    def _attempt(self, request: Request) -> None:
        if request.attempts >= self.max_attempts:
            self.metrics.lost += 1
            self.on_done(request, False)
            return
        request.attempts += 1
        request.token += 1
        turn = request.turn
        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            route = self.loop.run_until_complete(
                self.policy.route(
                    turn.token_ids, turn.images, None, block_hashes=turn.block_hashes, exclude=frozenset(request.excluded), reserve=True
                )
            )
        except NoLiveNodeError:
            self.metrics.no_node_waits += 1
            self.events.after(1.0, self._attempt, request)
            return
        self.metrics.decision_s.append(time.perf_counter() - started)
        self.metrics.decision_cpu_s.append(time.thread_time() - cpu_started)
        self.recent.append(([h for h, _ in turn.images], turn.block_hashes))
        request.route = route
        prefill = self._serving(route.prefill)
        if prefill is None:
            return self._fail(request, route.prefill)
        lacking = [h for h in dict.fromkeys(h for h, _ in turn.images) if h not in prefill.mm]
        ready = self.events.now
        from_encoder = []
        for h in lacking:
            if h in route.local_encode:
                continue
            holder = self._serving(route.image_to_source.get(h, ""))
            if holder is not None and holder.mm is not None and (h in holder.mm or h in holder.encoding):
                ready = max(ready, holder.encoding.get(h, ready))  # shipped, once encoded there
            else:  # no holder named, or it no longer holds it: the encoder
                from_encoder.append(h)
        if not from_encoder:
            return self.events.at(ready, self._prefill, request, request.token)
        encoder = self._serving(route.encoder)
        if encoder is None:
            return self._fail(request, route.encoder)
        new = [h for h in from_encoder if h not in encoder.mm and h not in encoder.encoding]
        if new:
            seconds = len(new) * self.costs.encode_s_per_image
            done = encoder.serve(self.events.now, seconds)
            self._tower_runs(encoder, new, done, seconds)
            self.events.at(done, self._encoded, encoder, new)
        ready = max([ready, *(encoder.encoding[h] for h in from_encoder if h in encoder.encoding)])
        self._hold(request, encoder)
        self.events.at(ready, self._prefill, request, request.token)

    def _encoded(self, encoder: SimNode, images: list[MmHash]) -> None:
        if encoder.state == "dead":
            return
        for mm_hash in images:
            encoder.encoding.pop(mm_hash, None)
        self.cluster.store(encoder, images=images)

    def _prefill(self, request: Request, token: int) -> None:
        if token != request.token:
            return
        self._unhold(request)
        turn, route, costs = request.turn, request.route, self.costs
        prefill = self._serving(route.prefill)
        if prefill is None:
            return self._fail(request, route.prefill)
        local = [h for h in dict.fromkeys(h for h, _ in turn.images) if h in route.local_encode and h not in prefill.mm]
        new = [h for h in local if h not in prefill.encoding]
        num_prompt = len(turn.token_ids)
        reused = prefill.kv.leading(turn.block_hashes) * self.block_size
        pull_s = 0.0
        peer = max((self._peer_tokens(a, n, turn, prefill) for a, n in route.prefix_tokens_by_node.items()), default=0)
        if peer > reused and costs.pull.should_pull(peer - reused, costs.prefill_s_per_token, self.block_size):
            pull_s = costs.pull.pull_s(peer - reused)
            self.metrics.pulled_tokens += peer - reused
            reused = peer
        reused = min(reused, num_prompt - 1)
        computed = num_prompt - reused
        novel = self.metrics.novel(turn.token_ids, turn.block_hashes)
        self.metrics.computed_tokens += computed  # lost with its node or not, the work was done
        seconds = computed * costs.prefill_s_per_token + pull_s
        done = prefill.serve(self.events.now, seconds + len(new) * costs.encode_s_per_image)
        self.metrics.busy_s["prefill"] += seconds
        if new:
            self.metrics.local_encodes += len(new)
            self._tower_runs(prefill, new, done, len(new) * costs.encode_s_per_image)
        self._hold(request, prefill)
        self.events.at(done, self._prefilled, request, request.token, novel, reused)

    def _prefilled(self, request: Request, token: int, novel: int, reused: int) -> None:
        if token != request.token:
            return
        turn = request.turn
        prefill = self.cluster.nodes[request.route.prefill]
        for mm_hash, _ in turn.images:
            prefill.encoding.pop(mm_hash, None)  # its local encodes, and any queued before them, are done
        self._unhold(request)
        self.cluster.store(prefill, blocks=turn.block_hashes, images=[h for h, _ in turn.images])
        self.cluster.retire(prefill)
        self.metrics.computed(turn.block_hashes)
        if request.first_token_s is None:
            request.first_token_s = self.events.now
            self.metrics.ttft_s.append(self.events.now - request.arrival_s)
            self.metrics.novel_tokens += novel  # a migration's were counted the first time
            self.metrics.reused_tokens += reused
            request.remaining = turn.num_reply_tokens - 1  # prefill sampled the first
        request.route.reservation.release()
        decode = self._serving(request.route.decode)
        if decode is None:
            return self._fail(request, request.route.decode)
        self.cluster.store(decode, blocks=turn.block_hashes)
        request.decode_hold = self.membership.in_flight(decode.address)
        self._hold(request, decode)
        decode.batch.append(request)
        if not decode.stepping:
            self._step(decode)

    def _step(self, decode: SimNode) -> None:
        members = decode.batch[:MAX_BATCH]
        seconds = self.costs.decode_step(len(members))
        decode.stepping = True
        self.metrics.busy_s["decode"] += seconds
        decode.busy_s += seconds
        self.events.after(seconds, self._stepped, decode, members)

    def _stepped(self, decode: SimNode, members: list[Request]) -> None:
        decode.stepping = False
        if decode.state == "dead":
            return
        finished = []
        for request in members:
            if request in decode.work:
                request.remaining -= 1
                if request.remaining <= 0:
                    finished.append(request)
        for request in finished:
            self._decoded(request, decode)
        if decode.batch:
            self._step(decode)
        self.cluster.retire(decode)

    def _decoded(self, request: Request, decode: SimNode) -> None:
        decode.batch.remove(request)
        self._unhold(request)
        request.decode_hold.release()
        self.cluster.store(decode, blocks=request.turn.reply_hashes)
        self.metrics.computed(request.turn.reply_hashes)
        self.metrics.completed += 1
        self.on_done(request, True)

    # -- failures -----------------------------------------------------------------------------------
    def kill(self, node: SimNode) -> None:
        """``node`` dies now: every request with a stage on it fails over."""
        affected = list(node.work)
        self.cluster.kill(node)
        for request in affected:
            self._fail(request, node.address, delay_s=0.0)

    def _fail(self, request: Request, address: str, delay_s: float | None = None) -> None:
        request.token += 1
        if request.route is not None and request.route.reservation is not None:
            request.route.reservation.release()
        if request.decode_hold is not None:
            request.decode_hold.release()
        for node in request.on_nodes:
            node.work.pop(request, None)
            if request in node.batch:
                node.batch.remove(request)
            self.cluster.retire(node)
        request.on_nodes.clear()
        self.membership.report_failure(address)
        request.excluded.add(address)
        self.metrics.failovers += 1
        if request.first_token_s is not None:
            self.metrics.migrations += 1
        self.events.after(self.costs.failed_call_s if delay_s is None else delay_s, self._attempt, request)

    # -- helpers ------------------------------------------------------------------------------------
    def _why_again(self, mm_hash: MmHash) -> str:
        """Why an image encoded before needs the tower again: a live node holds it (or is encoding
        it) but the route did not use it; only dead or drained nodes hold it; or it was evicted."""
        nodes = self.cluster.nodes.values()
        if any(n.serving and n.mm is not None and mm_hash in n.mm for n in nodes):
            return "held_elsewhere"
        if any(n.serving and mm_hash in n.encoding for n in nodes):
            return "encoding_elsewhere"
        if any(not n.serving and n.mm is not None and mm_hash in n.mm for n in nodes):
            return "lost_with_node"
        return "evicted"

    def _serving(self, address: str) -> SimNode | None:
        node = self.cluster.nodes.get(address)
        return node if node is not None and node.serving else None

    def _peer_tokens(self, address: str, claimed: int, turn: Turn, prefill: SimNode) -> int:
        """Leading prompt tokens a peer the route names really holds (the index may be behind)."""
        peer = self.cluster.nodes.get(address)
        if peer is None or peer is prefill or not peer.serving or peer.kv is None:
            return 0
        return min(claimed, peer.kv.leading(turn.block_hashes) * self.block_size)

    def _tower_runs(self, node: SimNode, images: list[MmHash], done: float, seconds: float) -> None:
        for mm_hash in images:
            if mm_hash in self._encoded_once:
                self.metrics.repeat_tower_runs[self._why_again(mm_hash)] += 1
            self._encoded_once.add(mm_hash)
            node.encoding[mm_hash] = done
        node.num_tower_runs += len(images)
        self.metrics.tower_runs += len(images)
        self.metrics.busy_s[node.role] += seconds

    def _hold(self, request: Request, node: SimNode) -> None:
        node.work[request] = None
        request.on_nodes.append(node)

    def _unhold(self, request: Request) -> None:
        for node in request.on_nodes:
            node.work.pop(request, None)
            self.cluster.retire(node)
        request.on_nodes.clear()
