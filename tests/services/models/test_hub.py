"""Hub ids: parsing, download through the Hub's HTTP API (a local server: no internet), the cache
when offline, and a clear error when a checkpoint is neither."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from services.models.hub import HubReference, parse_hub_reference
from tests.hub_server import HubRepo, HubServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    "reference,expected",
    [
        ("Qwen/Qwen2-VL-2B-Instruct", HubReference("Qwen/Qwen2-VL-2B-Instruct")),
        ("google/gemma-3-4b-it@main", HubReference("google/gemma-3-4b-it", "main")),
        (f"org/name@{COMMIT}", HubReference("org/name", COMMIT)),
        ("tiny", None),
        ("./org/name", None),
        ("/models/org/name", None),
        ("a/b/c", None),
    ],
)
def test_hub_references_are_told_from_paths_and_built_ins(reference, expected):
    assert parse_hub_reference(reference) == expected


def tessera(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.cli.main", *args], capture_output=True, text=True, timeout=120, env=env)


def test_download_then_offline_from_the_cache_then_a_clear_error(tiny_model, tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
    with HubServer([HubRepo("tessera-test/tiny-vl", tiny_model.path, COMMIT)]) as hub:
        env["HF_ENDPOINT"] = hub.endpoint
        fetched = tessera("models", "download", "tessera-test/tiny-vl", env=env)
        assert fetched.returncode == 0, fetched.stderr
        snapshot = fetched.stdout.strip().splitlines()[-1]
        assert snapshot.endswith(COMMIT)
        assert (tiny_model.path / "model.safetensors").read_bytes() == open(f"{snapshot}/model.safetensors", "rb").read()
    offline = {**env, "HF_HUB_OFFLINE": "1"}  # the server is gone too
    assert tessera("models", "download", "tessera-test/tiny-vl", env=offline).stdout.strip().endswith(COMMIT)
    missing = tessera("models", "download", "tessera-test/never-fetched", env=offline)
    assert missing.returncode == 1 and "HF_HUB_OFFLINE=1 forbids downloading it" in missing.stderr
