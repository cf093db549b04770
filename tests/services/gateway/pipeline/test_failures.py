"""Classifying a node's failed call: by the kind of its typed error, or without one by the gRPC code."""

from __future__ import annotations

import grpc
import pytest

from services.gateway.errors import GatewayError
from services.gateway.pipeline.failures import NodeFailure, NodeOverloaded, classify_rpc_error
from services.transport.node_error import NODE_ERROR_KEY, ErrorKind, NodeError, NodeRef
from shared.types import MmHash
from tests.fake_rpc_error import FakeRpcError, failed_with


@pytest.mark.parametrize(
    "kind,status",
    [
        (ErrorKind.INVALID_REQUEST, 400),
        (ErrorKind.IMAGE_TOO_LARGE, 413),
        (ErrorKind.IMAGE_SOURCE_NOT_ALLOWED, 403),
        (ErrorKind.REQUEST_FAILED, 500),
        (ErrorKind.KV_TRANSFER_TIMEOUT, 503),
    ],
)
def test_a_request_error_is_answered_with_its_kinds_status_and_the_nodes_message(kind, status):
    outcome = classify_rpc_error("preprocess", "pre:1", failed_with(NodeError(kind, "image_too_large: 9 MB over 8")))
    assert isinstance(outcome, GatewayError)
    assert (outcome.status, outcome.message) == (status, "image_too_large: 9 MB over 8")


def test_a_busy_node_is_the_one_called_unless_the_error_names_another():
    own = classify_rpc_error("decode", "d:1", failed_with(NodeError(ErrorKind.OVERLOADED, "at its limit", NodeRef("decode"))))
    assert isinstance(own, NodeOverloaded) and (own.role, own.address) == ("decode", "d:1")
    relayed = classify_rpc_error("prefill", "p:1", failed_with(NodeError(ErrorKind.OVERLOADED, "busy", NodeRef("encoder", "e:1"))))
    assert isinstance(relayed, NodeOverloaded) and (relayed.role, relayed.address) == ("encoder", "e:1")


def test_a_failed_node_named_by_the_node_called_is_the_failure():
    error = NodeError(ErrorKind.NODE_FAILED, "encoder e:1 unavailable", NodeRef("encoder", "e:1"))
    outcome = classify_rpc_error("prefill", "p:1", failed_with(error))
    assert isinstance(outcome, NodeFailure) and (outcome.role, outcome.address) == ("encoder", "e:1")
    assert str(outcome) == "encoder e:1: encoder e:1 unavailable"


def test_pixels_still_missing_after_the_resend_are_the_nodes_failure():
    error = NodeError(ErrorKind.MISSING_PIXELS, "pixels never arrived", missing_mm_hashes=(MmHash("img"),))
    outcome = classify_rpc_error("prefill", "p:1", failed_with(error))
    assert isinstance(outcome, GatewayError)
    assert (outcome.status, outcome.message) == (500, "the prefill service failed: pixels never arrived")


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED])
def test_without_a_typed_error_a_node_failure_code_is_retried_elsewhere(code):
    outcome = classify_rpc_error("decode", "d:1", FakeRpcError(code, "connection refused"))
    assert isinstance(outcome, NodeFailure) and (outcome.role, outcome.address) == ("decode", "d:1")


def test_without_a_typed_error_any_other_code_is_a_500():
    outcome = classify_rpc_error("prefill", "p:1", FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "message larger than max"))
    assert isinstance(outcome, GatewayError)
    assert (outcome.status, outcome.message) == (500, "the prefill service failed: message larger than max")


def test_a_trailer_that_does_not_parse_counts_as_none():
    garbled = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "gone", ((NODE_ERROR_KEY, b"\xff\xff not a message"),))
    assert isinstance(classify_rpc_error("encoder", "e:1", garbled), NodeFailure)
