"""A request's sampling fields (protocol/sampling_request.py) as the engine's SamplingParams for
one choice,.

The checkpoint's sampling defaults fill the fields the request did not send (vLLM's rule);
choice i samples with ``seed + i``, so seeded choices differ yet stay reproducible. Logit biases
are clipped as vLLM clips them.

Structured output: a request's structured-output fields, in every spelling clients use (the
fields: protocol/sampling_request.py), reduced to one engine constraint (StructuredOutput). At most
one constraint per request: two are a 400, not a silent pick.

Beam search: ``use_beam_search`` (``n`` is then the beam width, and the n best beams are the
choices) and ``length_penalty``. A field whose meaning beam search does not carry is a 400 that
names it, never dropped: the search ranks tokens by the model's own logprobs, so sampling
filters, penalties, biases, stop strings, logprobs and structured output have no place in it
(vLLM's beam search ignores most of them silently). The algorithm is pipeline/beam_search.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from services.engine.sampling_params import GREEDY_TEMPERATURE_EPS, SamplingParams, StructuredOutput
from services.gateway.errors import GatewayError
from services.gateway.frontend.limits import RequestLimits
from services.gateway.protocol.chat import ChatCompletionRequest
from services.gateway.protocol.completion import CompletionRequest
from services.gateway.protocol.sampling_request import INT64_MIN, MAX_LOGIT_BIAS, SamplingRequest
from services.models.sampling_defaults import SamplingDefaults


def sampling_params(
    request: ChatCompletionRequest | CompletionRequest,
    max_tokens: int,
    *,
    choice: int,
    structured: StructuredOutput | None,
    defaults: SamplingDefaults,
    limits: RequestLimits,
) -> SamplingParams:
    seed = None if request.seed is None else choice_seed(request.seed, choice)
    # The checkpoint's defaults fill the fields the request did not send (vLLM's rule).
    given = {name: value for name, value in defaults.as_dict().items() if name not in request.model_fields_set}
    temperature = given.get("temperature", request.temperature)
    allowed_token_ids = tuple(request.allowed_token_ids) if request.allowed_token_ids is not None else None
    logprob_token_ids = tuple(request.logprob_token_ids) if request.logprob_token_ids else None  # [] asks for nothing, as in vLLM
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0 if temperature < GREEDY_TEMPERATURE_EPS else temperature,
            top_p=given.get("top_p", request.top_p),
            top_k=max(int(given.get("top_k", request.top_k)), 0),
            seed=seed,
            stop=stop_strings(request),
            stop_token_ids=tuple(request.stop_token_ids or ()),
            ignore_eos=request.ignore_eos,
            logprobs=limits.logprobs(request.num_logprobs(), "sample logprobs", "logprobs"),
            prompt_logprobs=limits.logprobs(request.num_prompt_logprobs(), "prompt logprobs", "prompt_logprobs"),
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            repetition_penalty=given.get("repetition_penalty", request.repetition_penalty),
            min_p=given.get("min_p", request.min_p),
            min_tokens=request.min_tokens,
            logit_bias=bias_pairs(request),
            allowed_token_ids=allowed_token_ids,
            logprob_token_ids=logprob_token_ids,
            structured=structured,
        )
    except ValueError as exc:  # a combination the fields alone cannot check (min_tokens > max_tokens)
        raise GatewayError(400, str(exc)) from None


def choice_seed(seed: int, choice: int) -> int:
    """Choice i samples with seed + i, wrapped to stay in int64."""
    return (seed + choice - INT64_MIN) % 2**64 + INT64_MIN


def stop_strings(request: SamplingRequest) -> tuple[str, ...]:
    return (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())


def bias_pairs(request: SamplingRequest) -> tuple[tuple[int, float], ...]:
    """(token id, clipped bias), as vLLM clips them."""
    clip = lambda value: max(-MAX_LOGIT_BIAS, min(MAX_LOGIT_BIAS, value))  # noqa: E731
    return tuple(sorted((int(key), clip(value)) for key, value in (request.logit_bias or {}).items()))


ANY_OBJECT = json.dumps({"type": "object"})


def structured_output(request: SamplingRequest) -> StructuredOutput | None:
    found = [(name, constraint) for name, constraint in _constraints(request) if constraint is not None]
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise GatewayError(400, f"{found[1][0]}: ask for one structured output at a time, not {names}", param=found[1][0])
    return found[0][1] if found else None


def _constraints(request: SamplingRequest) -> list[tuple[str, StructuredOutput | None]]:
    fields, response_format = request.structured_outputs, request.response_format
    compact = bool(fields and fields.disable_any_whitespace)
    out: list[tuple[str, StructuredOutput | None]] = [
        ("guided_json", _json(request.guided_json, compact)),
        ("guided_regex", StructuredOutput("regex", request.guided_regex) if request.guided_regex else None),
        ("guided_choice", StructuredOutput("choice", json.dumps(request.guided_choice)) if request.guided_choice else None),
        ("guided_grammar", StructuredOutput("grammar", request.guided_grammar) if request.guided_grammar else None),
    ]
    if response_format is not None and response_format.type == "json_object":
        out.append(("response_format", StructuredOutput("json", ANY_OBJECT)))
    elif response_format is not None and response_format.type == "json_schema":
        schema = response_format.json_schema.schema_ if response_format.json_schema else None
        if schema is None:
            raise GatewayError(400, "response_format: json_schema needs json_schema.schema", param="response_format")
        out.append(("response_format", _json(schema, compact)))
    if fields is not None:
        out += [
            ("structured_outputs.json", _json(fields.json_, compact)),
            ("structured_outputs.regex", StructuredOutput("regex", fields.regex) if fields.regex else None),
            ("structured_outputs.choice", StructuredOutput("choice", json.dumps(fields.choice)) if fields.choice else None),
            ("structured_outputs.grammar", StructuredOutput("grammar", fields.grammar) if fields.grammar else None),
            ("structured_outputs.json_object", StructuredOutput("json", ANY_OBJECT, compact) if fields.json_object else None),
        ]
    return out


def _json(schema: dict | bool | str | None, compact: bool) -> StructuredOutput | None:
    if schema is None:
        return None
    return StructuredOutput("json", schema if isinstance(schema, str) else json.dumps(schema), compact)


# Request fields beam search does not honour: refused unless left at their defaults.
NOT_WITH_BEAM_SEARCH = (
    "stop",
    "stop_token_ids",
    "logit_bias",
    "allowed_token_ids",
    "logprob_token_ids",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "top_p",
    "top_k",
    "min_tokens",
    "tools",
)


@dataclass(frozen=True, slots=True)
class BeamSearch:
    """``width`` beams, each at most ``max_tokens`` long; ranked by summed logprob over
    length ** ``length_penalty``."""

    width: int
    max_tokens: int
    length_penalty: float = 1.0
    ignore_eos: bool = False
    fit_max_tokens: bool = False  # max_tokens was not given: it shrinks to the context left


def beam_search_of(request: SamplingRequest, max_tokens: int, *, fit_max_tokens: bool) -> BeamSearch | None:
    """The search ``request`` asks for, or None; a 400 naming a field the search cannot honour."""
    if not request.use_beam_search:
        if request.length_penalty != 1.0:
            raise GatewayError(400, "length_penalty only applies with use_beam_search=true", param="length_penalty")
        return None
    fields = type(request).model_fields
    for name in NOT_WITH_BEAM_SEARCH:
        if name in fields and getattr(request, name) != fields[name].default:
            raise GatewayError(400, f"{name} is not supported with beam search", param=name)
    if structured_output(request) is not None:
        raise GatewayError(400, "structured output is not supported with beam search")
    return BeamSearch(request.n, max_tokens, request.length_penalty, request.ignore_eos, fit_max_tokens)
