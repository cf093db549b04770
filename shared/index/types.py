"""Records exchanged with the index."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.index.cluster_config import ClusterConfig
from shared.types import BlockHash, MmHash

# The most holders a lookup names per image or prefix (redis_scripts.py's LOOKUP_SCRIPT says how):
# past it, a random sample. A hot image or prefix is held by every node that served it, so without
# a bound a lookup's cost grows with the cluster. 8: any one holder of an image saves its tower run
# (the router names one per image, services/router/router.py), and a sample of 8 gives the load
# balancing a choice. Against 16, hit rates and tower runs held and the index work per request grew
# less with the cluster (docs/benchmarks.md, "A bound of 8 holders per key").
MAX_HOLDERS_PER_KEY = 8
# Membership changes an index remembers (the latest ones), so a reader that saw the version move
# reads only the changed nodes' records (CacheIndex.membership_changes), not the whole cluster's.
MEMBER_LOG_LENGTH = 1024
# A block's index entry names its tier. A hybrid model's node (linear-attention layers, whose
# state the KV alone cannot rebuild) adds NO_STATE_MARK to blocks after which it keeps no saved
# state: it holds their KV, but a prefix cannot resume there. A full-attention node never adds it,
# so every block it holds is a place to resume. The Lua lookup (redis_scripts.py) tests the same
# suffix.
NO_STATE_MARK = ":nostate"


def block_entry(tier: str, *, resumable: bool = True) -> str:
    """The entry a node publishes for a block it holds (IndexEvents.kv_stored)."""
    return tier if resumable else tier + NO_STATE_MARK


def is_resumable(entry: str) -> bool:
    """Whether a prefix may end after a block with this entry (its holder can resume there)."""
    return not entry.endswith(NO_STATE_MARK)


class IndexUnavailableError(RuntimeError):
    """The index server cannot be reached; callers keep serving from local caches."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: str
    role: str  # encoder | prefill | decode | preprocess
    grpc_address: str
    data_address: str = ""
    can_encode: bool = False  # a prefill node with its own vision tower (adaptive dispatch)
    config: ClusterConfig = ClusterConfig()  # what it must share with its cluster (cluster_config.py)


@dataclass(frozen=True, slots=True)
class NodeState:
    info: NodeInfo
    epoch: int
    load: float  # queue depth or utilisation, higher is busier
    kv_usage: float  # fraction of KV pages in use, 0..1
    seal: str = ""  # the writer's seal over this record (shared/index/record_seal.py); empty: unsealed
    # The content fingerprints of the LoRA adapters the node serves now (its heartbeat's): the
    # router prefers nodes holding a request's adapter (services/router/scoring.py).
    adapters: frozenset[str] = frozenset()


def adapters_field(adapters: frozenset[str]) -> str:
    """A node record's adapters as the index stores them (and a seal covers them): sorted, joined."""
    return ",".join(sorted(adapters))


def adapters_of(field_value: str) -> frozenset[str]:
    return frozenset(a for a in field_value.split(",") if a)


@dataclass(frozen=True, slots=True)
class MmEntry:
    num_tokens: int
    grid_thw: tuple[int, int, int]
    num_bytes: int


@dataclass(slots=True)
class IndexEvents:
    """A batch of cache changes from one node, published atomically."""

    mm_stored: dict[MmHash, MmEntry] = field(default_factory=dict)
    mm_evicted: list[MmHash] = field(default_factory=list)
    kv_stored: dict[BlockHash, str] = field(default_factory=dict)  # block -> its entry (block_entry)
    kv_evicted: list[BlockHash] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.mm_stored or self.mm_evicted or self.kv_stored or self.kv_evicted)


@dataclass(frozen=True, slots=True)
class LookupResult:
    """What the index knows about one request, live nodes only.

    node_to_num_prefix_blocks[n] is the largest k such that live node n holds the request's blocks
    0..k-1 under its current epoch and can resume after block k-1 (is_resumable: a hybrid node
    only where it kept the state): n's prefix ends at or before its first missing block, whatever
    n holds beyond it (a prefix beyond a miss is useless). Nodes with k = 0 are absent. Every named node's
    count is exact. With at most MAX_HOLDERS_PER_KEY holders of the first block, every holder is
    named; with more, the holders of the longest prefix found (up to the bound, sampled past it).
    mm_holders names every live holder of an image, or a random MAX_HOLDERS_PER_KEY of them past
    the bound. So a lookup's cost is O(images + prompt blocks), whatever the cluster's size.

    Holders are named by id and epoch only, not with their records: a lookup reads one field per
    holder and its reply carries no records. A holder's record (address, role, load), and whether
    to trust it at all (its seal, its cluster settings), come from the membership, which lists
    the records (live_nodes, membership_changes): a name counts only while the membership holds
    that node under that epoch (services/router/membership.py, Membership.resolve).
    """

    node_to_epoch: dict[str, int]  # the nodes named below -> the epoch their entries carry, their current one
    mm_holders: dict[MmHash, dict[str, MmEntry]]
    node_to_num_prefix_blocks: dict[str, int]
    membership_version: int = 0  # moves when a node registers, deregisters or is pruned


@dataclass(frozen=True, slots=True)
class MembershipChanges:
    """What changed after a membership version: the changed nodes' live records, and the ids of
    those gone (deregistered, pruned, lapsed, or no longer agreeing with the cluster's settings)."""

    version: int
    nodes: dict[str, NodeState]
    gone: frozenset[str]
