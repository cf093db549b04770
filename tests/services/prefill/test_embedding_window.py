"""The window a prefill node brings next (services/prefill/embedding_window.py), over a real
EncoderCacheManager: items in prompt order from where the engine computes next, as many as fit;
resident ones claimed (a freeable one only if it fits); the request's references always a run
in prompt order, so rows it pins are rows it can compute through."""

from __future__ import annotations

from services.engine.encoder_cache_manager import EncoderCacheManager
from services.engine.remote_request import PromptItem
from services.prefill.embedding_window import plan_window
from shared.types import PlaceholderRange


def make_items(*spans: tuple[int, int]) -> list[PromptItem]:
    return [PromptItem(f"g{k}", PlaceholderRange(offset, length), (1, 2, 2 * length)) for k, (offset, length) in enumerate(spans)]


def _users(cache: EncoderCacheManager, mm_hash: str) -> set[str]:
    return set(cache.mm_hash_to_requests.get(mm_hash, ()))


def test_lacking_items_join_the_window_in_order_while_they_fit():
    cache = EncoderCacheManager(10)
    items = make_items((4, 4), (8, 4), (12, 4))
    window = plan_window(cache, "r", items, 0)
    assert [i.mm_hash for i in window.lacking] == ["g0", "g1"] and not window.complete


def test_items_the_engine_computed_past_are_skipped_and_the_rest_brought_completes():
    cache = EncoderCacheManager(10)
    items = make_items((4, 4), (8, 4), (12, 4))
    window = plan_window(cache, "r", items, 12)  # g0 and g1 are computed (or a cached prefix)
    assert [i.mm_hash for i in window.lacking] == ["g2"]
    cache.allocate("r", "g2", 4)  # brought
    assert plan_window(cache, "r", items, 12).complete


def test_resident_items_are_claimed_a_freeable_one_only_if_it_fits():
    cache = EncoderCacheManager(8)
    for mm_hash, owner in (("g0", "other"), ("g1", None)):
        cache.allocate(owner or "old", mm_hash, 4)
        if owner is None:
            cache.free_encoder_input("old", mm_hash)  # freeable
    items = make_items((0, 4), (4, 4), (8, 4))
    window = plan_window(cache, "r", items, 0)
    # g0 is shared at no cost; g1, freeable, takes the room's last 4 rows; g2 does not fit.
    assert window.lacking == [] and window.num_claimed == 2 and not window.complete
    assert "r" in _users(cache, "g0") and "r" in _users(cache, "g1")


def test_a_reference_beyond_the_first_item_that_does_not_fit_is_dropped():
    cache = EncoderCacheManager(8)
    cache.allocate("r", "g1", 4)  # held for r, but g0 before it is lacking
    items = make_items((0, 8), (8, 4))
    window = plan_window(cache, "r", items, 0)
    # g0 needs 8 rows: r's own g1 goes back to the freeable LRU, and g0 fits by evicting it.
    assert [i.mm_hash for i in window.lacking] == ["g0"] and "r" not in _users(cache, "g1")


def test_repeating_a_plan_claims_nothing_twice():
    cache = EncoderCacheManager(8)
    cache.allocate("other", "g0", 4)
    items = make_items((0, 4))
    assert plan_window(cache, "r", items, 0).num_claimed == 1
    again = plan_window(cache, "r", items, 0)
    assert again.num_claimed == 0 and again.complete and _users(cache, "g0") == {"other", "r"}
