"""What ``tessera bench`` measures: the local stack it starts, endpoints it is given, or vLLM-CPU
servers it starts beside Tessera (``--peer vllm``). A target is a context manager yielding its /v1
URLs; several URLs are served round-robin by the runner. Targets run one after another in the
same invocation, never at once, so each has the machine to itself and the ratios compare like
with like.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ContextManager


@dataclass(frozen=True, slots=True)
class Target:
    label: str
    open: Callable[[], ContextManager[list[str]]]  # yields the /v1 URLs while the target is up


@contextlib.contextmanager
def local_stack(model: str, serve_args: list[str]) -> Iterator[list[str]]:
    from services.bench.local_stack import start_stack, stop_stack

    stack, url = start_stack(model, serve_args)
    try:
        yield [url]
    finally:
        stop_stack(stack)


@contextlib.contextmanager
def endpoints(base_urls: list[str]) -> Iterator[list[str]]:
    yield list(base_urls)


@contextlib.contextmanager
def vllm_servers(model: str, num_servers: int, extra: tuple[str, ...] = ()) -> Iterator[list[str]]:
    """``num_servers`` vLLM-CPU servers on the same model (started one at a time, since each
    compiles at startup), for a round-robin comparison on the same cores."""
    from services.bench.peer_vllm import start_vllm, stop_vllm

    peers = []
    try:
        for _ in range(num_servers):
            peers.append(start_vllm(model, *extra))
        yield [peer.base_url for peer in peers]
    finally:
        for peer in peers:
            stop_vllm(peer)


def build_targets(
    *,
    model: str,
    serve_args: list[str],
    base_urls: list[str],
    label: str | None,
    peer: str | None,
    num_peer_servers: int,
    peer_args: tuple[str, ...] = (),
) -> list[Target]:
    """The given endpoints, else the local stack; then the peer, when one is asked for (started
    with ``peer_args`` besides its usual flags)."""
    if base_urls:
        targets = [Target(label or ", ".join(base_urls), lambda: endpoints(base_urls))]
    else:
        targets = [Target(label or "tessera", lambda: local_stack(model, serve_args))]
    if peer == "vllm":
        name = "vllm" if num_peer_servers == 1 else f"vllm x{num_peer_servers}"
        targets.append(Target(name, lambda: vllm_servers(model, num_peer_servers, peer_args)))
    return targets
