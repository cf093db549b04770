"""What an index lookup says the live nodes hold for one request, by gRPC address: the nodes
holding each image's embeddings, and the leading prompt tokens each prefill or decode node holds.
A holder the membership does not hold (``named`` lacks it: its record lapsed or was refused)
counts for nothing."""

from __future__ import annotations

from services.router.scoring import prefix_tokens_per_node
from shared.index.types import LookupResult, NodeState
from shared.types import MmHash


def holdings(lookup: LookupResult, named: dict[str, NodeState], block_size: int) -> tuple[dict[MmHash, set[str]], dict[str, int]]:
    """(image -> addresses holding it, address -> leading prompt tokens it holds)."""
    mm_holders = {h: {named[n].info.grpc_address for n in holders if n in named} for h, holders in lookup.mm_holders.items()}
    # Only prefill and decode nodes hold KV pages a request can reuse.
    node_to_num_blocks = {
        named[node_id].info.grpc_address: num_blocks
        for node_id, num_blocks in lookup.node_to_num_prefix_blocks.items()
        if node_id in named and named[node_id].info.role in ("prefill", "decode")
    }
    return mm_holders, prefix_tokens_per_node(node_to_num_blocks, block_size)
