"""tests/deploy/compose_local.py runs docker-compose.yml as local processes: its mapping onto
loopback (fast, nothing started) and, in the slow suite, the whole deployment end to end."""

from __future__ import annotations

import re
import signal
import sys
import time
from collections import Counter

import httpx
import pytest

from tests.deploy.compose_local import ComposeDeployment
from tests.deploy.compose_mapping import plan_replica
from tests.deploy.compose_spec import COMPOSE_FILE, load_compose, one_shot_services, parse_duration, start_layers

ROLES = ("preprocess", "encoder", "prefill", "decode", "gateway")
SCALE = {"preprocess": 1, "encoder": 3, "prefill": 1, "decode": 2, "gateway": 1}
ADDRESS = re.compile(r"(?:[a-z]+://)?([A-Za-z0-9_.-]+):(\d+)")


def test_harness_maps_services_to_loopback(tmp_path):
    services = load_compose(COMPOSE_FILE)
    layers = start_layers(services)
    assert set(layers[0]) == {"model-init", "secret-init"} and set(layers[1]) == {"valkey"} and set(layers[2]) == set(ROLES)
    assert one_shot_services(services) == {"model-init", "secret-init"}

    given: list[int] = []

    def allocate() -> int:
        given.append(24000 + len(given))
        return given[-1]

    valkey_port = 23999
    home, secrets = tmp_path / "home", tmp_path / "secrets"
    volume_dirs = {"tessera-home": home, "tessera-internal": secrets}
    plans = [
        plan_replica(services[role], n, service_ports={"valkey": {6379: valkey_port}}, volume_dirs=volume_dirs, allocate_port=allocate)
        for role, count in SCALE.items()
        for n in range(1, count + 1)
    ]
    assert Counter(p.service for p in plans) == Counter(SCALE)
    # every replica has its own ports, and nothing else got one
    all_ports = [port for p in plans for port in p.ports.values()]
    assert len(all_ports) == len(set(all_ports)) == len(given)
    for plan in plans:
        texts = [*plan.argv, *plan.env.values(), *(plan.healthcheck or ())]
        assert plan.argv[:6] == (sys.executable, "-m", "services.cli.main", "serve", "--role", plan.service)
        for text in texts:
            assert "0.0.0.0" not in text and "valkey" not in text and "/data/tessera" not in text, (plan.service, text)
            for host, port in ADDRESS.findall(text):
                if port.isdigit():
                    assert host == "127.0.0.1", (plan.service, text)
                    assert int(port) in (*plan.ports.values(), valkey_port), (plan.service, text)
        env = plan.env
        assert env["TESSERA_SERVE_INDEX_URL"] == f"redis://127.0.0.1:{valkey_port}/0"
        assert env["TESSERA_SERVE_ADVERTISE_HOST"] == "127.0.0.1"
        assert env["TESSERA_HOME"] == str(home) and env["HF_HUB_OFFLINE"] == "1"
        assert env["TESSERA_SERVE_INTERNAL_SECRET_FILE"] == str(secrets / "secret")
        if plan.service == "gateway":
            assert env["TESSERA_SERVE_HTTP_HOST"] == "127.0.0.1"
            assert env["TESSERA_SERVE_HTTP_PORT"] == str(plan.ports[8000])
            assert env["TESSERA_SERVE_GENERATE_ADDRESS"] == f"127.0.0.1:{plan.ports[50051]}"
            assert f"http://127.0.0.1:{plan.ports[8000]}/health" in plan.healthcheck[-1]
            assert plan.healthcheck[0] == sys.executable
        else:
            assert env["TESSERA_SERVE_GRPC_ADDRESS"] == f"127.0.0.1:{plan.ports[50061]}"
            assert env["TESSERA_SERVE_METRICS_PORT"] == str(plan.ports[9090])
            assert plan.healthcheck == (sys.executable, "-m", "services.cli.main", "health", f"127.0.0.1:{plan.ports[50061]}")
            if "TESSERA_SERVE_DATA_ADDRESS" in env:
                assert env["TESSERA_SERVE_DATA_ADDRESS"] == f"tcp://127.0.0.1:{plan.ports[50071]}"
    init = plan_replica(services["model-init"], 1, service_ports={}, volume_dirs={"tessera-home": home}, allocate_port=allocate)
    assert init.argv == (sys.executable, "-m", "services.cli.main", "models", "build", "tiny", "--if-missing")
    assert init.env["TESSERA_HOME"] == str(home) and init.ports == {}
    secret_init = plan_replica(services["secret-init"], 1, service_ports={}, volume_dirs=volume_dirs, allocate_port=allocate)
    assert secret_init.argv[0] == sys.executable and secret_init.argv[-2:] == (str(secrets / "secret"), str(secrets / "index-password"))


def test_harness_reads_stop_and_health_timing_from_the_file():
    services = load_compose(COMPOSE_FILE)
    assert parse_duration("1m30s") == 90 and parse_duration("300ms") == 0.3
    for role in ROLES:
        assert services[role].stop_signal == signal.SIGTERM and services[role].stop_grace_s == 45
        assert services[role].healthcheck is not None


def test_undeclared_ports_are_refused(tmp_path):
    """An address on a port the service does not declare cannot be mapped: fail loudly."""
    text = COMPOSE_FILE.read_text().replace(
        'TESSERA_SERVE_METRICS_PORT: "9090"', 'TESSERA_SERVE_METRICS_PORT: "9090"\n  TESSERA_SERVE_NODE_ID: 0.0.0.0:1234', 1
    )
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text)
    services = load_compose(broken)
    with pytest.raises(ValueError, match="1234"):
        plan_replica(
            services["encoder"],
            1,
            service_ports={"valkey": {6379: 1}},
            volume_dirs={"tessera-home": tmp_path, "tessera-internal": tmp_path},
            allocate_port=iter(range(30000, 30100)).__next__,
        )


def test_compose_deployment_serves_scales_and_drains(tmp_path):
    """The compose file, run as local processes: a request through the gateway, scale-out and
    scale-in of encoders (the removed one drains and exits 0), and a clean `down`."""
    from tests.factories import chat_case, encode_image, make_image

    with ComposeDeployment(COMPOSE_FILE, tmp_path, startup_timeout_s=420) as deployment:
        deployment.up(scale={"encoder": 2, "decode": 1})
        assert len(deployment.replicas("encoder")) == 2
        assert deployment.healthy(run_command=True)
        health = httpx.get(deployment.gateway_url + "/health", timeout=10).json()
        assert Counter(n["role"] for n in health["nodes"]) == {"preprocess": 1, "encoder": 2, "prefill": 1, "decode": 1}

        case = chat_case(encode_image(make_image(64, 64, seed=1)), "What is this?")
        body = {"model": "tiny", "messages": case.body["messages"], "max_tokens": 4, "temperature": 0}
        reply = httpx.post(deployment.gateway_url + "/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4

        assert deployment.scale("encoder", 1) == [0]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            nodes = httpx.get(deployment.gateway_url + "/health", timeout=10).json()["nodes"]
            if sum(n["role"] == "encoder" for n in nodes) == 1:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the scaled-in encoder is still registered")
        reply = httpx.post(deployment.gateway_url + "/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
