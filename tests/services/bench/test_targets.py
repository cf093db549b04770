"""Which targets ``tessera bench`` measures, in order: ours first, then the peer."""

from __future__ import annotations

from services.bench.targets import build_targets


def _targets(**overrides):
    options = {"model": "tiny", "serve_args": [], "base_urls": [], "label": None, "peer": None, "num_peer_servers": 1}
    return build_targets(**{**options, **overrides})


def test_no_endpoint_means_the_local_stack_alone():
    assert [t.label for t in _targets()] == ["tessera"]


def test_given_endpoints_are_used_as_they_are():
    (target,) = _targets(base_urls=["http://a/v1", "http://b/v1"])
    assert target.label == "http://a/v1, http://b/v1"
    with target.open() as urls:
        assert urls == ["http://a/v1", "http://b/v1"]


def test_a_peer_comes_after_ours_and_names_its_server_count():
    assert [t.label for t in _targets(peer="vllm")] == ["tessera", "vllm"]
    assert [t.label for t in _targets(peer="vllm", num_peer_servers=2, label="2/2/2")] == ["2/2/2", "vllm x2"]
