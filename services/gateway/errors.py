"""Errors the gateway returns, in OpenAI's error shape."""

from __future__ import annotations


class GatewayError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type or (
            "invalid_request_error" if status < 500 else "service_unavailable" if status == 503 else "internal_error"
        )
        self.code = code
        self.param = param
        self.headers = headers or {}  # e.g. Retry-After on a 429

    def to_json(self) -> dict:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}


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
