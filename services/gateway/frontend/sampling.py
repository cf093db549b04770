"""A request's sampling fields (protocol/sampling_request.py) as the engine's SamplingParams for
one choice, and its prompt truncation as preprocessing is told it.

The checkpoint's sampling defaults fill the fields the request did not send (vLLM's rule);
choice i samples with ``seed + i``, so seeded choices differ yet stay reproducible. Logit biases
are clipped as vLLM clips them; -1 for ``truncate_prompt_tokens`` is the model length less one
token, left for the output, as vLLM resolves it."""

from __future__ import annotations

from protos.gen import pb
from services.engine.sampling_params import GREEDY_TEMPERATURE_EPS, SamplingParams, StructuredOutput
from services.gateway.errors import GatewayError
from services.gateway.frontend.request_limits import RequestLimits
from services.gateway.protocol.chat import ChatCompletionRequest
from services.gateway.protocol.completion import CompletionRequest
from services.gateway.protocol.sampling_request import INT64_MIN, MAX_LOGIT_BIAS, SamplingRequest
from services.models.sampling_defaults import SamplingDefaults

_SIDES = {None: pb.Truncation.TOKENIZER, "left": pb.Truncation.LEFT, "right": pb.Truncation.RIGHT}


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


def prompt_truncation(request: SamplingRequest, max_model_len: int | None) -> pb.Truncation | None:
    """What the prompt's preprocessing is told; None: the prompt whole."""
    asked = request.truncate_prompt_tokens
    if asked is None:
        return None
    if asked == -1:
        if max_model_len is None:
            raise GatewayError(
                400, "truncate_prompt_tokens=-1 is not served here: give the number of tokens", param="truncate_prompt_tokens"
            )
        asked = max_model_len - 1
    return pb.Truncation(num_tokens=asked, side=_SIDES[request.truncation_side])
