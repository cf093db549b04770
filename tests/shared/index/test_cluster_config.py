"""The settings a node shares with its cluster, and how a disagreement is told."""

from __future__ import annotations

from shared.index.cluster_config import ClusterConfig, ConfigMismatchError, Disagreement, agrees, disagreements


def test_settings_are_the_ones_given_as_text_and_read_back_alike():
    config = ClusterConfig(block_size=16, dtype="float32")
    assert config.settings() == {"block_size": "16", "dtype": "float32"}
    assert ClusterConfig.from_settings(config.settings()) == config
    assert ClusterConfig(dtype="float32").settings() == {"dtype": "float32"}
    assert ClusterConfig().settings() == {}
    assert ClusterConfig.from_settings({"dtype": "float32", "later_setting": "x"}) == ClusterConfig(dtype="float32")


def test_only_a_setting_both_sides_give_can_disagree():
    cluster = {"block_size": "16", "dtype": "float32"}
    assert disagreements({"block_size": "32", "dtype": "float32"}, cluster) == [Disagreement("block_size", "32", "16")]
    assert agrees({"dtype": "float32"}, cluster)
    assert agrees({"block_size": "32"}, {"dtype": "float32"})
    assert agrees({}, cluster) and agrees({"block_size": "16"}, {})


def test_the_refusal_names_node_cluster_setting_and_both_values():
    error = ConfigMismatchError("tiny@abc", "decode@10.0.0.7:50061", [Disagreement("block_size", "32", "16")])
    message = str(error)
    assert "'decode@10.0.0.7:50061'" in message and "'tiny@abc'" in message
    assert "its block_size is 32, the cluster's is 16" in message
