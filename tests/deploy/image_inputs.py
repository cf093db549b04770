"""When the podman compose test (test_podman_compose.py) must run: its inputs' fingerprint
against the one recorded by its last pass (image_inputs.verified).

Why: it builds the shipped image from Debian's packages and runs docker-compose.yml under podman,
minutes of CPU that would take a large share of CI's time on every change. What it alone covers
is the packaging: the Dockerfile and what it installs, the compose file, the podman script; the
code inside the image is the code every other test runs, and docker-compose.yml's commands run
as processes in test_compose_local.py on every change. So the README's test command runs it
whenever one of INPUTS differs from its last verified run (deploy/run-tests.sh asks
``python -m tests.deploy.image_inputs``), and a pass records the new fingerprint, to be committed.
docs/testing.md says the same.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INPUTS = (
    "deploy/Dockerfile",
    "deploy/Dockerfile.dockerignore",
    "deploy/requirements.lock",
    "deploy/requirements-cuda.lock",
    "docker-compose.yml",
    "pyproject.toml",
    "tests/deploy/podman_compose.sh",
    "tests/deploy/test_podman_compose.py",
)
VERIFIED = Path(__file__).with_name("image_inputs.verified")


def fingerprint(root: Path = ROOT) -> str:
    digest = hashlib.sha256()
    for name in INPUTS:
        digest.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    return digest.hexdigest()


def verified(root: Path = ROOT) -> bool:
    """Whether the inputs are those of the last passing run."""
    return VERIFIED.is_file() and VERIFIED.read_text().strip() == fingerprint(root)


def record_pass() -> None:
    VERIFIED.write_text(fingerprint() + "\n")


if __name__ == "__main__":
    # Exit 0 when the test need not run; 1 (saying why) when its inputs changed.
    if verified():
        sys.exit(0)
    print(f"the image's inputs changed since its last verified run ({', '.join(INPUTS)}): the podman compose test runs", file=sys.stderr)
    sys.exit(1)
