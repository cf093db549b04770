"""A routing decision as the pipeline uses it (``Route``), the work it counts on its nodes until
released (``Reservation``), and the error of a role with no node left."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from services.router.membership import InFlight
from shared.types import MmHash


class NoLiveNodeError(RuntimeError):
    def __init__(self, role: str) -> None:
        super().__init__(f"no live {role} node is left")
        self.role = role


@dataclass(frozen=True, slots=True)
class Route:
    encoder: str
    prefill: str
    decode: str | None  # None: a request that ends at its prefill (an embedding)
    images_on_encoder: frozenset[MmHash]  # mm_hashes the chosen encoder holds, per the index
    # gRPC address of each live prefill or decode node holding a leading prefix of the prompt's
    # blocks -> leading prompt tokens it holds (block_size * leading blocks); empty without an index.
    prefix_tokens_by_node: dict[str, int]
    decision_s: float
    # Images the prefill node encodes itself (adaptive dispatch): their pixels go to it, not to
    # the encoder. Empty: every image the encoder lacks is encoded there.
    local_encode: frozenset[MmHash] = frozenset()
    images_on_prefill: frozenset[MmHash] = frozenset()  # embeddings the chosen prefill node holds, per the index
    # Images neither the chosen encoder nor the prefill node holds but another live encoder or
    # prefill node does (or is encoding): mm_hash -> that node, asked to ship the embeddings
    # instead of a new tower run (the encoder encodes what it no longer holds).
    image_to_source: dict[MmHash, str] = field(default_factory=dict)
    # With route(reserve=True): this gateway's in-flight count of the route's work on its nodes,
    # and the images it sends to be encoded, taken with the decision; the caller releases it when
    # its prefill ends.
    reservation: Reservation | None = None
    # Images the chosen prefill node's cached prefix covers whole (coverage.py): their
    # embeddings are never read, so no pixels move and no tower runs for them.
    images_covered: frozenset[MmHash] = frozenset()


class Reservation:
    """A route's work counted on its nodes and its images pending encode; released once, however
    often ``release`` is called (a with-block's exit and a failure path may both do it)."""

    __slots__ = ("_end_encodes", "_in_flight")

    def __init__(self, in_flight: InFlight, end_encodes: Callable[[], None]) -> None:
        self._in_flight, self._end_encodes = in_flight, end_encodes

    def release(self) -> None:
        self._in_flight.release()
        self._end_encodes()

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def work_addresses(route: Route, mm_hashes: list[MmHash]) -> list[str]:
    """The nodes a routed request counts a call on until its prefill ends: the encoder only when
    the prefill node may pull embeddings from it (adaptive dispatch weighs the encoder's queue by
    such requests), then the prefill and decode nodes."""
    skipped = route.local_encode | route.images_on_prefill | route.image_to_source.keys() | route.images_covered
    uses_encoder = any(h not in skipped for h in mm_hashes)
    return [*([route.encoder] if uses_encoder else []), route.prefill, *([route.decode] if route.decode is not None else [])]
