"""Images this gateway has sent to be encoded whose embeddings the index may not list yet, and
where: the router counts such an image as held there.

Why: two requests for one new image that arrive together both find no holder in the index (the
first one's encode has not finished, so nothing is published yet), and each could be sent to be
encoded on a different node (an encoder, or a prefill node by adaptive dispatch): the tower would
run twice. Counting the pending image as held sends the second request where the first one's
embeddings will be, and a node encodes one image once however many requests ask it for it.

An entry lives while a request that sent the image there is before the end of its prefill, then
``linger_s`` more: time for the node's publisher to list the embeddings in the index. It is a hint
and never a lock. A node that dies mid-encode is no longer a routing candidate, so nothing waits
on it and the image is encoded again elsewhere; a node hinted to hold an image whose pixels never
reached it says so, and the gateway pushes them (services/gateway/pipeline/stages.py). The view is one
gateway's: two gateways that get one new image at the same moment may still both encode it.

Bounded: at most ``max_entries`` images; past that, images no request is waiting on are dropped
first (they are hints only). Like the router, it lives on the gateway's event loop: no lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from shared.types import MmHash


@dataclass(slots=True)
class _Pending:
    address: str
    num_requests: int = 0
    expires_at: float = 0.0  # once num_requests is 0


@dataclass(slots=True)
class PendingEncodes:
    linger_s: float = 2.0
    max_entries: int = 65_536
    clock: Callable[[], float] = time.monotonic
    _hash_to_pending: dict[MmHash, _Pending] = field(default_factory=dict)

    def where(self, mm_hashes: Iterable[MmHash]) -> dict[MmHash, str]:
        """The node each of these images is pending on, for those that are."""
        now = self.clock()
        out: dict[MmHash, str] = {}
        for mm_hash in mm_hashes:
            pending = self._hash_to_pending.get(mm_hash)
            if pending is None:
                continue
            if pending.num_requests == 0 and now >= pending.expires_at:
                del self._hash_to_pending[mm_hash]
                continue
            out[mm_hash] = pending.address
        return out

    def begin(self, hash_to_address: Mapping[MmHash, str]) -> Callable[[], None]:
        """Note that these images are being encoded at these nodes; the returned function ends
        that (once, however often it is called), starting each image's linger."""
        counted: list[_Pending] = []
        for mm_hash, address in hash_to_address.items():
            pending = self._hash_to_pending.get(mm_hash)
            if pending is None or pending.address != address:
                pending = self._hash_to_pending[mm_hash] = _Pending(address)
            pending.num_requests += 1
            counted.append(pending)
        self._trim()

        def end() -> None:
            expires_at = self.clock() + self.linger_s
            for pending in counted:
                pending.num_requests -= 1
                pending.expires_at = expires_at
            counted.clear()

        return end

    def __len__(self) -> int:
        return len(self._hash_to_pending)

    def _trim(self) -> None:
        if len(self._hash_to_pending) <= self.max_entries:
            return
        idle = [h for h, p in self._hash_to_pending.items() if p.num_requests == 0]
        for mm_hash in idle[: len(self._hash_to_pending) - self.max_entries]:
            del self._hash_to_pending[mm_hash]
