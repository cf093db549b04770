"""deploy/helm/tessera renders, with Helm's own Go SDK (the helm-python-sdk wheel, offline), the
same objects as the kustomize base on its defaults, validates strictly, and its values (replicas,
model, GPU, index URL, secret, ServiceMonitor, Ingress) do what they say."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import helm_python
import pytest
import yaml

from tests.deploy.kube_validate import assert_valid_strict
from tests.deploy.test_kubernetes_manifests import _render as render_kustomization

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "tessera"
ROLES = ("preprocess", "encoder", "prefill", "decode", "gateway")
EVERYTHING = {
    "serviceMonitor": {"enabled": True},
    "ingress": {"enabled": True, "className": "nginx", "tlsSecret": "tessera-tls"},
}


def render(values: dict | None = None) -> dict[tuple[str, str], dict]:
    with helm_python.Chart.load(CHART) as chart:
        out = chart.render(values or {}, name="tessera", namespace="tessera")
    docs = [doc for text in out.values() for doc in yaml.safe_load_all(text) if doc]
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}


def _comparable(doc: dict) -> dict:
    """What must match between the two renderings: everything but labels (each tool adds its own
    managed-by), the ConfigMap's hash suffix (kustomize) and the pods' config checksum (Helm)."""
    doc = copy.deepcopy(doc)
    doc["metadata"] = {"name": doc["metadata"]["name"]}
    text = yaml.safe_dump(doc)
    text = re.sub(r"tessera-config-[a-z0-9]{10}", "tessera-config", text)
    doc = yaml.safe_load(text)
    annotations = doc.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations", {})
    annotations.pop("checksum/config", None)
    return doc


def _unhashed(doc: dict) -> str:
    name = doc["metadata"]["name"]
    return re.sub(r"-[a-z0-9]{10}$", "", name) if doc["kind"] == "ConfigMap" else name


def test_the_chart_lints():
    report = helm_python.lint(CHART, strict=True)
    # Helm's severities: 1 info, 2 warning, 3 error.
    assert report["total_charts_linted"] == 1 and not report["errors"], report
    assert not [m for m in report["messages"] if m["severity"] >= 2], report


def test_default_values_render_the_same_objects_as_the_kustomize_base():
    chart = render()
    base = {(doc["kind"], _unhashed(doc)): doc for doc in render_kustomization("base")}
    assert set(chart) == set(base)
    for key in base:
        assert _comparable(chart[key]) == _comparable(base[key]), key


def test_rendered_objects_pass_kubernetes_validate_strict(tmp_path):
    docs = [doc for doc in render(EVERYTHING).values() if doc["apiVersion"] != "monitoring.coreos.com/v1"]
    assert_valid_strict(docs, tmp_path)


def test_replicas_model_gpu_index_and_secret_come_from_values():
    objs = render(
        {
            "roles": {"encoder": {"replicas": 3}, "decode": {"replicas": 2}},
            "image": {"tag": "cuda"},
            "model": {"checkpointClaim": "tessera-models", "checkpointPath": "/models/Qwen2-VL-2B-Instruct"},
            "gpu": {"enabled": True},
            "index": {"url": "rediss://index.example:6380/0"},
            "internalSecret": "my-secret",
        }
    )
    assert objs[("Deployment", "tessera-encoder")]["spec"]["replicas"] == 3
    assert objs[("Deployment", "tessera-decode")]["spec"]["replicas"] == 2
    config = objs[("ConfigMap", "tessera-config")]["data"]
    assert config["TESSERA_SERVE_INDEX_URL"] == "rediss://index.example:6380/0" and config["TESSERA_ENGINE_DEVICE"] == "cuda"
    assert not [key for key in objs if "valkey" in key[1]], "an external index replaces the bundled Valkey"
    for role in ROLES:
        pod = objs[("Deployment", f"tessera-{role}")]["spec"]["template"]["spec"]
        server = pod["containers"][0]
        assert server["image"] == "tessera:cuda" and server["command"][5] == "/models/Qwen2-VL-2B-Instruct"
        assert "initContainers" not in pod
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "tessera-models", "readOnly": True}
        assert volumes["tessera-internal"]["secret"]["secretName"] == "my-secret"
        gpus = server["resources"]["limits"].get("nvidia.com/gpu")
        assert gpus == (1 if role in ("encoder", "prefill", "decode") else None), role


def test_a_checkpoint_claim_without_a_path_is_a_clear_error():
    with pytest.raises(helm_python.HelmError, match="checkpointPath is required"):
        render({"model": {"checkpointClaim": "tessera-models"}})


def test_service_monitor_and_ingress_when_enabled():
    objs = render(EVERYTHING)
    monitor = objs[("ServiceMonitor", "tessera")]["spec"]
    assert monitor["selector"] == {"matchLabels": {"app.kubernetes.io/name": "tessera"}}
    assert {e["port"] for e in monitor["endpoints"]} == {"metrics", "http"}
    for role in ROLES:  # every role's Service has a port a ServiceMonitor endpoint names
        ports = {p["name"] for p in objs[("Service", f"tessera-{role}")]["spec"]["ports"]}
        assert ports & {"metrics", "http"}, role
    ingress = objs[("Ingress", "tessera-gateway")]["spec"]
    backend = ingress["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "tessera-gateway", "port": {"name": "http"}}
    assert ingress["ingressClassName"] == "nginx" and ingress["tls"][0]["secretName"] == "tessera-tls"
    assert ("ServiceMonitor", "tessera") not in render() and ("Ingress", "tessera-gateway") not in render()
