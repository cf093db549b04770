"""The simulated clients: Zipf image popularity, sessions whose turns extend each other, and the
same requests for the same seed."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from benchmarks.simulate.workload import IMAGE_PAD, WorkloadConfig, ZipfCatalogue, sessions
from shared.hashing import MmSpan, block_hashes


def _config(**overrides) -> WorkloadConfig:
    settings = {"sessions": 40, "catalogue": 50, "session_rate": 2.0, "max_turns": 4, "seed": 3}
    return WorkloadConfig(**{**settings, **overrides})


def _turns(config: WorkloadConfig) -> list:
    out = []
    for session in sessions(config):
        while (turn := session.next_turn()) is not None:
            out.append((session.start_s, turn))
    return out


def test_zipf_ranks_are_drawn_in_proportion_to_one_over_rank():
    catalogue = ZipfCatalogue(1000, 1.0)
    rng = random.Random(0)
    counts = Counter(catalogue.draw(rng) for _ in range(40_000))
    assert counts[0] > counts[1] > counts[3] > counts[9]
    assert counts[0] / counts[1] == pytest.approx(2.0, rel=0.15)
    assert counts[0] / counts[9] == pytest.approx(10.0, rel=0.25)
    assert max(counts) < 1000 and len({catalogue.mm_hash(r) for r in range(1000)}) == 1000
    flat = Counter(ZipfCatalogue(4, 0.0).draw(rng) for _ in range(8000))  # s = 0: uniform
    assert all(n == pytest.approx(2000, rel=0.1) for n in flat.values())


def test_each_turn_extends_the_previous_prompt_and_reply():
    config = _config(new_image_p=0.5)
    by_session: dict[int, list] = {}
    for _, turn in _turns(config):
        by_session.setdefault(turn.session, []).append(turn)
    assert any(len(turns) > 1 for turns in by_session.values())
    for turns in by_session.values():
        assert [t.index for t in turns] == list(range(len(turns))) and turns[-1].last
        first = turns[0]
        assert first.token_ids[: config.system_tokens] == turns[-1].token_ids[: config.system_tokens]
        assert first.images[0][1].offset == config.system_tokens and len(first.images) == 1
        for before, after in zip(turns, turns[1:]):
            reply_end = len(before.token_ids) + before.num_reply_tokens
            assert after.token_ids[: len(before.token_ids)] == before.token_ids
            assert len(after.token_ids) > reply_end and after.images[: len(before.images)] == before.images
            assert after.block_hashes[: len(before.reply_hashes)] == before.reply_hashes  # the reply's blocks are its prefix
        for turn in turns:
            spans = [MmSpan(h, r) for h, r in turn.images]
            assert turn.block_hashes == block_hashes(turn.token_ids, config.block_size, spans)
            for _, placeholder in turn.images:
                assert set(turn.token_ids[placeholder.offset : placeholder.end]) == {IMAGE_PAD}


def test_sessions_start_in_order_and_the_same_seed_gives_the_same_requests():
    one, two = _turns(_config()), _turns(_config())
    starts = [start for start, turn in one if turn.index == 0]
    assert starts == sorted(starts) and len(starts) == 40
    assert [(s, t.token_ids, t.images, t.think_s) for s, t in one] == [(s, t.token_ids, t.images, t.think_s) for s, t in two]
    other = _turns(_config(seed=4))
    assert [t.token_ids for _, t in other] != [t.token_ids for _, t in one]
    popular = Counter(t.images[0][0] for _, t in _turns(_config(sessions=400)) if t.index == 0)
    assert popular.most_common(1)[0][1] > 400 / 50  # Zipf: the top image well above a uniform share


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        _config(catalogue=0)
    with pytest.raises(ValueError):
        _config(new_image_p=1.5)
