"""`tessera serve` flags as vLLM spells them: --served-model-name takes names apart (vLLM's
`--served-model-name a b`) as well as comma-separated, and a role's settings see one list."""

from __future__ import annotations

import argparse

import pytest

from services.cli.main import build_parser
from services.cli.serve_cmd import _flag_value
from services.gateway.server import served_names
from services.stack.roles import role_settings


@pytest.mark.parametrize("given", [["a", "b"], ["a,b"], ["a", "b,a"]])
def test_served_model_names_apart_or_comma_separated_reach_the_gateway_as_one_list(given, tiny_model):
    args = build_parser().parse_args(["serve", "--role", "gateway", "--served-model-name", *given, "--http-port", "8001"])
    value = _flag_value(args.role_served_model_name)
    flags = argparse.Namespace(model="tiny", served_model_name=value, http_port="8001", index_url="redis://127.0.0.1:1/0")
    settings = role_settings("gateway", flags)
    assert served_names(settings, tiny_model) == ("a", "b") and settings.http_port == 8001


def test_the_vllm_metric_names_flag_reaches_the_gateway_settings():
    args = build_parser().parse_args(["serve", "--role", "gateway", "--vllm-metric-names", "true"])
    flags = argparse.Namespace(model="tiny", vllm_metric_names=args.role_vllm_metric_names, index_url="redis://127.0.0.1:1/0")
    assert role_settings("gateway", flags).vllm_metric_names is True
