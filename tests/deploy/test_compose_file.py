"""docker-compose.yml is a valid Compose file and has the shape the deployment relies on.

Offline, no Docker: the file is validated against the Compose Specification schema bundled in
check-jsonschema (``--builtin-schema vendor.compose-spec``), then its structure is asserted: one
service per role, replicas that can be scaled (no container_name, no host ports), healthchecks,
start order, drain-friendly stop settings and settings the roles actually read. deploy/Dockerfile
is checked for what the compose file expects of the image.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
SCHEMA = "vendor.compose-spec"
ROLES = ("preprocess", "encoder", "prefill", "decode", "gateway")
NODE_ROLES = ("preprocess", "encoder", "prefill", "decode")
DATA_ROLES = ("encoder", "prefill", "decode")
HOME = "/data/tessera"
INDEX_URL = "redis://valkey:6379/0"
SECRET_DIR = "/run/tessera-internal"  # the internal secret's volume


@cache
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict:
    return compose()["services"]


def env(name: str) -> dict[str, str]:
    raw = services()[name].get("environment", {})
    assert isinstance(raw, dict), f"{name}: write environment as a mapping"
    return {k: str(v) for k, v in raw.items()}


@cache
def role_settings() -> set[str]:
    """TESSERA_SERVE_* names `tessera serve --role` reads: the fields of the roles' Settings classes
    (parsed, not imported, so this test stays fast)."""
    sources = {
        ROOT / "services" / "transport" / "internal_auth.py": "InternalPlaneSettings",
        ROOT / "services" / "transport" / "node_runtime.py": "NodeSettings",
        ROOT / "services" / "prefill" / "main.py": "Settings",
        ROOT / "services" / "gateway" / "settings.py": "Settings",
    }
    names = set()
    for path, class_name in sources.items():
        tree = ast.parse(path.read_text())
        cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name)
        names |= {
            "TESSERA_SERVE_" + s.target.id.upper() for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        }
    return names


def _check_jsonschema(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", SCHEMA, str(path)], capture_output=True, text=True, timeout=120
    )


def test_compose_file_matches_the_compose_specification_schema():
    result = _check_jsonschema(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_rejects_a_broken_file(tmp_path):
    """The validation above is not vacuous: a misspelt key inside the shared anchor is caught."""
    broken = tmp_path / "docker-compose.yml"
    text = COMPOSE.read_text()
    assert "  stop_grace_period:" in text
    broken.write_text(text.replace("  stop_grace_period:", "  stop_grace_periods:", 1))
    result = _check_jsonschema(broken)
    assert result.returncode != 0 and "stop_grace_periods" in result.stdout


def test_one_service_per_role_plus_valkey_and_the_init_jobs():
    default = {n for n, s in services().items() if not s.get("profiles")}
    assert default == {"valkey", "model-init", "secret-init", *ROLES}
    assert services()["valkey"]["image"].startswith("valkey/valkey:8")


def test_shared_settings_come_from_one_extension_anchor():
    assert any(key.startswith("x-tessera") for key in compose()), "shared parts live in an x-tessera extension"
    shared = ("image", "pull_policy", "volumes", "depends_on", "restart", "stop_signal", "stop_grace_period")
    first = {k: services()[ROLES[0]].get(k) for k in shared}
    for role in ROLES[1:]:
        assert {k: services()[role].get(k) for k in shared} == first, role


@pytest.mark.parametrize("role", ROLES)
def test_every_role_runs_tessera_serve_with_its_role(role):
    command = services()[role]["command"]
    assert isinstance(command, list) and command[:4] == ["tessera", "serve", "--role", role], command
    assert command[4:] == ["--model", "tiny"]


@pytest.mark.parametrize("role", [*ROLES, "model-init", "valkey"])
def test_services_can_be_scaled(role):
    """`docker compose up --scale R=N` needs identical replicas: no fixed name, no host port
    (except on the gateway, which is not scaled)."""
    service = services()[role]
    assert "container_name" not in service
    assert "hostname" not in service
    if role != "gateway":
        assert "ports" not in service, f"{role} publishes host ports; replicas would collide"


def test_only_the_gateway_publishes_ports_8000_and_50051():
    ports = [str(p) for p in services()["gateway"]["ports"]]
    assert ports == ["8000:8000", "50051:50051"]


def test_roles_start_after_valkey_is_healthy_and_the_model_and_secret_are_made():
    for role in ROLES:
        assert services()[role]["depends_on"] == {
            "valkey": {"condition": "service_healthy"},
            "model-init": {"condition": "service_completed_successfully"},
            "secret-init": {"condition": "service_completed_successfully"},
        }, role


def test_every_role_reads_the_internal_secret_that_secret_init_writes():
    init = services()["secret-init"]
    assert init["image"] == services()["model-init"]["image"] and init["command"][:2] == ["python", "-c"]
    compile(init["command"][2], "secret-init", "exec")
    written = init["command"][3]  # then the index password
    assert init["volumes"] == [f"tessera-internal:{SECRET_DIR}"] and written.startswith(SECRET_DIR + "/")
    assert "restart" not in init, "a one-shot job must not restart"
    assert "tessera-internal" in compose()["volumes"]
    for role in ROLES:
        assert env(role)["TESSERA_SERVE_INTERNAL_SECRET_FILE"] == written, role
        assert f"tessera-internal:{SECRET_DIR}:ro" in services()[role]["volumes"], role
        assert not any("SECRET" in arg for arg in services()[role]["command"]), "never a secret on a command line"


def test_model_init_builds_the_model_into_the_shared_volume():
    init = services()["model-init"]
    assert init["command"] == ["tessera", "models", "build", "tiny", "--if-missing"]
    assert env("model-init")["TESSERA_HOME"] == HOME
    assert init["volumes"] == [f"tessera-home:{HOME}"]
    assert init["build"]["dockerfile"] == "deploy/Dockerfile" and (ROOT / init["build"]["context"] / init["build"]["dockerfile"]).is_file()
    assert "tessera-home" in compose()["volumes"]
    assert "restart" not in init or init["restart"] == "no", "a one-shot job must not restart"
    for role in ROLES:
        assert services()[role]["image"] == init["image"], f"{role} runs another image than the one model-init builds"
        assert any(v.split(":")[:2] == ["tessera-home", HOME] for v in services()[role]["volumes"]), role


@pytest.mark.parametrize("role", NODE_ROLES)
def test_node_healthcheck_is_the_grpc_health_service(role):
    check = services()[role]["healthcheck"]
    assert check["test"] == ["CMD", "tessera", "health", "127.0.0.1:50061"]
    assert env(role)["TESSERA_SERVE_GRPC_ADDRESS"].endswith(":50061")


def test_gateway_and_valkey_healthchecks():
    gateway = services()["gateway"]["healthcheck"]["test"]
    assert gateway[:3] == ["CMD", "python", "-c"] and "http://127.0.0.1:8000/health" in gateway[3]
    compile(gateway[3], "healthcheck", "exec")
    valkey = services()["valkey"]["healthcheck"]["test"]
    assert valkey[0] == "CMD-SHELL" and "REDISCLI_AUTH=" in valkey[1] and "valkey-cli ping" in valkey[1]


def test_valkey_requires_the_password_secret_init_writes_and_every_role_reads_it():
    valkey = services()["valkey"]
    password_file = valkey["environment"]["VALKEY_PASSWORD_FILE"]
    assert password_file in services()["secret-init"]["command"][3:]
    assert valkey["depends_on"] == {"secret-init": {"condition": "service_completed_successfully"}}
    assert f"tessera-internal:{SECRET_DIR}:ro" in valkey["volumes"]
    script = valkey["command"][2]
    assert valkey["command"][:2] == ["sh", "-c"] and "requirepass $$(cat" in script and "exec valkey-server -" in script
    for role in ROLES:
        assert env(role)["TESSERA_SERVE_INDEX_PASSWORD_FILE"] == password_file, role


@pytest.mark.parametrize("role", ROLES)
def test_roles_drain_before_docker_kills_them(role):
    service = services()[role]
    assert service["stop_signal"] == "SIGTERM"
    grace = re.fullmatch(r"(\d+)s", service["stop_grace_period"])
    assert grace, service["stop_grace_period"]
    assert int(grace[1]) > float(env(role)["TESSERA_SERVE_DRAIN_TIMEOUT_S"]), "the grace period must exceed the drain timeout"


@pytest.mark.parametrize("role", ROLES)
def test_role_environment(role):
    variables = env(role)
    assert variables["HF_HUB_OFFLINE"] == "1"
    assert variables["TESSERA_HOME"] == HOME
    assert variables["TESSERA_SERVE_INDEX_URL"] == INDEX_URL
    assert float(variables["TESSERA_SERVE_INDEX_TTL_S"]) > 0
    # Unset on purpose: a node bound to 0.0.0.0 advertises its container IP.
    assert "TESSERA_SERVE_ADVERTISE_HOST" not in variables
    unknown = {k for k in variables if k.startswith("TESSERA_SERVE_")} - role_settings()
    assert not unknown, f"settings no role reads (typo?): {sorted(unknown)}"
    if role in NODE_ROLES:
        assert variables["TESSERA_SERVE_GRPC_ADDRESS"] == "0.0.0.0:50061"
        assert variables["TESSERA_SERVE_METRICS_PORT"] == "9090"
        assert ("TESSERA_SERVE_DATA_ADDRESS" in variables) == (role in DATA_ROLES)
    if role in DATA_ROLES:
        assert variables["TESSERA_SERVE_DATA_ADDRESS"] == "tcp://0.0.0.0:50071"


def test_the_gateway_discovers_nodes_through_the_index_only():
    variables = env("gateway")
    assert variables["TESSERA_SERVE_HTTP_HOST"] == "0.0.0.0"
    assert variables["TESSERA_SERVE_HTTP_PORT"] == "8000"
    assert variables["TESSERA_SERVE_GENERATE_ADDRESS"] == "0.0.0.0:50051"
    static = {f"TESSERA_SERVE_{r.upper()}_ADDRESS" for r in NODE_ROLES}
    assert not static & set(variables), "no static address lists: the gateway reads the index"


@pytest.mark.parametrize("role", NODE_ROLES)
def test_node_ports_are_declared(role):
    """Every port a node binds is listed in `expose` (documentation in compose; the local harness
    maps exactly these ports)."""
    exposed = {int(p) for p in services()[role]["expose"]}
    variables = env(role)
    bound = {int(variables["TESSERA_SERVE_GRPC_ADDRESS"].rsplit(":", 1)[1]), int(variables["TESSERA_SERVE_METRICS_PORT"])}
    if "TESSERA_SERVE_DATA_ADDRESS" in variables:
        bound.add(int(variables["TESSERA_SERVE_DATA_ADDRESS"].rsplit(":", 1)[1]))
    assert exposed == bound


def test_dockerfile_builds_the_image_compose_expects():
    text = DOCKERFILE.read_text()
    instructions = [line for line in text.splitlines() if line and not line.lstrip().startswith("#")]
    body = "\n".join(instructions)
    assert instructions[0].strip() == "ARG PYTHON_IMAGE=python:3.11-slim"
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in body
    assert 'pip install --no-deps torch==2.13.0 --index-url "${TORCH_INDEX_URL}"' in body
    assert 'VOLUME ["/data/tessera"]' in body
    assert "python -m compileall" in body
    assert "torchvision" not in body
    assert re.search(r"pip install (--\S+ )*-e \.(\s|$)", body)
    assert re.search(r"\bHF_HUB_OFFLINE=1\b", body) and re.search(rf"\bTESSERA_HOME={HOME}\b", body)
    exposed = {int(p) for line in instructions if line.startswith("EXPOSE") for p in line.split()[1:]}
    assert {8000, 50051, 50061, 50071, 9090} <= exposed
    assert 'CMD ["tessera", "serve", "--host", "0.0.0.0"]' in instructions


def test_no_healthcheck_needs_a_recent_engine():
    """``start_interval`` needs Docker Engine 25; older engines and Podman 4.3 refuse the whole file."""
    for name, service in services().items():
        assert "start_interval" not in (service.get("healthcheck") or {}), name


def test_valkey_does_not_run_as_root():
    user = str(services()["valkey"]["user"])
    assert user.split(":")[0] not in ("0", "root"), user
