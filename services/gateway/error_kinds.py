"""What the gateway does with each kind of node error (services/transport/node_error.py), and the
HTTP status its client gets: the one table. Nodes report kinds only; classification by kind is in
services/gateway/pipeline/failures.py, the pixel resend in services/gateway/pipeline/stages.py."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from services.transport.node_error import ErrorKind


class Action(enum.Enum):
    REJECT = enum.auto()  # the request's own error: answered with the rule's status and the node's message, never retried
    RETRY_ELSEWHERE = enum.auto()  # the named node failed: retried without it (503 once the failure budget is spent)
    TRY_ANOTHER = enum.auto()  # the named node is busy: another of its role, no quarantine (429 once every one was)
    RESEND_PIXELS = enum.auto()  # pushed again and the call retried once; past that, the node's unexplained failure (500)
    LOAD_ADAPTER = enum.auto()  # the request's LoRA adapter loaded on the node, then retried; past that, as TRY_ANOTHER


@dataclass(frozen=True, slots=True)
class KindRule:
    action: Action
    status: int | None = None  # REJECT: the HTTP status; the other actions end on a status of their own, above


KIND_RULES: dict[ErrorKind, KindRule] = {
    ErrorKind.INVALID_REQUEST: KindRule(Action.REJECT, 400),
    ErrorKind.IMAGE_TOO_LARGE: KindRule(Action.REJECT, 413),
    ErrorKind.IMAGE_SOURCE_NOT_ALLOWED: KindRule(Action.REJECT, 403),
    ErrorKind.REQUEST_FAILED: KindRule(Action.REJECT, 500),
    # The decode node's wait for the pages the prefill pushed ran out: the client is told to come back.
    ErrorKind.KV_TRANSFER_TIMEOUT: KindRule(Action.REJECT, 503),
    ErrorKind.OVERLOADED: KindRule(Action.TRY_ANOTHER),
    ErrorKind.NODE_FAILED: KindRule(Action.RETRY_ELSEWHERE),
    ErrorKind.MISSING_PIXELS: KindRule(Action.RESEND_PIXELS),
    ErrorKind.MEDIA_ID_CONFLICT: KindRule(Action.REJECT, 409),
    ErrorKind.MISSING_ADAPTER: KindRule(Action.LOAD_ADAPTER),
}
