"""The gateway's block_size against the cluster's nodes (pure)."""

from __future__ import annotations

from services.gateway.http.probe_routes import block_size_disagreement
from shared.index.cluster_config import ClusterConfig
from shared.index.types import NodeInfo, NodeState


def node(role: str, config: ClusterConfig) -> NodeState:
    return NodeState(NodeInfo(f"{role}@x", role, "x:1", config=config), 1, 0.0, 0.0)


def test_nodes_that_share_the_gateway_s_block_size_or_give_none_agree():
    assert block_size_disagreement([node("prefill", ClusterConfig(16)), node("encoder", ClusterConfig(dtype="float32"))], 16) is None
    assert block_size_disagreement([], 16) is None


def test_a_cluster_on_another_block_size_is_named_with_the_value_to_restart_with():
    message = block_size_disagreement([node("decode", ClusterConfig(32))], 16)
    assert message == "this gateway's block_size 16 is not the cluster's (32): restart it with --block-size 32"
