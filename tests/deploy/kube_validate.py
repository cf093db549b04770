"""``kubernetes-validate --strict`` over rendered manifests, against explicit Kubernetes versions:
shared by the kustomize and Helm tests."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

# Kubernetes versions the rendered manifests must validate against (kubernetes-validate schemas).
K8S_VERSIONS = ("1.31.0", "1.34.0")


def assert_valid_strict(docs: list[dict], tmp_path: Path) -> None:
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    version_args = [arg for version in K8S_VERSIONS for arg in ("-k", version)]
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", *version_args, str(manifest)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    problems = "\n".join(line for line in output.splitlines() if not line.startswith("INFO ")) or output
    assert result.returncode == 0, problems
    # A kind without a schema is only a warning there; every kind used here must have one.
    assert not re.search(r"^(WARN|ERROR|FATAL)", output, re.MULTILINE), problems
    assert len(re.findall(r"^INFO .* passed for resource", output, re.MULTILINE)) == len(docs) * len(K8S_VERSIONS), output
