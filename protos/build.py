"""Generate Python gRPC code from protos/*.proto with grpc_tools.protoc.

Output goes to protos/_generated/ with a stamp holding the sources' hash, so generation runs once
per change, under a file lock (several services start at once). Run ``python -m protos.build``
to generate eagerly.
"""

from __future__ import annotations

import fcntl
import hashlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "_generated"
STAMP = OUT / ".stamp"


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for proto in sorted(HERE.glob("*.proto")):
        digest.update(proto.name.encode() + proto.read_bytes())
    return digest.hexdigest()


def ensure_generated() -> Path:
    want = _sources_digest()
    if STAMP.is_file() and STAMP.read_text() == want:
        return OUT
    OUT.mkdir(exist_ok=True)
    with open(HERE / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if STAMP.is_file() and STAMP.read_text() == want:
            return OUT
        from grpc_tools import protoc

        protos = [str(p) for p in sorted(HERE.glob("*.proto"))]
        include = str(Path(protoc.__file__).parent / "_proto")
        code = protoc.main(["protoc", f"-I{HERE}", f"-I{include}", f"--python_out={OUT}", f"--grpc_python_out={OUT}", *protos])
        if code != 0:
            raise RuntimeError(f"protoc failed with exit code {code}")
        (OUT / "__init__.py").write_text("")
        STAMP.write_text(want)
    return OUT


if __name__ == "__main__":
    print(ensure_generated())
    sys.exit(0)
