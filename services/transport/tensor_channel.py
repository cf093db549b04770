"""Bulk tensors over ZMQ: multipart messages to a receiver's data address.

One message is a JSON header and a frame per tensor (services/transport/tensor_wire.py).
Receivers bind a PULL socket; senders keep one PUSH socket per destination. A receiver's inbox
is bounded in bytes: when full, the oldest unclaimed message is dropped (its consumer times out
and falls back), so a slow consumer can never exhaust memory.

With a key (``ChannelAuth.key``, derived from the cluster's shared secret), frame 0 of every
message is an HMAC-SHA256 tag over the others (services/transport/frame_mac.py says why HMAC),
and a receiver drops any message whose tag does not verify. Every inbox sets ZMQ's MAXMSGSIZE to
``max_frame_bytes``: ZMQ closes the connection of a sender that announces a larger frame before
allocating it, which bounds what a peer can make a node buffer before its tag is checked. ZMQ
reports that only as a closed connection, so it is counted with the senders that disconnected.

Faults stay local: a malformed (bad header, frame count, dtype or shape) or unauthenticated
message is counted by reason and dropped, and the receive thread goes on; a send that a
destination does not take within ``send_timeout_s`` (its queue of ``high_water_mark`` messages
is full: the peer is gone or stalled) raises TensorSendTimeoutError instead of blocking its caller
forever, and blocks only sends to that destination meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch
import zmq
from zmq.utils.monitor import recv_monitor_message

from services.transport.addresses import AdvertisedAddress, BoundAddress, advertise, advertised_host
from services.transport.channel_auth import OPEN_CHANNEL, ChannelAuth
from services.transport.frame_mac import frames_tag, verify_frames
from services.transport.tensor_wire import MalformedMessageError, TensorMessage, decode_message, encode_message
from shared.cache_gauges import CacheGauges, cache_gauges
from shared.node_metrics import Counter, counter

log = logging.getLogger("tessera")


@dataclass(slots=True)
class InboxMetrics:
    """Messages an inbox dropped, by reason, sender connections closed, and the bytes it holds."""

    num_malformed: Counter = counter("tensor_messages_dropped_malformed_total", "Tensor messages dropped: malformed")
    num_unauthenticated: Counter = counter(
        "tensor_messages_dropped_unauthenticated_total", "Tensor messages dropped: their tag did not verify"
    )
    num_dropped: Counter = counter("tensor_messages_dropped_inbox_full_total", "Unclaimed tensor messages dropped when the inbox was full")
    num_disconnects: Counter = counter(
        "tensor_sender_disconnects_total", "Sender connections closed: the sender stopped, or sent a frame over the limit"
    )
    num_expired: Counter = counter("tensor_messages_expired_total", "Unclaimed tensor messages dropped for their age")
    held: CacheGauges = cache_gauges("tensor_inbox", "bytes")


class TensorSendTimeoutError(Exception):
    pass


class TensorSender:
    def __init__(
        self,
        context: zmq.Context | None = None,
        *,
        send_timeout_s: float = 10.0,
        high_water_mark: int = 64,
        auth: ChannelAuth = OPEN_CHANNEL,
    ) -> None:
        self._context = context or zmq.Context.instance()
        self._key = auth.key
        self._sockets: dict[str, zmq.Socket] = {}
        self._address_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()  # guards the two maps; a send holds only its address's lock
        self.send_timeout_s = send_timeout_s
        self.high_water_mark = high_water_mark
        self.num_bytes_sent = 0

    def send(self, address: str, key: str, tensors: dict[str, torch.Tensor], meta: dict | None = None) -> int:
        """Push ``tensors`` under ``key`` to the inbox peers reach at ``address`` (advertised)."""
        header, frames = encode_message(key, tensors, meta)
        message = [header, *frames]
        if self._key is not None:
            message.insert(0, frames_tag(self._key, message))
        socket, lock = self._socket_for(address)
        with lock:
            try:
                socket.send_multipart(message, copy=False)
            except zmq.Again:
                raise TensorSendTimeoutError(
                    f"{address} did not take {key!r} within {self.send_timeout_s:g}s: "
                    f"its queue of {self.high_water_mark} messages is full (the receiver is gone or stalled)"
                ) from None
        size = sum(len(f) for f in frames)
        with self._lock:
            self.num_bytes_sent += size
        return size

    def _socket_for(self, address: str) -> tuple[zmq.Socket, threading.Lock]:
        with self._lock:
            socket = self._sockets.get(address)
            if socket is None:
                socket = self._context.socket(zmq.PUSH)
                socket.setsockopt(zmq.LINGER, 1000)
                socket.setsockopt(zmq.SNDHWM, self.high_water_mark)
                socket.setsockopt(zmq.SNDTIMEO, int(self.send_timeout_s * 1000))
                socket.connect(address)
                self._sockets[address] = socket
                self._address_locks[address] = threading.Lock()
            return socket, self._address_locks[address]

    def close(self) -> None:
        with self._lock:
            for socket in self._sockets.values():
                socket.close()
            self._sockets.clear()


class TensorInbox:
    """Binds ``bind`` and keeps received messages until claimed with ``wait``. Senders dial
    ``address``: the bound endpoint at ``advertise_host`` (services/transport/addresses.py; by
    default the bind host, or this host's own address for a wildcard)."""

    def __init__(
        self,
        bind: str,
        *,
        advertise_host: str | None = None,
        capacity_bytes: int = 1 << 30,
        max_age_s: float = 120.0,
        context: zmq.Context | None = None,
        auth: ChannelAuth = OPEN_CHANNEL,
    ) -> None:
        self._context = context or zmq.Context.instance()
        self._key = auth.key
        self._socket = self._context.socket(zmq.PULL)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, auth.max_frame_bytes)
        # ZMQ reports a frame over MAXMSGSIZE only by closing that connection: watch closures.
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._socket.bind(bind)
        self.bound_address = BoundAddress.parse(self._socket.getsockopt_string(zmq.LAST_ENDPOINT))
        host = advertise_host if advertise_host is not None else advertised_host(self.bound_address.host)
        self.address: AdvertisedAddress = advertise(self.bound_address, host)
        self.capacity_bytes = capacity_bytes
        # Unclaimed messages (their request was cancelled, or its waiter timed out) are dropped
        # after max_age_s: without it they stayed until the inbox filled, up to capacity_bytes of
        # a process's memory (docs/benchmarks.md, "Measurements behind code comments"). Every waiter waits
        # far less than this; a pixel message that expires anyway is resent on request.
        self.max_age_s = max_age_s
        self._next_expiry_check = 0.0
        self.max_frame_bytes = auth.max_frame_bytes
        self._messages: OrderedDict[str, TensorMessage] = OrderedDict()
        self._num_bytes = 0
        self._cond = threading.Condition()
        # Coroutines awaiting a key (``arrival``): woken through their own loop by the receive thread.
        self._key_to_waiters: dict[str, list[asyncio.Future]] = {}
        self._closed = False
        self.metrics = InboxMetrics()
        self.metrics.held.read_from(lambda: self._num_bytes, lambda: self.capacity_bytes)
        self._thread = threading.Thread(target=self._receive_loop, name="tensor-inbox", daemon=True)
        self._thread.start()

    def wait(self, key: str, timeout_s: float, *, sender: str = "", what: str = "") -> TensorMessage | None:
        """The message pushed under ``key``, or None after ``timeout_s``, blocking this thread. A
        wait in vain for a named ``sender`` is logged with the address this node gave it: the
        operator's one clue when tensors go to the wrong place (a peer told a bound wildcard
        pushes to itself)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while key not in self._messages:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    self._log_in_vain(key, timeout_s, sender, what)
                    return None
                self._cond.wait(remaining)
            return self._claim(key)

    async def arrival(self, key: str, timeout_s: float, *, sender: str = "", what: str = "") -> TensorMessage | None:
        """``wait`` for an event loop: the message pushed under ``key``, or None after
        ``timeout_s``, awaited without holding a thread."""
        deadline = time.monotonic() + timeout_s
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if key in self._messages:
                    return self._claim(key)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    self._log_in_vain(key, timeout_s, sender, what)
                    return None
                woken = loop.create_future()
                self._key_to_waiters.setdefault(key, []).append(woken)
            try:
                await asyncio.wait_for(woken, remaining)
            except TimeoutError:
                pass
            finally:
                with self._cond:
                    waiters = self._key_to_waiters.get(key, [])
                    if woken in waiters:
                        waiters.remove(woken)
                    if not waiters:
                        self._key_to_waiters.pop(key, None)

    def _claim(self, key: str) -> TensorMessage:
        """Under ``_cond``: take the message off the inbox."""
        message = self._messages.pop(key)
        self._num_bytes -= message.num_bytes
        return message

    def _wake(self, futures: list[asyncio.Future]) -> None:
        """Under ``_cond``, on any thread: wake coroutines awaiting a key, each on its own loop."""
        for future in futures:
            try:
                future.get_loop().call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # its loop has closed: nobody is waiting any more
                pass

    def _log_in_vain(self, key: str, timeout_s: float, sender: str, what: str) -> None:
        if sender and timeout_s > 0 and not self._closed:
            log.warning(
                "waited %.3gs in vain for %s %s from %s, which was told to send it to %s (this inbox is bound at %s)",
                timeout_s,
                what or "tensors",
                key,
                sender,
                self.address,
                self.bound_address,
            )

    def discard(self, key: str) -> None:
        with self._cond:
            message = self._messages.pop(key, None)
            if message is not None:
                self._num_bytes -= message.num_bytes

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._wake([future for futures in self._key_to_waiters.values() for future in futures])
        self._thread.join(timeout=2)
        self._socket.disable_monitor()
        self._monitor.close()
        self._socket.close()

    def _receive_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while not self._closed:
            ready = dict(poller.poll(100))
            if self._monitor in ready:
                recv_monitor_message(self._monitor)
                what = f"a sender's connection closed (it stopped, or sent a frame over {self.max_frame_bytes} bytes)"
                self._count(self.metrics.num_disconnects, what)
            if self._socket in ready:
                self._receive(self._socket.recv_multipart(copy=False))
            self._expire(time.monotonic())

    def _expire(self, now: float) -> None:
        """Drop messages older than max_age_s (insertion order is arrival order), once a second."""
        if now < self._next_expiry_check:
            return
        self._next_expiry_check = now + 1.0
        with self._cond:
            while self._messages:
                key, oldest = next(iter(self._messages.items()))
                if now - oldest.received_at < self.max_age_s:
                    break
                del self._messages[key]
                self._num_bytes -= oldest.num_bytes
                self.metrics.num_expired.inc()

    def _receive(self, frames: list[zmq.Frame]) -> None:
        if self._key is not None:
            if len(frames) < 2 or not verify_frames(self._key, frames[0].buffer, [f.buffer for f in frames[1:]]):
                what = "dropped a message whose tag does not verify (no or another secret, or altered)"
                self._count(self.metrics.num_unauthenticated, what)
                return
            frames = frames[1:]
        try:
            message = decode_message(frames)
        except MalformedMessageError as exc:
            self._count(self.metrics.num_malformed, f"dropped a malformed message: {exc}")
            return
        message.received_at = time.monotonic()
        with self._cond:
            if message.key in self._messages:
                self._num_bytes -= self._messages.pop(message.key).num_bytes
            self._messages[message.key] = message
            self._num_bytes += message.num_bytes
            while self._num_bytes > self.capacity_bytes and len(self._messages) > 1:
                _, dropped = self._messages.popitem(last=False)
                self._num_bytes -= dropped.num_bytes
                self.metrics.num_dropped.inc()
            self._cond.notify_all()
            self._wake(self._key_to_waiters.get(message.key, []))

    def _count(self, events: Counter, what: str) -> None:
        """Counts a drop or closure (on the receive thread, their one writer) and logs the 1st, 2nd,
        4th, 8th... of its kind: a flood of bad messages cannot flood the log."""
        events.inc()
        count = int(events.value)
        if count & (count - 1) == 0:
            log.warning("tensor inbox %s: %s (%d so far)", self.bound_address, what, count)


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
