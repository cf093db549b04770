"""Bounded fan-out (shared/index/types.py's MAX_HOLDERS_PER_KEY), run against every index backend
(conftest.py): an image or prefix held by more nodes than the bound names at most the bound of
them, each with an exact count; a session's longer prefix behind a hot first block is still found;
and a lookup's server work does not grow with the number of holders."""

from __future__ import annotations

import pytest
import redis

from shared.index.types import MAX_HOLDERS_PER_KEY, IndexEvents, MmEntry, NodeInfo, block_entry
from shared.types import BlockHash, MmHash

ENTRY = MmEntry(num_tokens=64, grid_thw=(1, 16, 16), num_bytes=64 * 768 * 4)
MANY = 3 * MAX_HOLDERS_PER_KEY
PROMPT = [BlockHash(f"b{i}") for i in range(8)]


def holding(index, name: str, num_blocks: int, *, image: bool = False, role: str = "prefill") -> None:
    epoch = index.register_node(NodeInfo(name, role, f"{name}.example:50061", f"tcp://{name}.example:50071"), ttl_s=30)
    events = IndexEvents(kv_stored={block: "device" for block in PROMPT[:num_blocks]})
    if image:
        events.mm_stored[MmHash("hot")] = ENTRY
    index.publish(name, epoch, events)


def test_a_hot_image_names_at_most_the_bound_of_its_holders(index):
    for i in range(MANY):
        holding(index, f"n{i}", 0, image=True)
    holders = index.lookup([MmHash("hot")], []).mm_holders[MmHash("hot")]
    assert 0 < len(holders) <= MAX_HOLDERS_PER_KEY
    assert all(entry == ENTRY for entry in holders.values())


def test_a_sessions_longer_prefix_behind_a_hot_first_block_is_found_with_its_exact_length(index):
    for i in range(MANY):
        holding(index, f"hot{i}", 2)  # a hot system prompt: two blocks
    holding(index, "session", 6)  # the session's earlier turn
    prefix = index.lookup([], PROMPT).node_to_num_prefix_blocks
    assert prefix["session"] == 6
    assert len(prefix) <= MAX_HOLDERS_PER_KEY


def test_past_the_bound_a_hot_prefix_names_a_sample_of_its_holders_each_exactly(index):
    for i in range(MANY):
        holding(index, f"hot{i}", 3)
    prefix = index.lookup([], PROMPT).node_to_num_prefix_blocks
    assert 0 < len(prefix) <= MAX_HOLDERS_PER_KEY
    assert set(prefix.values()) == {3}


def test_a_lookup_reads_the_same_whatever_the_number_of_holders(index_url, index):
    """The server's work for a hot image and prefix is the same at 2x and 6x the bound."""
    if index_url == "memory://":
        pytest.skip("counts the server's commands")
    client = redis.Redis.from_url(index_url)

    def commands() -> dict[str, int]:
        client.config_resetstat()
        index.lookup([MmHash("hot")], PROMPT)
        stats = client.info("commandstats")
        return {k: v["calls"] for k, v in stats.items() if not k.startswith(("cmdstat_config", "cmdstat_info"))}

    index.lookup([], [])  # loads the script
    for i in range(2 * MAX_HOLDERS_PER_KEY):
        holding(index, f"n{i}", 4, image=True)
    fewer = commands()
    for i in range(2 * MAX_HOLDERS_PER_KEY, 6 * MAX_HOLDERS_PER_KEY):
        holding(index, f"n{i}", 4, image=True)
    more = commands()
    # Holders' epochs read (HGET) depend on which holders the samples draw: at most the bound for
    # the image, for block 0 and for the deepest block.
    assert {k: v for k, v in more.items() if k != "cmdstat_hget"} == {k: v for k, v in fewer.items() if k != "cmdstat_hget"}
    assert max(more["cmdstat_hget"], fewer["cmdstat_hget"]) <= 3 * MAX_HOLDERS_PER_KEY


def test_past_the_bound_a_hybrid_holders_prefix_still_ends_at_its_kept_state(index):
    for i in range(MANY):
        holding(index, f"hot{i}", 2)
    epoch = index.register_node(NodeInfo("session", "prefill", "s.example:50061", "tcp://s.example:50071"), ttl_s=30)
    entries = {block: block_entry("device", resumable=b in (1, 4)) for b, block in enumerate(PROMPT[:7])}
    index.publish("session", epoch, IndexEvents(kv_stored=entries))
    assert index.lookup([], PROMPT).node_to_num_prefix_blocks["session"] == 5


def test_past_the_bound_hot_holders_resume_where_the_deepest_holder_cannot(index):
    # The deepest holder holds every block but kept no state (its snapshots evicted): the lookup
    # falls back to block 0's sample, which can resume after block 0, in every backend alike.
    for i in range(MANY):
        epoch = index.register_node(NodeInfo(f"hot{i}", "prefill", f"hot{i}.example:50061"), ttl_s=30)
        index.publish(f"hot{i}", epoch, IndexEvents(kv_stored={PROMPT[0]: "device"}))
    epoch = index.register_node(NodeInfo("deep", "prefill", "deep.example:50061"), ttl_s=30)
    stateless = {block: block_entry("device", resumable=False) for block in PROMPT}
    index.publish("deep", epoch, IndexEvents(kv_stored=stateless))
    prefix = index.lookup([], PROMPT).node_to_num_prefix_blocks
    assert prefix and "deep" not in prefix and set(prefix.values()) == {1}
