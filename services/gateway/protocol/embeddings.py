"""The wire models of /v1/embeddings and /v1/score, as vLLM takes them for an embedding model.

/v1/embeddings: ``input`` (a text, texts, token ids or lists of them; no chat template) or
``messages`` (a chat with images and videos, rendered by the template without a generation
prompt unless asked, as vLLM's embedding chat request). /v1/score: pairs of ``queries`` and
``documents`` (or vLLM's older ``text_1`` / ``text_2``), 1:1, 1:N or N:N, each a text or
``{"content": [parts]}`` with images; the score of a pair is the cosine of their embeddings."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from services.gateway.protocol.chat import ChatMessage, ContentPart
from services.gateway.protocol.completion import TokenIds
from services.gateway.protocol.media_fields import MmProcessorKwargs
from services.gateway.protocol.responses import PromptTokensDetails
from services.gateway.protocol.sampling_request import INT32_MAX
from services.gateway.protocol.wire_base import NonEmptyStr, WireModel

MAX_INPUTS = 2048  # embeddings per request (OpenAI's limit)


class _Pooled(WireModel):
    """What every pooling request shares."""

    model: str | None = None
    truncate_prompt_tokens: int | None = Field(
        None, ge=-1, le=INT32_MAX, description="keep the last this many tokens; -1: all the model takes"
    )
    cache_salt: str | None = Field(None, description="requests with different salts never share cached prefixes")
    user: str | None = Field(None, max_length=256, description="an end-user id, for the operator's logs")
    mm_processor_kwargs: MmProcessorKwargs | None = None

    @model_validator(mode="after")
    def _keeps_a_token(self):
        if self.truncate_prompt_tokens == 0:
            raise ValueError("truncate_prompt_tokens must be at least 1, or -1 for the model length")
        return self


class EmbeddingRequest(_Pooled):
    input: (
        NonEmptyStr
        | TokenIds
        | Annotated[list[NonEmptyStr], Field(min_length=1, max_length=MAX_INPUTS)]
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_INPUTS)]
        | None
    ) = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, le=INT32_MAX, description="Matryoshka models only")
    add_generation_prompt: bool = Field(False, description="messages only: the template's generation prompt after them")
    continue_final_message: bool = False
    chat_template_kwargs: dict | None = None

    @model_validator(mode="after")
    def _one_prompt(self):
        if (self.input is None) == (self.messages is None):
            raise ValueError("give exactly one of 'input' and 'messages'")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        return self

    def inputs(self) -> list[str | list[int]]:
        """``input`` as a list of prompts, each a text or token ids."""
        value = self.input
        if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], int)):
            return [value]
        return list(value or ())

    def template_kwargs(self) -> dict:
        own = {"add_generation_prompt": self.add_generation_prompt}
        if self.continue_final_message:
            own["continue_final_message"] = True
        return {**own, **(self.chat_template_kwargs or {})}


class ScoreContent(WireModel):
    content: Annotated[list[ContentPart], Field(min_length=1)]


ScoreInput = NonEmptyStr | ScoreContent
ScoreSide = ScoreInput | Annotated[list[ScoreInput], Field(min_length=1, max_length=MAX_INPUTS)]


class ScoreRequest(_Pooled):
    queries: ScoreSide | None = None
    documents: ScoreSide | None = None
    text_1: ScoreSide | None = None  # vLLM's older names
    text_2: ScoreSide | None = None

    @model_validator(mode="after")
    def _pairs(self):
        if (self.queries is None) == (self.text_1 is None) or (self.documents is None) == (self.text_2 is None):
            raise ValueError("give 'queries' and 'documents' (or 'text_1' and 'text_2')")
        first, second = self.sides()
        if len(first) > 1 and len(first) != len(second):
            raise ValueError("Input lengths must be either 1:1, 1:N or N:N")
        return self

    def sides(self) -> tuple[list[str | ScoreContent], list[str | ScoreContent]]:
        first = self.queries if self.queries is not None else self.text_1
        second = self.documents if self.documents is not None else self.text_2
        return _listed(first), _listed(second)


def _listed(side) -> list:
    return side if isinstance(side, list) else [side]


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None  # the prompt tokens a cached prefix served


class EmbeddingData(BaseModel):
    index: int
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str  # base64: float32 little-endian bytes


class EmbeddingResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[EmbeddingData]
    usage: EmbeddingUsage


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: EmbeddingUsage
