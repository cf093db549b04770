"""The image built from deploy/Dockerfile and docker-compose.yml as shipped, run with podman and
podman-compose (tests/deploy/podman_compose.sh says what stands in for the registry's images),
scaled to two encoders: every node registers, and image chat requests through the gateway's
published API equal transformers' greedy output. Building the image takes minutes, so the README's
test command runs this when the packaging it covers changed (image_inputs.py, docs/testing.md);
a pass records that."""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.deploy.image_inputs import record_pass
from tests.factories import chat_case, encode_image, make_image

SCRIPT = Path(__file__).with_name("podman_compose.sh")
NUM_CASES = 12


def _script(command: str, timeout_s: float) -> dict[str, str]:
    """Run the script's ``command``; its ``key=value`` lines."""
    result = subprocess.run(["bash", str(SCRIPT), command], capture_output=True, text=True, timeout=timeout_s)
    assert result.returncode == 0, f"{command}: {result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line and " " not in line.split("=", 1)[0])


@pytest.mark.image
def test_the_shipped_compose_file_serves_image_requests_exactly(oracle):
    if os.geteuid() != 0:
        pytest.skip("podman's bridge networks need root here")
    _script("build", timeout_s=3600)
    try:
        url = _script("up", timeout_s=1500)["gateway_url"]
        nodes = httpx.get(url + "/health", timeout=10).json()["nodes"]
        assert Counter(n["role"] for n in nodes) == {"preprocess": 1, "encoder": 2, "prefill": 1, "decode": 1}
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        for i in range(NUM_CASES):
            image = make_image(48 + 16 * (i % 4), 40 + 12 * (i % 3), seed=500 + i)
            case = chat_case(encode_image(image), f"Question {i}: what is in the picture?")
            reply = client.chat.completions.create(model="tiny", messages=case.body["messages"], temperature=0, max_tokens=12)
            inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
            expected = oracle.tokenizer.decode(oracle.generate(inputs, 12).token_ids, skip_special_tokens=True)
            assert reply.choices[0].message.content == expected, f"case {i}"
        record_pass()
    finally:
        subprocess.run(["bash", str(SCRIPT), "down"], capture_output=True, timeout=300)
