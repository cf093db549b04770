"""One conformance suite for uuid bindings, run against every backend: in-process, embedded Valkey
and Debian's redis-server (conftest.py has the servers)."""

from __future__ import annotations

import threading
import uuid

import pytest

from shared.index.uuid_bindings import ContentBinding, InProcessBindings, create_bindings

TTL = 0.4


def content(name: str, num_bytes: int = 100) -> ContentBinding:
    return ContentBinding(digest=f"digest-of-{name}", num_bytes=num_bytes, width=64, height=48, mm_hash=f"mm-{name}")


@pytest.fixture()
def make_bindings(index_url, clock):
    """Bindings with the given TTL and budget on the backend under test, in a namespace of their own."""
    made = []

    def make(ttl_s: float = TTL, max_entries: int = 100):
        if clock is not None:
            bindings = InProcessBindings(ttl_s=ttl_s, max_entries=max_entries, clock=clock)
        else:
            bindings = create_bindings(index_url, namespace=f"test-{uuid.uuid4().hex[:8]}", ttl_s=ttl_s, max_entries=max_entries)
        made.append(bindings)
        return bindings

    yield make
    for bindings in made:
        bindings.close()


def test_a_free_uuid_binds_to_its_first_content_and_resolves_to_it(make_bindings):
    bindings = make_bindings()
    assert bindings.resolve("tenant/a") is None
    assert bindings.bind("tenant/a", content("x")) == content("x")
    assert bindings.resolve("tenant/a") == content("x")


def test_the_same_uuid_with_other_content_gets_the_first_binding_back(make_bindings):
    bindings = make_bindings()
    bindings.bind("u", content("x"))
    assert bindings.bind("u", content("y")) == content("x")  # the caller's conflict
    assert bindings.resolve("u") == content("x")  # the conflict changed nothing
    assert bindings.bind("u", content("x")) == content("x")


def test_keys_are_independent(make_bindings):
    bindings = make_bindings()
    bindings.bind("tenant-a/u", content("x"))
    assert bindings.resolve("tenant-b/u") is None
    assert bindings.bind("tenant-b/u", content("y")) == content("y")


def test_a_binding_lapses_after_its_ttl_and_the_uuid_binds_afresh(make_bindings, lapse):
    bindings = make_bindings()
    bindings.bind("u", content("x"))
    lapse(TTL * 1.5)
    assert bindings.resolve("u") is None
    assert bindings.bind("u", content("y")) == content("y")


def test_resolving_and_binding_again_keep_a_binding_alive(make_bindings, lapse):
    bindings = make_bindings()
    bindings.bind("u", content("x"))
    bindings.bind("v", content("y"))
    for _ in range(3):
        lapse(TTL * 0.6)
        assert bindings.resolve("u") == content("x")
        assert bindings.bind("v", content("y")) == content("y")


def test_the_budget_drops_the_bindings_closest_to_expiring(make_bindings, lapse):
    bindings = make_bindings(ttl_s=30, max_entries=3)
    for name in "abc":
        bindings.bind(name, content(name))
        lapse(0.01)
    assert bindings.resolve("a") == content("a")  # refreshed: now the furthest from expiring
    lapse(0.01)
    bindings.bind("d", content("d"))
    assert bindings.resolve("b") is None
    assert [bindings.resolve(name) for name in "acd"] == [content(name) for name in "acd"]


def test_two_binders_racing_on_one_uuid_agree_on_one_content(make_bindings):
    bindings = make_bindings()
    results: list[ContentBinding] = []
    threads = [threading.Thread(target=lambda n=n: results.append(bindings.bind("raced", content(n)))) for n in "xyzw"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(results) == 4 and len(set(results)) == 1
    assert bindings.resolve("raced") == results[0]


def test_a_binding_round_trips_through_json():
    bare = ContentBinding(digest="d", num_bytes=5)
    assert ContentBinding.from_json(bare.to_json()) == bare
    assert ContentBinding.from_json(content("x").to_json()) == content("x")
    assert "64x48" in content("x").describe()


@pytest.mark.parametrize("ttl_s, max_entries", [(0, 10), (-1, 10), (10, 0)])
def test_a_budget_that_holds_nothing_is_refused(ttl_s, max_entries):
    with pytest.raises(ValueError):
        create_bindings("memory://", namespace="n", ttl_s=ttl_s, max_entries=max_entries)


def test_an_unreachable_server_is_index_unavailable():
    from shared.index.types import IndexUnavailableError

    bindings = create_bindings("redis://127.0.0.1:1/0", namespace="n")
    with pytest.raises(IndexUnavailableError):
        bindings.resolve("u")
