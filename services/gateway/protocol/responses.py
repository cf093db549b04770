"""The OpenAI API's response bodies (chat completions, models, errors, probes), as pydantic models
so /openapi.json documents exactly what is served; text completions' are completion.py's."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from services.gateway.protocol.chat import ToolCall
from services.gateway.protocol.prompt_logprobs import PromptLogprobsWire


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
