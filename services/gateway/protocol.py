"""The OpenAI wire format the HTTP gateway speaks, as pydantic models: requests are validated by
them (types are strict, floats finite, integers within the range of the protobuf field they end
up in), and responses are built from them, so /openapi.json documents exactly what is served.

Image content parts are OpenAI's ``image_url`` (a URL string or ``{"url": ...}``) and the bare
base64 ``image`` part; either may carry a client ``uuid`` that names the image instead of its
pixels. The preprocess role checks what only it can: images only in user messages, image limits,
the images themselves.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator, model_validator

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STOP_STRINGS = 4
MAX_CHOICES = 16  # n: each choice is a full request on the decode tier
MAX_LOGPROBS = 20  # alternatives per token, as OpenAI allows
# Below this a temperature is greedy (argmax), as in vLLM: dividing logits by a denormal-sized
# temperature overflows to inf and the softmax to NaN, which no sampler can draw from.
GREEDY_TEMPERATURE_EPS = 1e-5

NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]
ImageUuid = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class WireModel(BaseModel):
    """Requests: unknown fields are an error, not silently dropped, and nothing is coerced
    ("yes" is not a bool, 2.0 is not an int, NaN is not a temperature)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class TextPart(WireModel):
    type: Literal["text"]
    text: str


class ImageUrl(WireModel):
    url: NonEmptyStr
    detail: Literal["auto", "low", "high"] | None = None


class ImageUrlPart(WireModel):
    type: Literal["image_url"]
    image_url: ImageUrl | NonEmptyStr
    uuid: ImageUuid | None = None


class ImagePart(WireModel):
    type: Literal["image"]
    image: NonEmptyStr = Field(description="base64-encoded image bytes, or a data URL")
    uuid: ImageUuid | None = None


ContentPart = Annotated[TextPart | ImageUrlPart | ImagePart, Field(discriminator="type")]


class ChatMessage(WireModel):
    role: Literal["system", "user", "assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class StreamOptions(WireModel):
    include_usage: bool = False


class SamplingFields(WireModel):
    """What chat and text completions share: sampling, streaming and caching fields."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    temperature: float = Field(1.0, ge=0.0, le=2.0, description=f"0, or anything below {GREEDY_TEMPERATURE_EPS}, samples greedily (argmax)")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, le=INT32_MAX, description="0 or -1 disables top-k")
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX, description="choice i of n samples with seed + i")
    stop: NonEmptyStr | Annotated[list[NonEmptyStr], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="choices per prompt; they share the prompt's cached prefix")
    user: str | None = Field(None, max_length=256, description="an end-user id, for the operator's logs")
    cache_salt: str | None = Field(None, description="requests with different salts never share cached prefixes")
    ignore_eos: bool = False
    frequency_penalty: float = Field(0.0, description="not supported: must be 0")
    presence_penalty: float = Field(0.0, description="not supported: must be 0")

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalty(cls, value: float, info: ValidationInfo) -> float:
        if value != 0:
            raise ValueError(f"{info.field_name} is not supported (it must be 0)")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        return tuple(stop)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description="needs logprobs=true")

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        return self

    def num_logprobs(self) -> int | None:
        """How many alternatives the sampling reports per token; None: no logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None


# -- responses ---------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str
    logprobs: ChatLogprobs | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChunkDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a stream; the last one (``include_usage``) has no choices."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tessera"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class NodeRecord(BaseModel):
    role: str
    address: str
    node_id: str


class HealthResponse(BaseModel):
    status: str = Field(description="'ok', 'draining', or which role has no live node")
    nodes: list[NodeRecord]
