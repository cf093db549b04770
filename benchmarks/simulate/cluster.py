"""The modelled nodes of the simulated cluster and what they tell the real index.

Each node is a record in the real index (registered, heartbeated with its load, deregistered) and
a model of its compute: one FIFO server per encoder and prefill node (the node's one compute
thread: an encoder runs a tower pass per image, a prefill node computes its prompt tokens and the
images the router chose it to encode), and a continuously batched decoder per decode node (a
step costs ``decode_step_s + decode_step_s_per_seq * batch``, each sequence gaining one token).
Times are virtual; the default costs are measured (docs/benchmarks.md: "Measurements behind code
comments", adaptive dispatch's constants, for the tower and prefill; "Prepacked weights at few
rows", the shipped row, fitted linearly, for decode; the small model on one core;
``services/prefill/kv_pull.py`` for the KV bytes per token).

Caches are bounded LRUs, as the real ones evict: KV blocks (prefill and decode nodes, the engine's
default 512 MiB pool at the small model's 6 KiB per token) and image embeddings (encoders and
prefill nodes, the engine's default encoder cache of 16,384 rows). Whatever a node newly stores
or evicts is published as one IndexEvents batch (shared/index/publisher.py publishes the same
events, batched every 50 ms; a modelled node publishes at the virtual moment it changes).

Churn as the real nodes do it: a killed node is deregistered and publishes nothing more (its
entries stay in the index, unserved, until their keys expire); a drained node withdraws every
entry and deregisters (IndexPublisher.deregister), finishes the work it has, then leaves.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from services.engine.config import EngineConfig
from services.prefill.kv_pull import PullCostModel
from shared.index.backend import CacheIndex
from shared.index.types import IndexEvents, MmEntry, NodeInfo
from shared.types import BlockHash, MmHash

ROLES = ("encoder", "prefill", "decode")
KV_BYTES_PER_TOKEN = 6 * 1024  # the small model (services/prefill/kv_pull.py)
IMAGE_GRID = (1, 32, 32)  # 448x448 on Qwen2-VL: 256 embedding rows after 2x2 merging
EMBEDDING_BYTES_PER_ROW = 768 * 4  # the small model's hidden size, float32


@dataclass(frozen=True, slots=True)
class Costs:
    encode_s_per_image: float = 0.65
    prefill_s_per_token: float = 0.28 / 300
    decode_step_s: float = 0.045
    decode_step_s_per_seq: float = 0.009
    kv_bytes_per_token: int = KV_BYTES_PER_TOKEN
    failed_call_s: float = 0.005  # a call to a dead or draining node until it fails

    def decode_step(self, batch: int) -> float:
        return self.decode_step_s + self.decode_step_s_per_seq * batch

    @property
    def pull(self) -> PullCostModel:
        return PullCostModel(self.kv_bytes_per_token)


@dataclass(frozen=True, slots=True)
class Capacities:
    kv_blocks: int = EngineConfig().kv_cache_bytes // (KV_BYTES_PER_TOKEN * EngineConfig().block_size)
    images: int = EngineConfig().encoder_cache_tokens // 256


class Lru:
    """A bounded set of keys in least-recently-used order."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("an LRU needs a capacity of at least 1")
        self.capacity = capacity
        self._keys: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def keys(self) -> list[str]:
        return list(self._keys)

    def leading(self, keys: list[str]) -> int:
        """How many of ``keys`` this holds before the first it lacks (a prefix's blocks)."""
        for count, key in enumerate(keys):
            if key not in self._keys:
                return count
        return len(keys)

    def add(self, keys: Iterable[str]) -> tuple[list[str], list[str]]:
        """Touch ``keys`` (most recent last); the keys newly stored and the keys evicted."""
        stored: list[str] = []
        for key in keys:
            if key in self._keys:
                self._keys.move_to_end(key)
            else:
                self._keys[key] = None
                stored.append(key)
        evicted = []
        while len(self._keys) > self.capacity:
            evicted.append(self._keys.popitem(last=False)[0])
        return stored, evicted


@dataclass(eq=False, slots=True)
class SimNode:
    info: NodeInfo
    epoch: int
    kv: Lru | None
    mm: Lru | None
    state: str = "live"  # live | draining | dead
    busy_until: float = 0.0  # the FIFO server's end of queued work
    encoding: dict[MmHash, float] = field(default_factory=dict)  # images in a tower pass here -> when done
    work: dict = field(default_factory=dict)  # requests with a stage here (queued, waiting, running or decoding), in arrival order
    batch: list = field(default_factory=list)  # decode sequences
    stepping: bool = False
    num_tower_runs: int = 0
    busy_s: float = 0.0  # modelled compute done

    @property
    def address(self) -> str:
        return self.info.grpc_address

    @property
    def role(self) -> str:
        return self.info.role

    @property
    def serving(self) -> bool:
        return self.state == "live"

    def serve(self, now: float, seconds: float) -> float:
        """Queue ``seconds`` of compute on the FIFO server; when it ends."""
        self.busy_until = max(now, self.busy_until) + seconds
        self.busy_s += seconds
        return self.busy_until

    def load(self) -> float:
        return float(len(self.work))

    def kv_usage(self) -> float:
        return len(self.kv) / self.kv.capacity if self.kv is not None else 0.0


class Cluster:
    """The modelled nodes, by address, and their records in the index."""

    def __init__(self, index: CacheIndex, capacities: Capacities = Capacities(), *, ttl_s: float = 3600.0, can_encode: bool = True) -> None:
        self.index = index
        self.capacities = capacities
        self.ttl_s = ttl_s  # wall seconds: records outlive the run; kills and drains deregister
        self.can_encode = can_encode
        self.nodes: dict[str, SimNode] = {}
        self._numbers = {role: 0 for role in ROLES}
        self.num_kv_entries = 0  # (block, node) entries the index stores, withdrawn or evicted ones excepted
        self.num_mm_entries = 0
        self.num_publishes = 0
        self.num_heartbeats = 0

    def add(self, role: str) -> SimNode:
        number = self._numbers[role]
        self._numbers[role] += 1
        address = f"10.{ROLES.index(role)}.{number // 250}.{number % 250 + 1}:50051"
        info = NodeInfo(f"{role}@{address}", role, address, can_encode=self.can_encode and role == "prefill")
        epoch = self.index.register_node(info, ttl_s=self.ttl_s)
        kv = Lru(self.capacities.kv_blocks) if role != "encoder" else None
        mm = Lru(self.capacities.images) if role != "decode" else None
        node = self.nodes[address] = SimNode(info, epoch, kv, mm)
        return node

    def live(self, role: str) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.role == role and n.serving]

    def store(self, node: SimNode, blocks: Iterable[BlockHash] = (), images: Iterable[MmHash] = ()) -> None:
        """``node`` now holds these (most recently used); publish what changed."""
        events = IndexEvents()
        if node.kv is not None:
            stored, evicted = node.kv.add(blocks)
            events.kv_stored = {BlockHash(h): "device" for h in stored}
            events.kv_evicted = [BlockHash(h) for h in evicted]
        if node.mm is not None:
            stored, evicted = node.mm.add(images)
            entry = MmEntry(IMAGE_GRID[1] * IMAGE_GRID[2] // 4, IMAGE_GRID, IMAGE_GRID[1] * IMAGE_GRID[2] // 4 * EMBEDDING_BYTES_PER_ROW)
            events.mm_stored = {MmHash(h): entry for h in stored}
            events.mm_evicted = [MmHash(h) for h in evicted]
        if node.serving and not events.is_empty():  # a draining node has withdrawn and publishes no more
            self.index.publish(node.info.node_id, node.epoch, events)
            self.num_publishes += 1
            self.num_kv_entries += len(events.kv_stored) - len(events.kv_evicted)
            self.num_mm_entries += len(events.mm_stored) - len(events.mm_evicted)

    def heartbeat(self, node: SimNode) -> None:
        if node.serving:
            self.index.heartbeat(node.info.node_id, node.epoch, load=node.load(), kv_usage=node.kv_usage(), ttl_s=self.ttl_s)
            self.num_heartbeats += 1

    def kill(self, node: SimNode) -> None:
        """Gone without a word: its record leaves the index (as its TTL would lapse), its entries stay."""
        if node.state == "live":
            self.index.deregister_node(node.info.node_id, node.epoch)
        node.state = "dead"
        node.busy_until, node.batch, node.stepping = 0.0, [], False
        node.encoding.clear()

    def drain(self, node: SimNode) -> None:
        """Withdraw every entry and the record; the node finishes its work, then ``retire``."""
        held_kv = node.kv.keys() if node.kv is not None else []
        held_mm = node.mm.keys() if node.mm is not None else []
        self.index.publish(node.info.node_id, node.epoch, IndexEvents(mm_evicted=held_mm, kv_evicted=held_kv))
        self.index.deregister_node(node.info.node_id, node.epoch)
        self.num_publishes += 1
        self.num_kv_entries -= len(held_kv)
        self.num_mm_entries -= len(held_mm)
        node.state = "draining"

    def retire(self, node: SimNode) -> bool:
        """A drained node with no work left leaves; whether it did."""
        if node.state == "draining" and not node.work and not node.batch:
            node.state = "dead"
            return True
        return False
