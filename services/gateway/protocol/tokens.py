"""The wire models of vLLM's /tokenize, /detokenize and /version.

/tokenize takes a chat (``messages``: rendered by the chat template, images expanded to their
placeholder tokens, so the count is what the model will see) or a raw ``prompt``. Both run the
preprocess role's own path, so the count equals a real request's prompt_tokens.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, model_validator

from protos.gen import pb
from services.gateway.frontend.prompt_wire import chat_prompt, raw_prompt
from services.gateway.protocol.chat import ChatMessage, Tool
from services.gateway.protocol.media_fields import MmProcessorKwargs
from services.gateway.protocol.sampling_request import INT32_MAX
from services.gateway.protocol.wire_base import NonEmptyStr, WireModel

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class TokenizeRequest(WireModel):
    model: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    prompt: NonEmptyStr | None = None
    tools: list[Tool] | None = None
    chat_template_kwargs: dict | None = None
    mm_processor_kwargs: MmProcessorKwargs | None = None
    add_generation_prompt: bool = Field(True, description="count the template's generation prompt (messages only)")
    return_token_strs: bool = Field(False, description="not supported: must be false")

    @model_validator(mode="after")
    def _one_prompt(self) -> TokenizeRequest:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of 'messages' and 'prompt'")
        if self.return_token_strs:
            raise ValueError("return_token_strs is not supported")
        return self

    def prompt_input(self) -> pb.PromptInput:
        if self.prompt is not None:
            return raw_prompt(self.prompt, [])
        # As vLLM: the top-level field, unless chat_template_kwargs sets it.
        template_kwargs = {"add_generation_prompt": self.add_generation_prompt, **(self.chat_template_kwargs or {})}
        return chat_prompt(self.messages or [], self.tools, template_kwargs, video_kwargs=self.mm_processor_kwargs)


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(WireModel):
    model: str | None = None
    tokens: list[TokenId]


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str
