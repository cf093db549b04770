"""The OpenAI wire format the HTTP gateway speaks, as pydantic models: requests are validated by
them (types are strict, floats finite, integers within the range of the protobuf field they end
up in), and responses are built from them, so /openapi.json documents exactly what is served.

Fields the server does not know are accepted and ignored, as vLLM does: the route logs them and
names them in the ``tessera-ignored-fields`` response header (ignored_fields.py). A field it knows
but whose value it cannot honour is a 400 that says so.

Image content parts are OpenAI's ``image_url`` (a URL string or ``{"url": ...}``) and the bare
base64 ``image`` part; either may carry a client ``uuid``, an alias bound to the bytes first sent
with it (``image_url`` null: the bound image; services/preprocess/media_uuids.py). Video parts
are vLLM's ``video_url`` (media_fields.py). The preprocess role checks what only it can: media
only in user messages, their limits, the images and videos themselves.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StringConstraints, field_validator, model_validator

from services.engine.sampling_params import GREEDY_TEMPERATURE_EPS
from services.gateway.protocol.beam_fields import BeamSearchFields
from services.gateway.protocol.kv_transfer_fields import KVTransferFields
from services.gateway.protocol.media_fields import MmProcessorKwargs, VideoUrlPart, needs_source_or_uuid
from services.gateway.protocol.prompt_logprobs import PromptLogprobFields, PromptLogprobsWire
from services.gateway.protocol.structured_fields import StructuredRequestFields
from services.gateway.protocol.token_id_fields import TokenIdFields
from services.gateway.protocol.truncation_fields import TruncationFields
from services.gateway.protocol.unserved_fields import ChatUnservedFields, UnservedFields
from services.gateway.protocol.wire_base import NonEmptyStr, WireModel

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STOP_STRINGS = 4
MAX_CHOICES = 16  # n: each choice is a full request on the decode tier
MAX_LOGIT_BIAS = 100.0

ImageUuid = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class TextPart(WireModel):
    type: Literal["text"]
    text: str


class ImageUrl(WireModel):
    url: NonEmptyStr
    detail: Literal["auto", "low", "high"] | None = None


class ImageUrlPart(WireModel):
    type: Literal["image_url"]
    image_url: ImageUrl | NonEmptyStr | None = Field(description="null: the image its uuid was sent with before")
    uuid: ImageUuid | None = None

    @model_validator(mode="after")
    def _has_source(self):
        return needs_source_or_uuid(self, self.image_url, "image_url")

    @property
    def url(self) -> str | None:
        return self.image_url.url if isinstance(self.image_url, ImageUrl) else self.image_url


class ImagePart(WireModel):
    type: Literal["image"]
    image: NonEmptyStr = Field(description="base64-encoded image bytes, or a data URL")
    uuid: ImageUuid | None = None


ContentPart = Annotated[TextPart | ImageUrlPart | ImagePart | VideoUrlPart, Field(discriminator="type")]


class ToolCallFunction(WireModel):
    name: NonEmptyStr
    arguments: str = Field(description="the arguments as a JSON text")


class ToolCall(WireModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(WireModel):
    role: Literal["system", "developer", "user", "assistant", "tool"] = Field(
        description="'developer' is rendered as 'system' (chat templates know only that)"
    )
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = Field(None, description="an assistant's earlier tool calls, for the template")
    tool_call_id: str | None = Field(None, description="on a tool message: the call it answers")

    @model_validator(mode="after")
    def _content_where_needed(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self


class FunctionDefinition(WireModel):
    name: NonEmptyStr
    description: str | None = None
    parameters: dict | None = Field(None, description="a JSON Schema")
    strict: bool | None = None


class Tool(WireModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(WireModel):
    name: NonEmptyStr


class NamedToolChoice(WireModel):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(WireModel):
    include_usage: bool = False
    continuous_usage_stats: bool = Field(False, description="usage (so far) on every chunk, as vLLM sends it")


class SamplingFields(StructuredRequestFields, UnservedFields, PromptLogprobFields, TokenIdFields, TruncationFields, BeamSearchFields):
    """What chat and text completions share: sampling, structured output, streaming and caching
    fields (and vLLM's not served yet, refused: unserved_fields.py)."""

    return_token_ids: bool = Field(False, description="vLLM's: the prompt's and each choice's token ids in the response")
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    temperature: float = Field(1.0, ge=0.0, le=2.0, description=f"0, or anything below {GREEDY_TEMPERATURE_EPS}, samples greedily (argmax)")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, le=INT32_MAX, description="0 or -1 disables top-k")
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX, description="choice i of n samples with seed + i")
    stop: NonEmptyStr | Annotated[list[NonEmptyStr], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0, le=INT32_MAX)]], Field(max_length=MAX_STOP_STRINGS)] | None = Field(
        None, description="vLLM's: these token ids end the output too (not included in it)"
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="choices per prompt; they share the prompt's cached prefix")
    user: str | None = Field(None, max_length=256, description="an end-user id, for the operator's logs")
    cache_salt: str | None = Field(None, description="requests with different salts never share cached prefixes")
    ignore_eos: bool = False
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="minus this times a token's count in the output")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="minus this once for a token already in the output")
    repetition_penalty: float = Field(1.0, gt=0.0, le=100.0, description="vLLM's: divides (or multiplies) the logits of seen tokens")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="drop tokens less likely than min_p times the most likely")
    min_tokens: int = Field(0, ge=0, le=INT32_MAX, description="no stop token or stop string ends the output before this many tokens")
    logit_bias: dict[str, float] | None = Field(
        None, description=f"token id (as a string) -> bias added to its logit, clipped to [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]"
    )

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> SamplingFields:
        if self.stream_options is not None and self.stream_options.model_fields_set and not self.stream:
            raise ValueError("stream_options can only be set with stream=true")
        return self

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        bad = [key for key in bias or {} if not key.isdigit() or int(key) > INT32_MAX]
        if bad:
            raise ValueError(f"keys must be token ids (non-negative integers as strings), got {', '.join(map(repr, bad))}")
        return bias

    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """(token id, clipped bias), as vLLM clips them."""
        clip = lambda value: max(-MAX_LOGIT_BIAS, min(MAX_LOGIT_BIAS, value))  # noqa: E731
        return tuple(sorted((int(key), clip(value)) for key, value in (self.logit_bias or {}).items()))

    def stop_strings(self) -> tuple[str, ...]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        return tuple(stop)


class ChatCompletionRequest(SamplingFields, ChatUnservedFields, KVTransferFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=-1, description="needs logprobs=true; at most --max-logprobs (20), -1: the vocabulary")
    tools: list[Tool] | None = Field(None, description="rendered by the model's chat template")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="'auto' (the default with tools) needs the model family's tool-call parser; see tool_calls.py"
    )
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict | None = Field(None, description="extra variables for the chat template")
    mm_processor_kwargs: MmProcessorKwargs | None = Field(None, description="the video sampler's and processor's settings")
    add_generation_prompt: bool = Field(True, description="the template's generation prompt after the messages (vLLM's)")
    continue_final_message: bool = Field(
        False, description="render the final message open-ended, for the model to continue it (vLLM's); needs add_generation_prompt=false"
    )
    echo: bool = Field(False, description="the reply starts with the final message's text when that is an assistant's (vLLM's)")

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        return self

    def template_kwargs(self) -> dict | None:
        """chat_template_kwargs, with the generation-prompt fields under them (as vLLM: the
        kwargs win); None when nothing departs from the template's defaults."""
        own = {"add_generation_prompt": False} if not self.add_generation_prompt else {}
        if self.continue_final_message:
            own["continue_final_message"] = True
        merged = {**own, **(self.chat_template_kwargs or {})}
        return merged or None

    def echoed_text(self) -> str:
        """What ``echo`` puts before the reply: the final message's text, if an assistant's."""
        last = self.messages[-1]
        if not self.echo or last.role != "assistant" or last.content is None:
            return ""
        if isinstance(last.content, str):
            return last.content
        return "".join(part.text for part in last.content if isinstance(part, TextPart))

    def num_logprobs(self) -> int | None:
        """How many alternatives the sampling reports per token; None: no logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def num_prompt_logprobs(self) -> int | None:
        """As vLLM: ``prompt_logprobs``, or with ``echo`` the top_logprobs count."""
        if self.prompt_logprobs is not None or not self.echo:
            return self.prompt_logprobs
        return self.top_logprobs


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
    content: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list)  # as vLLM sends it: [] when there are none


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
    token_ids: list[int] | None = None  # return_token_ids


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = None  # return_token_ids
    prompt_logprobs: PromptLogprobsWire | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tessera"
    root: str = Field(description="the checkpoint the name serves")
    parent: str | None = None
    max_model_len: int = Field(description="prompt plus output tokens, at most")


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
    node_id: str


class HealthResponse(BaseModel):
    status: str = Field(description="'ok', 'draining', or which role has no live node")
    nodes: list[NodeRecord]


class LiveResponse(BaseModel):
    status: str = Field(description="'ok', or 'draining' (still alive)")


class ReadyResponse(BaseModel):
    status: str = Field(description="'ok', 'draining', or which role has no live node")
    num_nodes: dict[str, int] = Field(description="live nodes per role")
