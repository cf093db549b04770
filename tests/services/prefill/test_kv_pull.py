"""The pull-or-recompute cost model (pure)."""

from __future__ import annotations

from services.prefill.kv_pull import KVSource, PullCostModel, blocks_to_pull, kv_bytes_per_token, updated_rate


def test_bytes_per_token_counts_k_and_v_of_every_layer():
    assert kv_bytes_per_token(num_layers=6, num_kv_heads=2, head_dim=64, dtype_bytes=4) == 6144


def test_pull_wins_when_the_wire_is_faster_than_prefill():
    model = PullCostModel(bytes_per_token=6144, bandwidth_bytes_per_s=1e9, overhead_s=0.005)
    # 1024 tokens: 0.005 + 6.3 ms to pull against 0.7 s to recompute.
    assert model.should_pull(1024, prefill_s_per_token=0.0007, block_size=16)


def test_recompute_wins_for_short_spans_on_a_slow_link_or_a_fast_device():
    model = PullCostModel(bytes_per_token=6144, bandwidth_bytes_per_s=1e9, overhead_s=0.005)
    assert not model.should_pull(16, prefill_s_per_token=0.0001, block_size=16)  # 6.7 ms vs 1.6 ms
    slow = PullCostModel(bytes_per_token=6144, bandwidth_bytes_per_s=1e6, overhead_s=0.005)
    assert not slow.should_pull(1024, prefill_s_per_token=0.0007, block_size=16)


def test_less_than_a_block_is_never_pulled():
    model = PullCostModel(bytes_per_token=1, bandwidth_bytes_per_s=1e12, overhead_s=0.0)
    assert not model.should_pull(15, prefill_s_per_token=1.0, block_size=16)
    assert model.should_pull(16, prefill_s_per_token=1.0, block_size=16)


def test_blocks_to_pull_skips_local_blocks_and_the_last_prompt_block():
    source = KVSource("peer:1", num_tokens=160)  # 10 blocks
    assert blocks_to_pull(3, source, num_prompt_tokens=200, block_size=16) == range(3, 10)
    # The block holding the last prompt token is always computed locally.
    assert blocks_to_pull(0, source, num_prompt_tokens=160, block_size=16) == range(0, 9)
    assert blocks_to_pull(0, source, num_prompt_tokens=161, block_size=16) == range(0, 10)
    assert len(blocks_to_pull(12, source, num_prompt_tokens=400, block_size=16)) == 0


def test_rate_estimate_moves_towards_measurements_and_ignores_tiny_prefills():
    assert updated_rate(0.001, elapsed_s=2.0, num_tokens=1000, weight=0.5) == 0.0015
    assert updated_rate(0.001, elapsed_s=2.0, num_tokens=4) == 0.001
