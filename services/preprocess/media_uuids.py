"""Client media uuids checked against their bindings (shared/index/uuid_bindings.py).

A uuid is an alias for the bytes it was first sent with, per tenant (the gateway scopes it). The
preprocessor names every image and clip by its content, with or without a uuid, so a uuid never
keys a cache; this module decides what a uuid may stand for:

  * sent with bytes: the bytes' digest must be the one the uuid is bound to (else 409, naming the
    bound content); a free uuid binds to them;
  * sent alone: it stands for the content it is bound to while the binding lives (else 400: send
    the bytes).

With the index unreachable, a uuid sent with bytes is served by its content (its own identity,
so nothing wrong can be served) and left unchecked; a uuid sent alone cannot be resolved (400).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.preprocess.errors import MediaUuidConflictError, MediaUuidUnboundError
from shared.index.types import IndexUnavailableError
from shared.index.uuid_bindings import ContentBinding, UuidBindings
from shared.node_metrics import Counter, counter


@dataclass(slots=True)
class UuidMetrics:
    num_conflicts: Counter = counter("uuid_conflicts_total", "Media uuids refused for being sent with other bytes than they are bound to")
    num_unchecked: Counter = counter("uuid_unchecked_total", "Media uuids served by their bytes unchecked: the bindings were unreachable")


class MediaUuids:
    def __init__(self, bindings: UuidBindings) -> None:
        self.bindings = bindings
        self.metrics = UuidMetrics()

    def known(self, uuid: str, kind: str) -> ContentBinding:
        """The content a uuid sent without bytes stands for."""
        try:
            bound = self.bindings.resolve(uuid)
        except IndexUnavailableError:
            unreachable = f"{kind} uuid {uuid!r} cannot be resolved now (the index is unreachable): send the {kind}"
            raise MediaUuidUnboundError(unreachable) from None
        if bound is None:
            raise MediaUuidUnboundError(
                f"{kind} uuid {uuid!r} is not bound to any {kind} (a binding lasts {self.bindings.ttl_s:g} s after its last use): "
                f"send the {kind} with it"
            )
        return bound

    def bound_to(self, uuid: str, digest: str, kind: str) -> ContentBinding | None:
        """The uuid's binding when it is to ``digest``; None when it is free (or unreadable).
        Raises the conflict when it is bound to other bytes."""
        try:
            bound = self.bindings.resolve(uuid)
        except IndexUnavailableError:
            self.metrics.num_unchecked.inc()
            return None
        if bound is not None and bound.digest != digest:
            self._conflict(uuid, bound, kind)
        return bound

    def bind(self, uuid: str, binding: ContentBinding, kind: str) -> None:
        """Binds a free uuid; raises the conflict when another request bound it to other bytes first."""
        try:
            in_force = self.bindings.bind(uuid, binding)
        except IndexUnavailableError:
            self.metrics.num_unchecked.inc()
            return
        if in_force.digest != binding.digest:
            self._conflict(uuid, in_force, kind)

    def _conflict(self, uuid: str, bound: ContentBinding, kind: str) -> None:
        self.metrics.num_conflicts.inc()
        raise MediaUuidConflictError(
            f"{kind} uuid {uuid!r} is bound to other content ({bound.describe()}) until {self.bindings.ttl_s:g} s after "
            f"its last use: send this {kind} under another uuid"
        )


def has_source(media) -> bool:
    """Whether an ImageInput or VideoInput carries bytes (inline or by URL)."""
    return media.data is not None or media.url is not None
