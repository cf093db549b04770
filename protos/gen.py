"""The generated messages and stubs: ``from protos.gen import pb, rpc``."""

from __future__ import annotations

import sys

from protos.build import ensure_generated

_out = ensure_generated()
# The generated grpc module imports its sibling as a top-level module ("import tessera_pb2").
if str(_out) not in sys.path:
    sys.path.insert(0, str(_out))

import tessera_pb2 as pb  # noqa: E402
import tessera_pb2_grpc as rpc  # noqa: E402

__all__ = ["pb", "rpc"]
