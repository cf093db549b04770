"""The deployment's limits a request is checked against: as it becomes sampling, the model length
(what ``truncate_prompt_tokens: -1`` keeps) and vLLM's ``--max-logprobs``; once its prompt is
tokenized, the context length (check_context_length).

``--max-logprobs`` caps the alternatives a request may ask per token, for output tokens
(``logprobs``, ``top_logprobs``) and for prompt tokens (``prompt_logprobs``): 20 by default, as
vLLM's; -1 lifts it to the vocabulary. A request's -1 asks for the whole vocabulary, allowed only
under a cap that reaches it. Whole-vocabulary logprobs are heavy (a row per token of every id,
its logprob and text), which is why the cap is the operator's to lift.

Admission: the gateway holds at most ``max_num_requests`` choices in flight (each choice is one
pipeline run, so n=4 counts 4). Past that, a request is refused at once with a 429, OpenAI's
rate-limit error and a ``Retry-After``, instead of queueing without bound and timing out later; a
load balancer or client retries it, on this gateway or another. Admission happens on the event
loop, so checking and reserving are one step.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.gateway.errors import GatewayError, rate_limited

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


def check_input_length(num_prompt_tokens: int, max_model_len: int) -> None:
    """An embedding's prompt: the whole context is its (vLLM's message)."""
    if num_prompt_tokens > max_model_len:
        raise GatewayError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{num_prompt_tokens} input tokens, which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input prompt.",
            code="context_length_exceeded",
            param="input",
        )


class Ticket:
    """Admitted choices; ``release`` returns them (once, however often it is called)."""

    __slots__ = ("_admission", "_num", "_released")

    def __init__(self, admission: Admission, num: int) -> None:
        self._admission, self._num, self._released = admission, num, False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission.num_admitted -= self._num


class Admission:
    def __init__(self, max_num_requests: int) -> None:
        if max_num_requests < 1:
            raise ValueError(f"max_num_requests must be at least 1, got {max_num_requests}")
        self.max_num_requests = max_num_requests
        self.num_admitted = 0
        self.num_refused = 0

    def can_admit(self, num: int) -> bool:
        return self.num_admitted + num <= self.max_num_requests

    def admit(self, num: int) -> Ticket:
        if not self.can_admit(num):
            self.num_refused += 1
            raise rate_limited(f"the gateway is at its limit of {self.max_num_requests} requests in flight")
        self.num_admitted += num
        return Ticket(self, num)
