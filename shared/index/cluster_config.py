"""Config agreement: the settings every node of one cluster must share, agreed at registration.

Why: a node whose ``block_size`` differs cuts prompts into other blocks, so none of the block
hashes it publishes is ever looked up and none of the router's is ever its: it silently loses
every prefix hit, and its KV pages cannot be exchanged with its peers. A node computing in
another dtype sends embeddings and KV pages its peers cannot use. Such a node is refused when it
registers, with a log line naming the setting, its value and the cluster's, and its process
exits with EXIT_REFUSED (services/stack/roles.py), instead of serving quietly and badly.

The model identity needs no record: the index namespace *is* the model id, ``name@fingerprint``
(services/models/fingerprint.py), so a node of other weights joins another cluster (a rolling
update is two namespaces side by side), and every node record's seal binds its namespace.

The record, one per namespace (``P config``, a hash: setting -> value): each setting is written by
the first registrant that has it (SET NX semantics, per setting), in the same atomic step as its
registration; a later registration whose value for a setting differs is refused
(ConfigMismatchError) and writes nothing. A node gives only the settings that matter to it: an
encoder keeps no KV pages, so it has no ``block_size`` and never fixes the cluster's.

Readers: a node record carries the settings it registered with (inside its seal, record_seal.py),
and live_nodes and lookup serve only nodes whose settings agree with the record, so a node that
got in another way (an older build, a record put back by hand) is never routed to.

Lifetime: the record lives as long as the cluster does. Every registration and heartbeat extends
it to at least the node's TTL, so it outlives every live node record; once no node of the
namespace has heartbeated for a TTL (the whole cluster stopped) it lapses, and the first node of
the next deployment writes its own settings. Hence changing a setting takes stopping the cluster
(or a TTL's pause between the old nodes and the new): a rolling redeploy with a new ``block_size``
is refused node by node while old nodes still serve, which leaves the old cluster serving. The
record carries no address and grants nothing, so it is not sealed: whoever forges one can only
refuse nodes, a denial of service anyone able to write the index has anyway.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# The exit status of a node process the cluster refused: sysexits' configuration error, so a
# supervisor can tell it from a crash and need not restart it in a loop (it would be refused again).
EXIT_REFUSED = os.EX_CONFIG


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """The settings a node must share with its cluster; None: the setting does not matter to it."""

    block_size: int | None = None  # tokens per KV block: what every block hash covers
    dtype: str | None = None  # compute dtype ("float32"): of embeddings and KV pages sent between nodes

    def settings(self) -> dict[str, str]:
        """The settings this node gives, as the index stores them (setting -> text)."""
        values = {"block_size": self.block_size, "dtype": self.dtype}
        return {name: str(value) for name, value in values.items() if value is not None}

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> ClusterConfig:
        """A node record's settings as the index hands them back (unknown names are ignored)."""
        block_size = settings.get("block_size")
        return cls(block_size=int(block_size) if block_size is not None else None, dtype=settings.get("dtype"))


@dataclass(frozen=True, slots=True)
class Disagreement:
    setting: str
    node_value: str
    cluster_value: str


def disagreements(node: Mapping[str, str], agreed: Mapping[str, str]) -> list[Disagreement]:
    """The settings ``node`` gives with another value than the cluster's record ``agreed``; a
    setting one side lacks is no disagreement."""
    return [Disagreement(name, value, agreed[name]) for name, value in sorted(node.items()) if name in agreed and agreed[name] != value]


def agrees(node: Mapping[str, str], agreed: Mapping[str, str]) -> bool:
    return not disagreements(node, agreed)


class ConfigMismatchError(RuntimeError):
    """A registration refused: the node's settings disagree with its cluster's. Not an index
    failure: retrying cannot help, the node must be restarted with the cluster's settings."""

    def __init__(self, namespace: str, node_id: str, found: list[Disagreement]) -> None:
        self.namespace = namespace
        self.node_id = node_id
        self.disagreements = found
        details = "; ".join(f"its {d.setting} is {d.node_value}, the cluster's is {d.cluster_value}" for d in found)
        super().__init__(
            f"node {node_id!r} refused by the cluster {namespace!r}: {details} "
            "(start it with the cluster's settings; a cluster changes them only by stopping all its nodes)"
        )
