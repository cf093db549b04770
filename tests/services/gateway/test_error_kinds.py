"""The one table from a node error's kind to what the gateway does and the status its client gets."""

from __future__ import annotations

from services.gateway.error_kinds import KIND_RULES, Action
from services.transport.node_error import ErrorKind


def test_every_kind_has_a_rule_and_only_rejections_carry_a_status():
    assert set(KIND_RULES) == set(ErrorKind)
    assert all((rule.action is Action.REJECT) == (rule.status is not None) for rule in KIND_RULES.values())


def test_request_errors_get_the_statuses_clients_always_got():
    statuses = {kind: rule.status for kind, rule in KIND_RULES.items() if rule.action is Action.REJECT}
    assert statuses == {
        ErrorKind.INVALID_REQUEST: 400,
        ErrorKind.IMAGE_TOO_LARGE: 413,
        ErrorKind.IMAGE_SOURCE_NOT_ALLOWED: 403,
        ErrorKind.REQUEST_FAILED: 500,
        ErrorKind.KV_TRANSFER_TIMEOUT: 503,
        ErrorKind.MEDIA_ID_CONFLICT: 409,
    }


def test_busy_failed_and_missing_pixels_are_acted_on_not_answered():
    assert KIND_RULES[ErrorKind.OVERLOADED].action is Action.TRY_ANOTHER
    assert KIND_RULES[ErrorKind.NODE_FAILED].action is Action.RETRY_ELSEWHERE
    assert KIND_RULES[ErrorKind.MISSING_PIXELS].action is Action.RESEND_PIXELS
