"""What vLLM's beam-search request fields ask for (protocol/sampling_request.py): ``use_beam_search``
(``n`` is then the beam width, and the n best beams are the choices) and ``length_penalty``.

A field whose meaning beam search does not carry is a 400 that names it, never dropped: the
search ranks tokens by the model's own logprobs, so sampling filters, penalties, biases, stop
strings, logprobs and structured output have no place in it (vLLM's beam search ignores most of
them silently). The algorithm is pipeline/beam_search.py."""

from __future__ import annotations

from dataclasses import dataclass

from services.gateway.errors import GatewayError
from services.gateway.frontend.structured import structured_output
from services.gateway.protocol.sampling_request import SamplingRequest

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
