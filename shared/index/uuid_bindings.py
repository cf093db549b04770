"""Client media uuids bound to content: the contract, the in-process backend and the one factory.

A client may name an image or a clip with a ``uuid`` (scoped to its tenant by the gateway). A
uuid is only ever an alias: the first request that sends it with bytes binds it to those bytes'
digest, byte size and dimensions, and every cache is keyed by the content, never by the uuid.
So a uuid sent again with other bytes is a conflict (the caller answers 409), never a hit on the
first content's work; a uuid sent without bytes resolves only while its binding lives; and an id a
client reuses after a restart, or one that only meant something within one request, cannot serve
another content's work, because nothing downstream ever sees it.

Semantics every backend honours (tests/shared/index/test_uuid_bindings.py checks them):
  * ``bind(key, binding)`` returns the binding in force: ``binding`` itself when the key was free
    or bound to the same digest, else the other content's (the caller's conflict). Either way
    the binding in force lives ``ttl_s`` more;
  * ``resolve(key)`` returns the live binding, refreshing its TTL (a conversation that keeps
    naming an image keeps it bound), or None;
  * at most ``max_entries`` bindings live at once: binding a new key past that drops the ones
    closest to expiring;
  * a lapsed binding is gone: the key binds afresh, to any content.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

from shared.index.backend import IndexCredentials

DEFAULT_TTL_S = 3600.0
DEFAULT_MAX_ENTRIES = 100_000


@dataclass(frozen=True, slots=True)
class ContentBinding:
    """What a uuid stands for: the bytes it was first sent with."""

    digest: str  # blake3 of the encoded bytes, hex
    num_bytes: int
    width: int | None = None  # the image's, or the clip's frame size; None where the header says nothing
    height: int | None = None
    mm_hash: str | None = None  # an image's content identity (its pixels' hash); clips derive theirs from the digest

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> ContentBinding:
        return ContentBinding(**json.loads(text))

    def describe(self) -> str:
        size = f", {self.width}x{self.height}" if self.width is not None and self.height is not None else ""
        return f"{self.num_bytes} bytes{size}, blake3 {self.digest[:16]}"


class UuidBindings(Protocol):
    ttl_s: float

    def bind(self, key: str, binding: ContentBinding) -> ContentBinding:
        """The binding in force for ``key`` (``binding``, or another content's); raises
        IndexUnavailableError when a networked backend cannot be reached."""

    def resolve(self, key: str) -> ContentBinding | None: ...

    def close(self) -> None: ...


class InProcessBindings:
    """One process's bindings (the in-process engine, unit tests); thread-safe."""

    def __init__(
        self, *, ttl_s: float = DEFAULT_TTL_S, max_entries: int = DEFAULT_MAX_ENTRIES, clock: Callable[[], float] = time.monotonic
    ) -> None:
        _check_budget(ttl_s, max_entries)
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._key_to_entry: dict[str, tuple[ContentBinding, float]] = {}  # binding, expires_at; oldest expiry first

    def bind(self, key: str, binding: ContentBinding) -> ContentBinding:
        with self._lock:
            now = self._clock()
            current = self._live(key, now)
            in_force = current if current is not None else binding  # the same digest or a conflict: the first stays
            self._refresh(key, in_force, now)
            return in_force

    def resolve(self, key: str) -> ContentBinding | None:
        with self._lock:
            now = self._clock()
            current = self._live(key, now)
            if current is not None:
                self._refresh(key, current, now)
            return current

    def close(self) -> None:
        pass

    def _live(self, key: str, now: float) -> ContentBinding | None:
        entry = self._key_to_entry.get(key)
        if entry is None:
            return None
        binding, expires_at = entry
        if expires_at > now:
            return binding
        del self._key_to_entry[key]
        return None

    def _refresh(self, key: str, binding: ContentBinding, now: float) -> None:
        # Every refresh sets expiry to now + ttl, so re-inserting keeps the dict in expiry order.
        self._key_to_entry.pop(key, None)
        self._key_to_entry[key] = (binding, now + self.ttl_s)
        while len(self._key_to_entry) > self.max_entries:
            del self._key_to_entry[next(iter(self._key_to_entry))]


def _check_budget(ttl_s: float, max_entries: int) -> None:
    if not ttl_s > 0:
        raise ValueError("a uuid binding's TTL must be positive")
    if max_entries < 1:
        raise ValueError("the uuid binding budget must be at least 1")


def create_bindings(
    url: str,
    *,
    namespace: str,
    credentials: IndexCredentials | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    max_entries: int = DEFAULT_MAX_ENTRIES,
) -> UuidBindings:
    """Kept beside the cache index: ``memory://`` in process, ``redis://`` (``rediss://``,
    ``unix://``) on the index's server, where every node sees them."""
    _check_budget(ttl_s, max_entries)
    if url.startswith("memory://"):
        return InProcessBindings(ttl_s=ttl_s, max_entries=max_entries)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from shared.index.redis_bindings import RedisBindings

        return RedisBindings(url, namespace=namespace, credentials=credentials or IndexCredentials(), ttl_s=ttl_s, max_entries=max_entries)
    raise ValueError(f"unsupported index URL {url!r}: use memory:// or redis://host:port/db")
