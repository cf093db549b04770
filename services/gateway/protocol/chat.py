"""The chat completion request (/v1/chat/completions, and the JSON form of gRPC Generate), as a
pydantic model: the shared fields (sampling_request.py), the messages and their content parts,
and the chat's own fields. Responses are responses.py's.

Fields the server does not know are accepted and ignored, as vLLM does: the route logs them and
names them in the ``tessera-ignored-fields`` response header (frontend/openai_api.py). A field it
knows but whose value it cannot honour is a 400 that says so.

Image content parts are OpenAI's ``image_url`` (a URL string or ``{"url": ...}``) and the bare
base64 ``image`` part; either may carry a client ``uuid``, an alias bound to the bytes first sent
with it (``image_url`` null: the bound image; services/preprocess/media_uuids.py). Video parts
are vLLM's ``video_url`` (media_fields.py). The preprocess role checks what only it can: media
only in user messages, their limits, the images and videos themselves.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, model_validator

from services.gateway.protocol.media_fields import MmProcessorKwargs, VideoUrlPart, needs_source_or_uuid
from services.gateway.protocol.sampling_request import INT32_MAX, SamplingRequest, check_logprob_token_ids
from services.gateway.protocol.unserved_fields import CHAT_DEFAULTS, off, refuse_asked
from services.gateway.protocol.wire_base import NonEmptyStr, WireModel

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


class ChatCompletionRequest(SamplingRequest):
    """/v1/chat/completions: the shared fields (sampling_request.py) and the chat's own."""

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
    # vLLM's disaggregation hand-off: a proxy gives the decode side the prompt's token ids, served
    # verbatim (the messages are not rendered); its other keys steer KV connectors Tessera has not.
    kv_transfer_params: dict[str, Any] | None = Field(
        None, description="vLLM's; {'prompt_token_ids': [...]}: those ids are the prompt, verbatim (other keys are refused)"
    )
    # -- vLLM's, not served: refused unless they ask for nothing (unserved_fields.py)
    add_special_tokens: bool = off("add_special_tokens", CHAT_DEFAULTS)
    reasoning_effort: str | None = off("reasoning_effort", CHAT_DEFAULTS)
    documents: list[dict[str, Any]] | None = off("documents", CHAT_DEFAULTS)
    chat_template: str | None = off("chat_template", CHAT_DEFAULTS)
    media_io_kwargs: dict[str, Any] | None = off("media_io_kwargs", CHAT_DEFAULTS)
    return_prompt_text: bool | None = off("return_prompt_text", CHAT_DEFAULTS)

    @model_validator(mode="after")
    def _chat_fields_agree(self) -> ChatCompletionRequest:
        refuse_asked(self, CHAT_DEFAULTS)
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        check_logprob_token_ids(self, self.num_logprobs())
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        if self.kv_transfer_params is not None:
            _check_forwarded_ids(self.kv_transfer_params)
        return self

    def forwarded_prompt_ids(self) -> list[int] | None:
        """The prompt's ids a proxy forwarded, or None: the messages are the prompt."""
        return None if self.kv_transfer_params is None else list(self.kv_transfer_params["prompt_token_ids"])

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


def _check_forwarded_ids(params: dict[str, Any]) -> None:
    others = sorted(set(params) - {"prompt_token_ids"})
    if others:
        raise ValueError(f"kv_transfer_params: {', '.join(others)} is not supported by this server (only prompt_token_ids is)")
    ids = params.get("prompt_token_ids")
    if not isinstance(ids, list) or not ids or not all(type(t) is int and 0 <= t <= INT32_MAX for t in ids):
        raise ValueError("kv_transfer_params.prompt_token_ids must be a non-empty list of token ids")
