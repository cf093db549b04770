"""What chat and text completion requests share, as one flat wire model: sampling, stopping,
logprobs, structured output, token ids, truncation, beam search, streaming and caching fields,
and vLLM's fields Tessera does not serve (refused by name: unserved_fields.py). Each endpoint's
request (chat.py, completion.py) is this model and its own fields; what a request asks for
becomes the pipeline's inputs in the frontend (services/gateway/frontend/), not here.

Types are strict, floats finite and integers within the protobuf field they end up in; a check
that involves several fields of this model is a validator here, and one that involves an
endpoint's own fields is that endpoint's."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from services.engine.sampling_params import GREEDY_TEMPERATURE_EPS, MAX_LOGPROB_TOKEN_IDS
from services.gateway.protocol.structured_fields import ResponseFormat, StructuredOutputsField
from services.gateway.protocol.unserved_fields import SHARED_DEFAULTS, off, refuse_asked
from services.gateway.protocol.wire_base import NonEmptyStr, WireModel

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STOP_STRINGS = 4
MAX_CHOICES = 16  # n: each choice is a full request on the decode tier
MAX_LOGIT_BIAS = 100.0

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class StreamOptions(WireModel):
    include_usage: bool = False
    continuous_usage_stats: bool = Field(False, description="usage (so far) on every chunk, as vLLM sends it")


class SamplingRequest(WireModel):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    temperature: float = Field(1.0, ge=0.0, le=2.0, description=f"0, or anything below {GREEDY_TEMPERATURE_EPS}, samples greedily (argmax)")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, le=INT32_MAX, description="0 or -1 disables top-k")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="drop tokens less likely than min_p times the most likely")
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX, description="choice i of n samples with seed + i")
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="choices per prompt; they share the prompt's cached prefix")
    # -- stopping
    stop: NonEmptyStr | Annotated[list[NonEmptyStr], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_STRINGS)] | None = Field(
        None, description="vLLM's: these token ids end the output too (not included in it)"
    )
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0, le=INT32_MAX, description="no stop token or stop string ends the output before this many tokens")
    # -- penalties and biases
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="minus this times a token's count in the output")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="minus this once for a token already in the output")
    repetition_penalty: float = Field(1.0, gt=0.0, le=100.0, description="vLLM's: divides (or multiplies) the logits of seen tokens")
    logit_bias: dict[str, float] | None = Field(
        None, description=f"token id (as a string) -> bias added to its logit, clipped to [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]"
    )
    allowed_token_ids: list[TokenId] | None = Field(None, description="vLLM's: only these token ids may be sampled")
    # -- logprobs and token ids in the response
    logprob_token_ids: Annotated[list[TokenId], Field(max_length=MAX_LOGPROB_TOKEN_IDS)] | None = Field(
        None, description="vLLM's: the logprobs' alternatives are the sampled token and these ids (needs logprobs)"
    )
    return_tokens_as_token_ids: bool | None = Field(None, description="vLLM's: logprobs name tokens 'token_id:<id>'")
    prompt_logprobs: int | None = Field(
        None,
        description="each prompt token's logprob and this many alternatives (at most --max-logprobs, 20; -1: all); not with stream",
    )
    return_token_ids: bool = Field(False, description="vLLM's: the prompt's and each choice's token ids in the response")
    # -- structured output: one constraint, in any of these spellings (frontend/sampling.py)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    guided_json: dict | bool | str | None = None
    guided_regex: NonEmptyStr | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)
    guided_grammar: NonEmptyStr | None = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: str | None = Field(None, description="accepted and ignored: the engine is llguidance")
    # -- the prompt's length
    truncate_prompt_tokens: int | None = Field(
        None, ge=-1, le=INT32_MAX, description="vLLM's: keep this many of the prompt's tokens (-1: the model length less one)"
    )
    truncation_side: Literal["left", "right"] | None = Field(
        None, description="'left' keeps the last tokens, 'right' the first; unset: the tokenizer's side"
    )
    # -- beam search (frontend/sampling.py)
    use_beam_search: bool = Field(False, description="vLLM's: beam search, n beams wide; the n best beams are the choices")
    length_penalty: float = Field(1.0, description="beam search ranks beams by summed logprob / length ** length_penalty")
    # -- streaming, caching and the caller
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = Field(None, description="requests with different salts never share cached prefixes")
    user: str | None = Field(None, max_length=256, description="an end-user id, for the operator's logs")
    # -- vLLM's, not served: refused unless they ask for nothing (unserved_fields.py)
    include_stop_str_in_output: bool = off("include_stop_str_in_output")
    skip_special_tokens: bool = off("skip_special_tokens")
    spaces_between_special_tokens: bool = off("spaces_between_special_tokens")
    bad_words: list[str] | None = off("bad_words")
    priority: int = off("priority")
    return_token_offsets: bool = off("return_token_offsets")
    mm_payload: str = off("mm_payload")
    return_mm_kwargs: bool | None = off("return_mm_kwargs")
    watermarking: Any = off("watermarking")
    repetition_detection: Any = off("repetition_detection")
    thinking_token_budget: int | None = off("thinking_token_budget")
    vllm_xargs: dict[str, Any] | None = off("vllm_xargs")
    ec_transfer_params: dict[str, Any] | None = off("ec_transfer_params")

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        bad = [key for key in bias or {} if not key.isdigit() or int(key) > INT32_MAX]
        if bad:
            raise ValueError(f"keys must be token ids (non-negative integers as strings), got {', '.join(map(repr, bad))}")
        return bias

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _keeps_a_token(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("truncate_prompt_tokens must be at least 1, or -1 for the model length")
        return value

    @model_validator(mode="after")
    def _fields_agree(self) -> SamplingRequest:
        refuse_asked(self, SHARED_DEFAULTS)
        if self.stream_options is not None and self.stream_options.model_fields_set and not self.stream:
            raise ValueError("stream_options can only be set with stream=true")
        if self.prompt_logprobs is not None and self.prompt_logprobs < -1:
            raise ValueError(f"prompt_logprobs must be a non-negative integer or -1, got {self.prompt_logprobs}")
        if self.prompt_logprobs is not None and self.stream and self.prompt_logprobs > 0:
            raise ValueError("prompt_logprobs are not available when stream=true")
        if self.allowed_token_ids == []:
            raise ValueError("allowed_token_ids is empty: no token could be sampled")
        return self


def check_logprob_token_ids(request: SamplingRequest, num_logprobs: int | None) -> None:
    """For an endpoint's validator: ``logprob_token_ids`` name the alternatives of logprobs the
    request asks for (each endpoint spells that ask its own way)."""
    if request.logprob_token_ids and num_logprobs is None:
        raise ValueError("when using `logprob_token_ids`, `logprobs` must be set.")  # vLLM's words
