"""What every node role shares, whatever it computes: its settings (where it listens, what it
advertises, the index it joins, how it drains, how the internal plane is authenticated) and the
wiring of its membership: an index publisher whose heartbeat is gated by the node's liveness, and
the server Lifecycle that joins the cluster once serving, exposes the node's metrics, and leaves
on drain. A node the cluster refuses (its settings disagree: shared/index/cluster_config.py)
leaves with ConfigMismatchError: at once when it first registers, after a drain when a later
re-registration is refused."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

from services.transport.addresses import AdvertisedAddress, BoundAddress, advertise, advertised_host, split_host_port
from services.transport.channel_auth import DEFAULT_MAX_FRAME_BYTES, ChannelAuth
from services.transport.grpc_server import Lifecycle
from services.transport.index_access import open_index
from services.transport.internal_auth import InternalAuth, InternalPlaneSettings, warn_if_open
from services.transport.node_admission import DEFAULT_MAX_PENDING_REQUESTS, NodeAdmission
from shared.index.cluster_config import ClusterConfig, ConfigMismatchError
from shared.index.publisher import IndexPublisher
from shared.index.types import NodeInfo
from shared.liveness import DEFAULT_STALL_S, Liveness
from shared.process_stats import node_snapshot

LoadFn = Callable[[], tuple[float, float]]


@dataclass(frozen=True, slots=True)
class NodeSettings(InternalPlaneSettings):
    """Flags of ``tessera serve --role R`` common to every node, each also ``TESSERA_SERVE_<NAME>``."""

    model: str = "tiny"
    # Where this node listens, and the host other nodes dial: every address this node hands out
    # (its index record, its Stats, the target of the tensors it asks peers for) is advertised.
    # Default: the bind host, or this host's own address when binding a wildcard such as
    # 0.0.0.0; a wildcard or loopback one with an index on another host refuses to start
    # (services/transport/addresses.py).
    grpc_address: str = "127.0.0.1:0"
    data_address: str = "tcp://127.0.0.1:0"
    advertise_host: str = ""
    node_id: str = ""  # default "role@advertised-grpc-address": stable across restarts in place
    # The cache index and cluster membership (redis://host:port/db); empty: no index.
    index_url: str = ""
    index_ttl_s: float = 5.0
    drain_timeout_s: float = 30.0  # on SIGTERM: time calls in flight get to finish
    liveness_stall_s: float = DEFAULT_STALL_S  # a work item running longer means a hung node
    metrics_port: int = 0  # this node's Prometheus endpoint (0: off)
    max_tensor_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES  # the largest tensor this node's inbox takes
    # Calls queued or running here; past it a call is refused as busy (the gateway tries another
    # node of the role, or answers 429): services/transport/node_admission.py.
    max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS

    def __post_init__(self) -> None:
        InternalPlaneSettings.__post_init__(self)
        if self.max_tensor_frame_bytes < 1:
            raise ValueError("max_tensor_frame_bytes must be positive")
        if self.max_pending_requests < 1:
            raise ValueError("max_pending_requests must be at least 1")
        if self.index_ttl_s <= 0 or self.liveness_stall_s <= 0 or self.drain_timeout_s < 0:
            raise ValueError("index_ttl_s and liveness_stall_s must be positive, drain_timeout_s >= 0")
        if self.index_url and split_host_port(self.grpc_address)[1] == 0:
            raise ValueError("with --index-url a node must bind an explicit --grpc-address port: the index advertises it")


@dataclass(frozen=True, slots=True)
class NodeAddresses:
    """Where this node's peers reach it: its gRPC server, and the host its data inbox is
    advertised at (the inbox's port is known once it binds: TensorInbox.address)."""

    grpc: AdvertisedAddress
    data_host: str | None  # None: a node without an inbox (preprocess)


def node_addresses(settings: NodeSettings, *, with_inbox: bool = True) -> NodeAddresses:
    """This node's advertised addresses; AdvertiseError where peers could not dial them (checked
    before the model loads, so a misconfigured node fails in a second, naming --advertise-host).
    ``with_inbox``: the node binds a data inbox at ``settings.data_address``."""

    def host_for(bind: str) -> str:
        return advertised_host(split_host_port(bind)[0], settings.advertise_host, settings.index_url)

    grpc_bound = BoundAddress.parse(settings.grpc_address)
    data_host = host_for(settings.data_address) if with_inbox else None
    return NodeAddresses(grpc=advertise(grpc_bound, host_for(settings.grpc_address)), data_host=data_host)


def node_auth(settings: NodeSettings) -> tuple[InternalAuth, ChannelAuth]:
    """The node's internal-plane credentials: for gRPC, and for its tensor channel."""
    auth = InternalAuth.from_settings(settings)
    warn_if_open(auth, [split_host_port(a)[0] for a in (settings.grpc_address, settings.data_address) if a])
    return auth, ChannelAuth(key=auth.tensor_key, max_frame_bytes=settings.max_tensor_frame_bytes)


def node_publisher(
    role: str,
    settings: NodeSettings,
    namespace: str,
    addresses: NodeAddresses,
    data_address: AdvertisedAddress | None,
    load_fn: LoadFn,
    liveness: Liveness,
    *,
    config: ClusterConfig,
    can_encode: bool = False,
) -> IndexPublisher | None:
    """The node's membership in the index (None without one): registered under its advertised
    addresses (its gRPC server's from ``addresses``, and its inbox's ``data_address``; None:
    it has no inbox) with the settings it must share with the cluster (``config``), heartbeating only
    while ``liveness`` holds. ``can_encode``: a prefill node with its own vision tower, which the
    router may ask to encode images."""
    if not settings.index_url:
        return None
    grpc_address = addresses.grpc
    data = data_address or ""
    node_id = settings.node_id or f"{role}@{grpc_address}"
    info = NodeInfo(node_id=node_id, role=role, grpc_address=grpc_address, data_address=data, can_encode=can_encode, config=config)
    index = open_index(settings.index_url, namespace=namespace, settings=settings)
    return IndexPublisher(
        index, info, ttl_s=settings.index_ttl_s, load_fn=load_fn, alive_fn=liveness.is_alive, on_refused=_drain_this_process
    )


def _drain_this_process(_: ConfigMismatchError) -> None:
    """A node refused after it served: it drains like on SIGTERM, and its Lifecycle's on_stop
    then raises the refusal."""
    os.kill(os.getpid(), signal.SIGTERM)


def node_lifecycle(
    role: str,
    settings: NodeSettings,
    publisher: IndexPublisher | None,
    liveness: Liveness,
    *,
    close: Callable[[], None],
    load_fn: LoadFn,
    metrics: object,
    admission: NodeAdmission,
) -> Lifecycle:
    """``metrics``: the node's metrics record (shared/node_metrics.py), served on its /metrics
    with its admission's and this process's, as its Stats reply carries them."""

    def on_start() -> None:
        if settings.metrics_port:
            from services.transport.metrics_http import NodeCollector, start_metrics_server

            host, _ = split_host_port(settings.grpc_address)
            snapshot = lambda: node_snapshot(metrics, admission.metrics)  # noqa: E731
            start_metrics_server(host, settings.metrics_port, NodeCollector(role, lambda: load_fn()[0], snapshot))
        if publisher is not None:
            publisher.start()

    def on_stop() -> None:
        close()
        if publisher is not None and publisher.refusal is not None:
            raise publisher.refusal

    return Lifecycle(
        drain_timeout_s=settings.drain_timeout_s,
        on_start=on_start,
        on_drain=publisher.deregister if publisher is not None else None,
        on_stop=on_stop,
        liveness=liveness,
    )
