"""OpenAI chat-completions schema: validate a request body, build responses and stream chunks."""

from __future__ import annotations

import time
from dataclasses import dataclass

from services.engine.sampling import SamplingParams
from services.gateway.errors import GatewayError

SUPPORTED_FIELDS = {
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "user",
    "cache_salt",
    "top_k",
    "ignore_eos",
    "frequency_penalty",
    "presence_penalty",
}


@dataclass(frozen=True, slots=True)
class ChatRequest:
    preprocess_body: dict
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    cache_salt: str | None


def parse_chat_request(body: object, *, served_model: str, default_max_tokens: int) -> ChatRequest:
    if not isinstance(body, dict):
        raise GatewayError(400, "request body must be a JSON object")
    unknown = sorted(set(body) - SUPPORTED_FIELDS)
    if unknown:
        raise GatewayError(400, f"unsupported field(s): {', '.join(unknown)}", param=unknown[0])
    model = body.get("model")
    if model is not None and model != served_model:
        raise GatewayError(
            404,
            f"the model '{model}' does not exist; this server serves '{served_model}'",
            error_type="invalid_request_error",
            code="model_not_found",
            param="model",
        )
    if "messages" not in body:
        raise GatewayError(400, "'messages' is required", param="messages")
    if body.get("n", 1) != 1:
        raise GatewayError(400, "only n=1 is supported", param="n")
    for name in ("frequency_penalty", "presence_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise GatewayError(400, f"{name} is not supported", param=name)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4):
        raise GatewayError(400, "'stop' must be a string or a list of at most 4 strings", param="stop")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise GatewayError(400, "'stream_options' must be an object", param="stream_options")
    try:
        sampling = SamplingParams(
            max_tokens=_int(max_tokens, "max_tokens") if max_tokens is not None else default_max_tokens,
            temperature=_number(body.get("temperature", 1.0), "temperature"),
            top_p=_number(body.get("top_p", 1.0), "top_p"),
            top_k=_int(body.get("top_k", 0), "top_k"),
            seed=_int(body["seed"], "seed") if body.get("seed") is not None else None,
            stop=tuple(stop or ()),
            ignore_eos=bool(body.get("ignore_eos", False)),
        )
    except ValueError as exc:
        raise GatewayError(400, str(exc)) from None
    if sampling.temperature > 2:
        raise GatewayError(400, "temperature must be between 0 and 2", param="temperature")
    cache_salt = body.get("cache_salt")
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise GatewayError(400, "'cache_salt' must be a string", param="cache_salt")
    return ChatRequest(
        preprocess_body={"messages": body["messages"]},
        sampling=sampling,
        stream=bool(body.get("stream", False)),
        include_usage=bool(stream_options.get("include_usage", False)),
        cache_salt=cache_salt,
    )


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GatewayError(400, f"'{name}' must be a number", param=name)
    return float(value)


def _int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GatewayError(400, f"'{name}' must be an integer", param=name)
    return value


def usage_json(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def completion_json(request_id: str, model: str, text: str, finish_reason: str, usage: dict) -> dict:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason, "logprobs": None}],
        "usage": usage,
    }


def chunk_json(
    request_id: str, model: str, *, delta: dict, finish_reason: str | None = None, usage: dict | None = None, choices: bool = True
) -> dict:
    chunk = {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model, "choices": []}
    if choices:
        chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
    if usage is not None:
        chunk["usage"] = usage
    return chunk
