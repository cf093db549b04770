"""The deployment's limits a request is checked against: as it becomes sampling, the model length
(what ``truncate_prompt_tokens: -1`` keeps) and vLLM's ``--max-logprobs``; once its prompt is
tokenized, the context length (check_context_length).

``--max-logprobs`` caps the alternatives a request may ask per token, for output tokens
(``logprobs``, ``top_logprobs``) and for prompt tokens (``prompt_logprobs``): 20 by default, as
vLLM's; -1 lifts it to the vocabulary. A request's -1 asks for the whole vocabulary, allowed only
under a cap that reaches it. Whole-vocabulary logprobs are heavy (a row per token of every id,
its logprob and text), which is why the cap is the operator's to lift."""

from __future__ import annotations

from dataclasses import dataclass

from services.gateway.errors import GatewayError

DEFAULT_MAX_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_model_len: int | None = None  # None: truncate_prompt_tokens -1 is refused
    max_logprobs: int = DEFAULT_MAX_LOGPROBS  # -1: the vocabulary
    vocab_size: int | None = None  # known when a request asks for the whole vocabulary

    def __post_init__(self) -> None:
        if self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be -1 (the vocabulary) or at least 0, got {self.max_logprobs}")

    def logprobs(self, asked: int | None, what: str, param: str) -> int | None:
        """The alternatives per token a request gets, ``asked`` resolved (-1: the vocabulary);
        a 400 past the cap, in vLLM's words. ``what``: "sample logprobs" or "prompt logprobs"."""
        if asked is None:
            return None
        wanted = asked
        if asked == -1:
            if self.vocab_size is None:
                raise GatewayError(400, f"{param}=-1 (the whole vocabulary) is not served here", param=param)
            wanted = self.vocab_size
        cap = self.max_logprobs if self.max_logprobs != -1 else self.vocab_size
        if cap is not None and wanted > cap:
            raise GatewayError(400, f"Requested {what} of {wanted}, which is greater than max allowed: {cap}", param=param)
        return wanted


NO_LIMITS = RequestLimits()  # the defaults: 20 alternatives at most, no model length known


# The model's context limit, checked at the gateway as soon as the prompt is tokenized (after the
# chat template and the image placeholders' expansion), as vLLM does: a prompt plus ``max_tokens``
# beyond ``max_model_len`` is a 400 ``context_length_exceeded`` naming both numbers, before any
# prefill or decode node spends work on it. The engines check again (``Engine.check_admissible``)
# for callers that reach a node without the gateway.
def check_context_length(num_prompt_tokens: int, max_tokens: int, max_model_len: int, *, param: str) -> None:
    """``param``: what holds the prompt in the request ("messages" or "prompt"), as OpenAI names it."""
    total = num_prompt_tokens + max_tokens
    if total > max_model_len:
        raise GatewayError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested {total} tokens "
            f"({num_prompt_tokens} in the {param}, {max_tokens} in the completion). "
            f"Please reduce the length of the {param} or completion.",
            code="context_length_exceeded",
            param=param,
        )
