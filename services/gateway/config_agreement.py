"""The gateway's side of config agreement (shared/index/cluster_config.py): it registers no
record, so no registration can refuse it, yet its ``block_size`` is what preprocess cuts every
prompt's block hashes with and what the router looks up. A gateway that disagrees with the
cluster's nodes would silently miss every prefix, so it reports itself not ready, naming both
values, and a load balancer sends it nothing until it is restarted with the cluster's value."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from shared.index.types import NodeState

log = logging.getLogger("tessera")


def block_size_disagreement(nodes: Iterable[NodeState], block_size: int) -> str | None:
    """Why this gateway must not serve these nodes, or None when they agree."""
    cluster = sorted({s.info.config.block_size for s in nodes if s.info.config.block_size is not None})
    if not cluster or cluster == [block_size]:
        return None
    values = ", ".join(str(v) for v in cluster)
    return f"this gateway's block_size {block_size} is not the cluster's ({values}): restart it with --block-size {cluster[0]}"


class DisagreementLog:
    """Logs a disagreement when it starts or changes, not at every probe."""

    def __init__(self) -> None:
        self._last: str | None = None

    def note(self, message: str | None) -> None:
        if message is not None and message != self._last:
            log.error("%s", message)
        self._last = message
