"""Authentication of tensor messages (services/transport/tensor_channel.py): an HMAC-SHA256 tag over
every frame of a message, keyed by a key derived from the cluster's shared secret
(``InternalAuth.tensor_key`` in services/transport/internal_auth.py).

Why HMAC over frames and not ZMQ CURVE: what is required is CURVE "or equivalent authentication".
A tag over the whole message is that: a receiver files nothing a holder of the secret did not
send, byte for byte, header included, so a forged, truncated or altered message (a KV page under
another request's key, a tensor frame swapped for another) is dropped. It needs nothing but the
one shared secret (CURVE needs a keypair per node and a ZAP authenticator thread per context),
and it keeps the sender's zero-copy send. What it does not do: encrypt (use mTLS for gRPC and a
network policy or an encrypted overlay network for the data port when the network itself is not
trusted), or stop a replay of a captured message by someone who can already read the network.
Its cost, on each side, is one HMAC-SHA256 pass over the bytes (docs/benchmarks.md,
"Measurements behind code comments").

Each frame is hashed with its length in front, so bytes cannot be moved from one frame to the
next without changing the tag.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

TAG_BYTES = hashlib.sha256().digest_size


def frames_tag(key: bytes, frames: Sequence[memoryview | bytes]) -> bytes:
    """The tag of ``frames`` under ``key``."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for frame in frames:
        mac.update(len(frame).to_bytes(8, "big"))
        mac.update(frame)
    return mac.digest()


def verify_frames(key: bytes, tag: bytes | memoryview, frames: Sequence[memoryview | bytes]) -> bool:
    """Whether ``tag`` is the tag of ``frames`` under ``key`` (compared in constant time)."""
    return len(tag) == TAG_BYTES and hmac.compare_digest(bytes(tag), frames_tag(key, frames))
