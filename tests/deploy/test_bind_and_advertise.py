"""Every deployment target binds and advertises as the multi-host harness proves right
(tests/deploy/test_netns_hosts.py): each node binds the wildcard address and hands peers only an
address that reaches it from another host. The settings each target gives a role (compose's
environment; the kustomize base's and the Helm chart's ConfigMap and pod env) are run through
the function the nodes run at start (``node_addresses``), on a host whose name resolves to
loopback unless the target says otherwise, with the target's own remote index URL: a target
that relied on a bound or loopback address would be refused here, as its nodes would be."""

from __future__ import annotations

import socket

import pytest

from services.stack.roles import ROLES_WITH_INBOX, settings_class
from services.transport.addresses import AdvertiseError
from services.transport.node_runtime import node_addresses
from shared.settings import dataclass_from_sources
from tests.deploy.compose_spec import COMPOSE_FILE, load_compose
from tests.deploy.test_helm_chart import render as render_chart
from tests.deploy.test_kubernetes_manifests import _config, _index
from tests.deploy.test_kubernetes_manifests import _render as render_kustomization

NODE_ROLES = ("preprocess", "encoder", "prefill", "decode")
POD_IP = "10.244.3.17"  # what the downward API would give the pod
CONTAINER_IP = "172.20.0.9"  # what a container's /etc/hosts maps its host name to
ENV_PREFIX = "TESSERA_SERVE_"


def _settings(role: str, env: dict[str, str]):
    return dataclass_from_sources(settings_class(role), ENV_PREFIX, None, env=env)


def _resolving_host_name_to(monkeypatch, address: str) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "node-host")
    real = socket.gethostbyname
    monkeypatch.setattr(socket, "gethostbyname", lambda name: address if name == "node-host" else real(name))
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):  # service names resolve to another host, as their DNS would
        if host in ("valkey", "tessera-valkey"):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.96.0.10", 0))]
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def _check(role: str, env: dict[str, str], expected_host: str) -> None:
    settings = _settings(role, env)
    assert settings.grpc_address.startswith("0.0.0.0:"), (role, settings.grpc_address)
    addresses = node_addresses(settings, with_inbox=role in ROLES_WITH_INBOX)
    assert addresses.grpc == f"{expected_host}:{settings.grpc_address.rpartition(':')[2]}"
    if role in ROLES_WITH_INBOX:
        assert settings.data_address.startswith("tcp://0.0.0.0:"), (role, settings.data_address)
        assert addresses.data_host == expected_host


def _compose_env(role: str) -> dict[str, str]:
    return dict(load_compose(COMPOSE_FILE)[role].environment)


def _pod_env(objs: dict, role: str) -> dict[str, str]:
    env = dict(_config(objs)["data"])
    container = objs[("Deployment", f"tessera-{role}")]["spec"]["template"]["spec"]["containers"][0]
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[item["name"]] = POD_IP
    return env


@pytest.mark.parametrize("role", NODE_ROLES)
def test_compose_nodes_bind_the_wildcard_and_advertise_their_container_ip(role, monkeypatch):
    _resolving_host_name_to(monkeypatch, CONTAINER_IP)
    env = _compose_env(role)
    assert "TESSERA_SERVE_ADVERTISE_HOST" not in env  # the container's own address, by its name
    _check(role, env, CONTAINER_IP)


def test_compose_nodes_on_a_host_whose_name_means_loopback_refuse_to_start(monkeypatch):
    _resolving_host_name_to(monkeypatch, "127.0.1.1")
    with pytest.raises(AdvertiseError, match="--advertise-host"):
        node_addresses(_settings("encoder", _compose_env("encoder")))


@pytest.mark.parametrize("role", NODE_ROLES)
def test_kustomize_and_helm_nodes_bind_the_wildcard_and_advertise_the_pod_ip(role, monkeypatch):
    _resolving_host_name_to(monkeypatch, "127.0.0.1")  # the pod's name is never relied on
    for objs in (_index(render_kustomization("base")), render_chart()):
        _check(role, _pod_env(objs, role), POD_IP)
