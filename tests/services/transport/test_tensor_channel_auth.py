"""The tensor channel with the internal secret: a message that is forged (another key, no tag),
altered in any frame, garbage, or carries a frame over the size limit is dropped and counted, and
the inbox keeps receiving the good messages that follow."""

from __future__ import annotations

import json
import time

import torch
import zmq

from services.transport.frame_mac import frames_tag
from services.transport.internal_auth import InternalAuth
from services.transport.tensor_channel import ChannelAuth, TensorInbox, TensorSender
from shared.node_metrics import snapshot

AUTH = ChannelAuth(key=InternalAuth(b"the-cluster-secret-0123456789").tensor_key)
OTHER = ChannelAuth(key=InternalAuth(b"another-cluster-secret-987654").tensor_key)
HEADER = {"key": "x", "meta": {}, "tensors": [{"name": "a", "dtype": "float32", "shape": [2]}]}


def _raw_sender(address: str) -> zmq.Socket:
    socket = zmq.Context.instance().socket(zmq.PUSH)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(address)
    return socket


def _wait_until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert condition()


def _good_message_arrives(inbox: TensorInbox, key: str) -> None:
    sender = TensorSender(auth=AUTH)
    try:
        sender.send(inbox.address, key, {"a": torch.arange(3.0)}, {"n": 3})
        message = inbox.wait(key, timeout_s=5)
        assert message is not None and message.meta == {"n": 3} and torch.equal(message.tensors["a"], torch.arange(3.0))
    finally:
        sender.close()


def test_only_messages_signed_with_the_cluster_key_get_in():
    inbox = TensorInbox("tcp://127.0.0.1:*", auth=AUTH)
    raw = _raw_sender(inbox.address)
    forger, unsigned = TensorSender(auth=OTHER), TensorSender()
    try:
        _good_message_arrives(inbox, "first")
        forger.send(inbox.address, "forged", {"a": torch.ones(2)})
        unsigned.send(inbox.address, "unsigned", {"a": torch.ones(2)})
        header, tensor = json.dumps(HEADER).encode(), torch.ones(2).numpy().tobytes()
        tag = frames_tag(AUTH.key, [header, tensor])
        bad = [
            [tag, header, torch.zeros(2).numpy().tobytes()],  # a tensor frame altered after signing
            [tag, header.replace(b'"x"', b'"y"'), tensor],  # the header altered (another request's key)
            [tag, header, tensor[:4], tensor[4:]],  # frames re-split
            [tag, header],  # a frame left out
            [b"\xff" * 32],  # garbage
            [b"", b"", b""],
            [tag[:16], header, tensor],  # a truncated tag
        ]
        for frames in bad:
            raw.send_multipart(frames)
        _wait_until(lambda: inbox.metrics.num_unauthenticated.value == 2 + len(bad))
        assert inbox.wait("forged", 0.1) is None and inbox.wait("unsigned", 0.1) is None
        assert inbox.wait("x", 0.1) is None and inbox.wait("y", 0.1) is None
        _good_message_arrives(inbox, "after")
        # Signed but malformed: authenticated, then refused by the decoder.
        garbage = b"\xff not json"
        raw.send_multipart([frames_tag(AUTH.key, [garbage]), garbage])
        _wait_until(lambda: inbox.metrics.num_malformed.value == 1)
        counters = snapshot(inbox.metrics).counters
        assert counters["tensor_messages_dropped_unauthenticated_total"] == 2 + len(bad)
        assert counters["tensor_messages_dropped_malformed_total"] == 1
        _good_message_arrives(inbox, "last")
    finally:
        raw.close()
        forger.close()
        unsigned.close()
        inbox.close()


def test_a_frame_over_the_limit_is_cut_off_and_the_inbox_goes_on():
    inbox = TensorInbox("tcp://127.0.0.1:*", auth=ChannelAuth(key=AUTH.key, max_frame_bytes=64 * 1024))
    big = TensorSender(auth=AUTH)
    try:
        _good_message_arrives(inbox, "before")
        big.send(inbox.address, "big", {"a": torch.zeros(32 * 1024)})  # 128 KiB in one frame
        # ZMQ closes that sender's connection before reading the frame; the closure is counted.
        _wait_until(lambda: inbox.metrics.num_disconnects.value >= 1)
        assert inbox.wait("big", 0.2) is None
        _good_message_arrives(inbox, "after")
    finally:
        big.close()
        inbox.close()


def test_without_a_key_messages_carry_no_tag():
    """An open cluster (no secret) keeps the wire format it always had."""
    inbox = TensorInbox("tcp://127.0.0.1:*")
    sender = TensorSender()
    try:
        sender.send(inbox.address, "k", {"a": torch.ones(2)})
        assert inbox.wait("k", 5) is not None
        signed = TensorSender(auth=AUTH)
        signed.send(inbox.address, "signed", {"a": torch.ones(2)})  # a tag frame where a header belongs
        _wait_until(lambda: inbox.metrics.num_malformed.value == 1)
        signed.close()
    finally:
        sender.close()
        inbox.close()
