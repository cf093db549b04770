"""Tensors cross a real ZMQ socket intact; the inbox is bounded and waits time out."""

from __future__ import annotations

import threading

import torch

from services.transport.tensor_channel import TensorInbox, TensorSender


def test_tensors_round_trip_with_dtype_shape_and_meta():
    inbox = TensorInbox("tcp://127.0.0.1:*")
    sender = TensorSender()
    try:
        tensors = {"a": torch.randn(3, 4), "b": torch.arange(10, dtype=torch.int64).view(2, 5), "c": torch.randn(7).to(torch.bfloat16)}
        sent = sender.send(inbox.address, "k1", tensors, {"rows": 3})
        message = inbox.wait("k1", timeout_s=5)
        assert message is not None and message.meta == {"rows": 3}
        for name, tensor in tensors.items():
            assert torch.equal(message.tensors[name], tensor)
        assert sent == sum(t.numel() * t.element_size() for t in tensors.values())
    finally:
        sender.close()
        inbox.close()


def test_wait_times_out_and_inbox_drops_oldest_beyond_capacity():
    inbox = TensorInbox("tcp://127.0.0.1:*", capacity_bytes=4000)
    sender = TensorSender()
    try:
        assert inbox.wait("missing", timeout_s=0.2) is None
        for i in range(5):
            sender.send(inbox.address, f"k{i}", {"x": torch.zeros(250)})  # 1000 bytes each
        assert inbox.wait("k4", timeout_s=5) is not None
        assert inbox.num_dropped >= 1
        assert inbox.wait("k0", timeout_s=0.2) is None
    finally:
        sender.close()
        inbox.close()


def test_waiter_wakes_when_message_arrives_later():
    inbox = TensorInbox("tcp://127.0.0.1:*")
    sender = TensorSender()
    try:
        timer = threading.Timer(0.2, lambda: sender.send(inbox.address, "late", {"x": torch.ones(2)}))
        timer.start()
        message = inbox.wait("late", timeout_s=5)
        assert message is not None and torch.equal(message.tensors["x"], torch.ones(2))
    finally:
        sender.close()
        inbox.close()
