"""vLLM's beam-search request fields, shared by chat and text completions: ``use_beam_search``
(``n`` is then the beam width, and the n best beams are the choices) and ``length_penalty``.

A field whose meaning beam search does not carry is a 400 that names it, never dropped: the
search ranks tokens by the model's own logprobs, so sampling filters, penalties, biases, stop
strings, logprobs and structured output have no place in it (vLLM's beam search ignores most of
them silently). The algorithm is beam_search.py."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from services.gateway.errors import GatewayError
from services.gateway.protocol.wire_base import WireModel

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


class BeamSearchFields(WireModel):
    use_beam_search: bool = Field(False, description="vLLM's: beam search, n beams wide; the n best beams are the choices")
    length_penalty: float = Field(1.0, description="beam search ranks beams by summed logprob / length ** length_penalty")

    def beam_search(self, max_tokens: int, *, fit_max_tokens: bool) -> BeamSearch | None:
        """The search the request asks for, or None; a 400 naming a field the search cannot honour."""
        if not self.use_beam_search:
            if self.length_penalty != 1.0:
                raise GatewayError(400, "length_penalty only applies with use_beam_search=true", param="length_penalty")
            return None
        fields = type(self).model_fields
        for name in NOT_WITH_BEAM_SEARCH:
            if name in fields and getattr(self, name) != fields[name].default:
                raise GatewayError(400, f"{name} is not supported with beam search", param=name)
        if self.structured_output() is not None:  # structured_fields.py's, on every request model
            raise GatewayError(400, "structured output is not supported with beam search")
        # n and ignore_eos: SamplingFields' own, beside this mixin on every request model
        return BeamSearch(self.n, max_tokens, self.length_penalty, self.ignore_eos, fit_max_tokens)
