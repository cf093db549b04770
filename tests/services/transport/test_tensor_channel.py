"""Tensors cross a real ZMQ socket intact; the inbox is bounded and waits time out."""

from __future__ import annotations

import threading
import time

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
        assert inbox.metrics.num_dropped.value >= 1
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


def test_malformed_messages_are_dropped_and_the_inbox_keeps_receiving():
    import json

    import zmq

    inbox = TensorInbox("tcp://127.0.0.1:*")
    raw = zmq.Context.instance().socket(zmq.PUSH)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(inbox.address)
    sender = TensorSender()
    try:
        good_header = {"key": "x", "meta": {}, "tensors": [{"name": "a", "dtype": "float32", "shape": [2]}]}
        bad = [
            [b"\xff not json"],
            [json.dumps([1, 2]).encode()],
            [json.dumps(good_header).encode()],  # a tensor declared, no frame sent
            [json.dumps({**good_header, "tensors": [{"name": "a", "dtype": "complex512", "shape": [2]}]}).encode(), b"12345678"],
            [json.dumps({**good_header, "tensors": [{"name": "a", "dtype": "float32", "shape": [3]}]}).encode(), b"12345678"],
        ]
        for frames in bad:
            raw.send_multipart(frames)
        sender.send(inbox.address, "after", {"a": torch.ones(2)})
        message = inbox.wait("after", timeout_s=5)
        assert message is not None and torch.equal(message.tensors["a"], torch.ones(2))
        # Two sending sockets are fair-queued, so the good message may overtake the bad ones.
        deadline = time.monotonic() + 5
        while inbox.metrics.num_malformed.value < len(bad) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert inbox.metrics.num_malformed.value == len(bad)
    finally:
        raw.close()
        sender.close()
        inbox.close()


def test_a_send_to_a_peer_that_never_reads_times_out_instead_of_blocking():
    import pytest
    import zmq

    from services.stack.node_process import free_port
    from services.transport.tensor_channel import TensorSendTimeoutError

    silent = zmq.Context.instance().socket(zmq.PULL)  # connected, never reads: its queue fills
    silent.setsockopt(zmq.RCVHWM, 1)
    silent.setsockopt(zmq.LINGER, 0)
    address = f"tcp://127.0.0.1:{free_port()}"
    silent.bind(address)
    sender = TensorSender(send_timeout_s=0.3, high_water_mark=1)
    try:
        with pytest.raises(TensorSendTimeoutError, match="did not take"):
            for i in range(1000):  # bounded: the queues hold a few messages at most
                sender.send(address, f"k{i}", {"x": torch.zeros(1 << 16)})
    finally:
        sender.close()
        silent.close()


def test_unclaimed_messages_expire_and_the_inbox_reports_what_it_holds():
    inbox = TensorInbox("tcp://127.0.0.1:0", max_age_s=0.3, capacity_bytes=1 << 20)
    sender = TensorSender()
    try:
        sender.send(inbox.address, "orphan", {"x": torch.zeros(256)})  # nobody will wait for it
        deadline = time.monotonic() + 5
        held = inbox.metrics.held
        while held.used.value == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (held.used.value, held.capacity.value) == (1024, 1 << 20)
        while inbox.metrics.num_expired.value == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert inbox.metrics.num_expired.value == 1
        assert held.used.value == 0
        assert inbox.wait("orphan", 0.01) is None
        sender.send(inbox.address, "fresh", {"x": torch.ones(4)})  # and it goes on receiving
        assert inbox.wait("fresh", 5) is not None
    finally:
        sender.close()
        inbox.close()


def test_a_coroutine_awaits_a_message_without_holding_a_thread():
    """``arrival``: the message pushed while a coroutine awaits it, one already there, a key that
    never comes (None after the timeout, promptly), and waiters on two keys at once, all on one
    loop whose only thread is its own."""
    import asyncio

    inbox = TensorInbox("tcp://127.0.0.1:*")
    sender = TensorSender()

    async def scenario() -> None:
        threads = threading.active_count()
        later = asyncio.ensure_future(inbox.arrival("later", 10))
        other = asyncio.ensure_future(inbox.arrival("other", 10))
        await asyncio.sleep(0.2)
        assert threading.active_count() == threads  # awaiting holds no thread
        sender.send(inbox.address, "later", {"x": torch.ones(3)})
        message = await later
        assert message is not None and torch.equal(message.tensors["x"], torch.ones(3))
        assert not other.done()
        sender.send(inbox.address, "early", {"x": torch.zeros(2)})
        await asyncio.sleep(0.3)
        assert (await inbox.arrival("early", 0.0)) is not None  # already there
        started = time.monotonic()
        assert await inbox.arrival("never", 0.3) is None
        assert time.monotonic() - started < 2.0
        sender.send(inbox.address, "other", {"x": torch.ones(1)})
        assert (await other) is not None

    try:
        asyncio.run(scenario())
    finally:
        sender.close()
        inbox.close()


def test_closing_the_inbox_wakes_its_awaiting_coroutines():
    import asyncio

    inbox = TensorInbox("tcp://127.0.0.1:*")

    async def scenario() -> None:
        waiter = asyncio.ensure_future(inbox.arrival("k", 30))
        await asyncio.sleep(0.1)
        started = time.monotonic()
        await asyncio.to_thread(inbox.close)
        assert await waiter is None and time.monotonic() - started < 5.0

    asyncio.run(scenario())
