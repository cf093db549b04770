"""Between the OpenAI wire models and the pipeline: a validated request becomes the pipeline's
inputs, pipeline token events become responses and stream chunks, and a pydantic validation
failure becomes one OpenAI error naming the offending field."""

from __future__ import annotations

import time
from dataclasses import dataclass

from pydantic import ValidationError

from services.engine.sampling import SamplingParams
from services.gateway.errors import GatewayError
from services.gateway.protocol import (
    GREEDY_TEMPERATURE_EPS,
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChunkChoice,
    ChunkDelta,
    PromptTokensDetails,
    Usage,
)


@dataclass(frozen=True, slots=True)
class ChatRequest:
    preprocess_body: dict
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    cache_salt: str | None


def to_chat_request(request: ChatCompletionRequest, *, served_model: str, default_max_tokens: int) -> ChatRequest:
    if request.model is not None and request.model != served_model:
        raise GatewayError(
            404,
            f"the model '{request.model}' does not exist; this server serves '{served_model}'",
            code="model_not_found",
            param="model",
        )
    max_tokens = request.max_completion_tokens or request.max_tokens or default_max_tokens
    temperature = 0.0 if request.temperature < GREEDY_TEMPERATURE_EPS else request.temperature
    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=request.top_p,
        top_k=max(request.top_k, 0),
        seed=request.seed,
        stop=request.stop_strings(),
        ignore_eos=request.ignore_eos,
    )
    messages = [message.model_dump(exclude_none=True) for message in request.messages]
    return ChatRequest(
        preprocess_body={"messages": messages},
        sampling=sampling,
        stream=request.stream,
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        cache_salt=request.cache_salt,
    )


def parse_chat_request(body: object, *, served_model: str, default_max_tokens: int) -> ChatRequest:
    """A raw JSON body (the Generate API's request_json) through the same model as HTTP."""
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None
    return to_chat_request(request, served_model=served_model, default_max_tokens=default_max_tokens)


def validation_error(errors) -> GatewayError:
    """pydantic's error list as one 400 naming the field (``param``). Of a union's failed
    branches the deepest is the informative one; branches failing at the same depth are joined."""
    if not errors:
        return GatewayError(400, "invalid request")
    if errors[0].get("type") == "json_invalid":
        detail = (errors[0].get("ctx") or {}).get("error", "")
        return GatewayError(400, f"request body is not valid JSON: {detail}".rstrip(": "))
    depth = max(len(e.get("loc", ())) for e in errors)
    deepest = [e for e in errors if len(e.get("loc", ())) == depth]
    path = _field_path(deepest[0].get("loc", ()))
    messages = list(dict.fromkeys(_message(e) for e in deepest if _field_path(e.get("loc", ())) == path))
    message = " or ".join(messages)
    if not path and deepest[0].get("type") in ("model_type", "dict_type", "model_attributes_type"):
        message = "request body must be a JSON object"
    return GatewayError(400, f"{path}: {message}" if path else message, param=path or None)


def _message(error) -> str:
    ctx = error.get("ctx") or {}
    if error.get("type") == "extra_forbidden":
        return "unsupported field"
    if error.get("type") == "union_tag_invalid":
        return f"unsupported content part type {ctx.get('tag')!r} (expected {ctx.get('expected_tags')})"
    return str(error.get("msg", "invalid value")).removeprefix("Value error, ")


def _field_path(loc) -> str:
    """('body', 'messages', 0, 'content', 'list[tagged-union[...]]', 1, 'image_url', 'url') ->
    messages[0].content[1].url: the names pydantic gives union branches (``str``,
    ``list[...]``, ``ImageUrl``) and a tagged union's tag after an index are not fields."""
    out, after_tagged_index = "", False
    parts = [p for p in loc if p != "body"]
    for i, part in enumerate(parts):
        if isinstance(part, int):
            out += f"[{part}]"
            after_tagged_index = i > 0 and "tagged-union" in str(parts[i - 1])
            continue
        is_tag, after_tagged_index = after_tagged_index, False
        if is_tag or "[" in part or part in _BRANCH_NAMES or part[:1].isupper():
            continue
        out += f".{part}" if out else part
    return out


_BRANCH_NAMES = frozenset({"str", "int", "float", "bool", "constrained-str", "constrained-int", "constrained-float"})


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


def completion(request_id: str, model: str, text: str, finish_reason: str, usage: Usage) -> ChatCompletionResponse:
    choice = ChatChoice(index=0, message=AssistantMessage(content=text), finish_reason=finish_reason)
    return ChatCompletionResponse(id=request_id, created=int(time.time()), model=model, choices=[choice], usage=usage)


def chunk(
    request_id: str, model: str, *, delta: ChunkDelta | None, finish_reason: str | None = None, usage: Usage | None = None
) -> ChatCompletionChunk:
    """A stream chunk; ``delta=None`` is the usage-only chunk, which has no choices."""
    choices = [] if delta is None else [ChunkChoice(index=0, delta=delta, finish_reason=finish_reason)]
    return ChatCompletionChunk(id=request_id, created=int(time.time()), model=model, choices=choices, usage=usage)
