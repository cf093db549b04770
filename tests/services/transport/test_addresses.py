"""Bound versus advertised addresses (services/transport/addresses.py): what a node advertises for
each way it may be configured, and the starts it refuses because peers could not dial it."""

from __future__ import annotations

import logging
import socket

import pytest

from services.transport.addresses import (
    AdvertisedAddress,
    AdvertiseError,
    BoundAddress,
    advertise,
    advertised_host,
    index_is_remote,
    is_loopback_host,
    split_host_port,
)
from services.transport.node_runtime import NodeSettings, node_addresses
from services.transport.tensor_channel import TensorInbox, TensorSender

REMOTE_INDEX = "redis://192.0.2.10:6379/0"  # TEST-NET-1: resolved, never dialled


def _hostname_resolves_to(monkeypatch, address: str) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "node-host")
    monkeypatch.setattr(socket, "gethostbyname", lambda name: address if name == "node-host" else "0.0.0.0")


def test_a_bound_address_keeps_its_wildcard_and_an_advertised_one_is_what_goes_on_the_wire():
    bound = BoundAddress.parse("tcp://0.0.0.0:50071")
    assert bound.is_wildcard and (bound.host, bound.port, bound.scheme) == ("0.0.0.0", 50071, "tcp://")
    assert not isinstance(bound, str)  # a bound address cannot be put on the wire by mistake
    advertised = advertise(bound, "10.4.0.7")
    assert advertised == "tcp://10.4.0.7:50071" and isinstance(advertised, AdvertisedAddress)
    assert split_host_port(advertised) == ("10.4.0.7", 50071)
    assert advertise(BoundAddress.parse("0.0.0.0:50061"), "encoder-1.tessera") == "encoder-1.tessera:50061"


def test_the_advertised_host_is_the_configured_one_else_the_bind_host_else_the_host_names_address(monkeypatch):
    _hostname_resolves_to(monkeypatch, "172.18.0.5")  # a container's /etc/hosts
    assert advertised_host("0.0.0.0", "10.0.0.9", REMOTE_INDEX) == "10.0.0.9"
    assert advertised_host("172.18.0.5", "", REMOTE_INDEX) == "172.18.0.5"
    assert advertised_host("0.0.0.0", "", REMOTE_INDEX) == "172.18.0.5"
    assert advertised_host("::", "", REMOTE_INDEX) == "172.18.0.5"


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::", "*"])
def test_a_wildcard_is_never_advertised(wildcard):
    with pytest.raises(AdvertiseError, match="--advertise-host .* is a wildcard"):
        advertised_host("0.0.0.0", wildcard, "")


def test_loopback_with_a_remote_index_refuses_naming_advertise_host(monkeypatch):
    _hostname_resolves_to(monkeypatch, "127.0.1.1")  # Debian's /etc/hosts for the machine's name
    with pytest.raises(AdvertiseError, match=r"loopback address 127\.0\.1\.1 .*192\.0\.2\.10.*--advertise-host"):
        advertised_host("0.0.0.0", "", REMOTE_INDEX)
    with pytest.raises(AdvertiseError, match="--advertise-host"):
        advertised_host("127.0.0.1", "", REMOTE_INDEX)
    with pytest.raises(AdvertiseError, match=r"from --advertise-host"):
        advertised_host("0.0.0.0", "localhost", REMOTE_INDEX)


def test_loopback_is_fine_while_the_index_is_on_this_host_or_absent(monkeypatch):
    _hostname_resolves_to(monkeypatch, "127.0.0.1")
    for url in ("", "memory://", "redis://127.0.0.1:6379/0", "redis://localhost:6379/0", "redis://[::1]:6379/0", "unix:///run/valkey.sock"):
        assert advertised_host("0.0.0.0", "", url) == "127.0.0.1", url


def test_where_the_index_is():
    assert not index_is_remote("redis://127.0.0.5:6379/0")
    assert index_is_remote(REMOTE_INDEX)
    assert index_is_remote("rediss://valkey.example.invalid:6380/0")  # does not resolve: surely not this host
    assert is_loopback_host("::1") and is_loopback_host("[::1]") and is_loopback_host("LOCALHOST")
    assert not is_loopback_host("0.0.0.0") and not is_loopback_host("10.0.0.1")


def test_a_node_with_a_wildcard_and_a_remote_index_refuses_before_anything_starts(monkeypatch):
    _hostname_resolves_to(monkeypatch, "127.0.0.1")
    settings = NodeSettings(grpc_address="0.0.0.0:50061", data_address="tcp://0.0.0.0:50071", index_url=REMOTE_INDEX)
    with pytest.raises(AdvertiseError, match="TESSERA_SERVE_ADVERTISE_HOST"):
        node_addresses(settings)
    fixed = NodeSettings(
        grpc_address="0.0.0.0:50061", data_address="tcp://0.0.0.0:50071", index_url=REMOTE_INDEX, advertise_host="198.51.100.4"
    )
    addresses = node_addresses(fixed)
    assert addresses.grpc == "198.51.100.4:50061" and addresses.data_host == "198.51.100.4"


def test_an_inbox_bound_to_a_wildcard_hands_out_its_advertised_address():
    inbox = TensorInbox("tcp://0.0.0.0:0", advertise_host="127.0.0.1")
    try:
        assert inbox.bound_address.is_wildcard and inbox.bound_address.port > 0
        assert inbox.address == f"tcp://127.0.0.1:{inbox.bound_address.port}"
    finally:
        inbox.close()


def test_a_wait_in_vain_names_the_sender_and_the_address_it_was_given(caplog):
    inbox = TensorInbox("tcp://0.0.0.0:0", advertise_host="127.0.0.1")
    sender = TensorSender()
    try:
        with caplog.at_level(logging.WARNING, logger="tessera"):
            assert inbox.wait("mm-1", 0.05, sender="encoder-2:50061", what="embeddings of image") is None
        [record] = [r for r in caplog.records if "in vain" in r.getMessage()]
        message = record.getMessage()
        assert "embeddings of image mm-1 from encoder-2:50061" in message
        assert f"told to send it to tcp://127.0.0.1:{inbox.bound_address.port}" in message
        assert "bound at tcp://0.0.0.0:" in message
        caplog.clear()
        assert inbox.wait("mm-2", 0.0, sender="encoder-2:50061") is None  # a look, not a wait: nothing logged
        sender.send(inbox.address, "mm-3", {})
        assert inbox.wait("mm-3", 10.0, sender="encoder-2:50061") is not None
        assert not [r for r in caplog.records if "in vain" in r.getMessage()]
    finally:
        sender.close()
        inbox.close()
