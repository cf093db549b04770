"""Admission control: the gateway holds at most ``max_num_requests`` choices in flight (each
choice is one pipeline run, so n=4 counts 4). Past that, a request is refused at once with a 429,
OpenAI's rate-limit error and a ``Retry-After``, instead of queueing without bound and timing out
later; a load balancer or client retries it, on this gateway or another. Admission happens on the
event loop, so checking and reserving are one step."""

from __future__ import annotations

from services.gateway.errors import GatewayError

RETRY_AFTER_S = 1


def rate_limited(message: str, retry_after_s: int | None = None) -> GatewayError:
    """A 429 in OpenAI's rate-limit shape, with ``Retry-After`` (RETRY_AFTER_S unless the caller
    knows better): the gateway or a node is full."""
    wait = RETRY_AFTER_S if retry_after_s is None else retry_after_s
    return GatewayError(
        429,
        f"{message}; retry after {wait} s",
        error_type="requests",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(wait)},
    )


class Ticket:
    """Admitted choices; ``release`` returns them (once, however often it is called)."""

    __slots__ = ("_admission", "_num", "_released")

    def __init__(self, admission: Admission, num: int) -> None:
        self._admission, self._num, self._released = admission, num, False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission.num_admitted -= self._num


class Admission:
    def __init__(self, max_num_requests: int) -> None:
        if max_num_requests < 1:
            raise ValueError(f"max_num_requests must be at least 1, got {max_num_requests}")
        self.max_num_requests = max_num_requests
        self.num_admitted = 0
        self.num_refused = 0

    def can_admit(self, num: int) -> bool:
        return self.num_admitted + num <= self.max_num_requests

    def admit(self, num: int) -> Ticket:
        if not self.can_admit(num):
            self.num_refused += 1
            raise rate_limited(f"the gateway is at its limit of {self.max_num_requests} requests in flight")
        self.num_admitted += num
        return Ticket(self, num)
