"""From the OpenAI wire models to the pipeline's inputs: one Generation per choice.

A chat request is one prompt; a completion request is a batch of prompts. Each prompt gets
``n`` choices, numbered prompt-major (choice = prompt * n + i, as OpenAI numbers them), and
choice i samples with ``seed + i`` so seeded choices differ yet stay reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from services.engine.sampling import SamplingParams
from services.gateway.completion_protocol import CompletionRequest
from services.gateway.errors import GatewayError
from services.gateway.protocol import GREEDY_TEMPERATURE_EPS, INT64_MIN, ChatCompletionRequest, SamplingFields
from services.gateway.tenants import Tenant
from services.gateway.validation_errors import validation_error


@dataclass(frozen=True, slots=True)
class Generation:
    """One choice: what the pipeline runs."""

    index: int
    prompt_index: int
    preprocess_body: dict
    sampling: SamplingParams
    cache_salt: str | None
    # max_tokens was not given: the default shrinks to the context the prompt leaves (as vLLM
    # does), instead of failing a long prompt that the default alone would push over the limit.
    fit_max_tokens: bool = False


@dataclass(frozen=True, slots=True)
class ApiRequest:
    generations: tuple[Generation, ...]
    stream: bool
    include_usage: bool


def to_chat_request(
    request: ChatCompletionRequest, *, served_model: str, default_max_tokens: int, tenant: Tenant | None = None
) -> ApiRequest:
    _check_model(request, served_model)
    messages = [message.model_dump(exclude_none=True) for message in request.messages]
    if tenant is not None:
        for message in messages:
            for part in message["content"] if isinstance(message.get("content"), list) else ():
                if "uuid" in part:
                    part["uuid"] = tenant.image_uuid(part["uuid"])
    max_tokens = request.max_completion_tokens or request.max_tokens or default_max_tokens
    fit = request.max_completion_tokens is None and request.max_tokens is None
    return _fan_out(request, [{"messages": messages}], max_tokens, tenant, fit_max_tokens=fit)


def to_completion_request(request: CompletionRequest, *, served_model: str, tenant: Tenant | None = None) -> ApiRequest:
    _check_model(request, served_model)
    images = request.multi_modal_data.images() if request.multi_modal_data is not None else []
    if tenant is not None:
        images = [
            {**image, "uuid": tenant.image_uuid(image["uuid"])} if isinstance(image, dict) and "uuid" in image else image
            for image in images
        ]
    bodies = [
        {"prompt": prompt, "images": images} if isinstance(prompt, str) else {"prompt_token_ids": prompt, "images": images}
        for prompt in request.prompts()
    ]
    return _fan_out(request, bodies, request.max_tokens or 16, tenant, fit_max_tokens=request.max_tokens is None)


def parse_chat_request(body: object, *, served_model: str, default_max_tokens: int, tenant: Tenant | None = None) -> ApiRequest:
    """A raw JSON body (the Generate API's request_json) through the same model as HTTP."""
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None
    return to_chat_request(request, served_model=served_model, default_max_tokens=default_max_tokens, tenant=tenant)


def _fan_out(
    request: ChatCompletionRequest | CompletionRequest, bodies: list[dict], max_tokens: int, tenant: Tenant | None, *, fit_max_tokens: bool
) -> ApiRequest:
    cache_salt = tenant.cache_salt(request.cache_salt) if tenant is not None else request.cache_salt
    generations = tuple(
        Generation(
            index=prompt_index * request.n + i,
            prompt_index=prompt_index,
            preprocess_body=body,
            sampling=_sampling(request, max_tokens, choice=i),
            cache_salt=cache_salt,
            fit_max_tokens=fit_max_tokens,
        )
        for prompt_index, body in enumerate(bodies)
        for i in range(request.n)
    )
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    return ApiRequest(generations=generations, stream=request.stream, include_usage=include_usage)


def _sampling(request: ChatCompletionRequest | CompletionRequest, max_tokens: int, *, choice: int) -> SamplingParams:
    seed = None if request.seed is None else (request.seed + choice - INT64_MIN) % 2**64 + INT64_MIN  # stays in int64
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0 if request.temperature < GREEDY_TEMPERATURE_EPS else request.temperature,
        top_p=request.top_p,
        top_k=max(request.top_k, 0),
        seed=seed,
        stop=request.stop_strings(),
        ignore_eos=request.ignore_eos,
        logprobs=request.num_logprobs(),
    )


def _check_model(request: SamplingFields, served_model: str) -> None:
    if request.model is not None and request.model != served_model:
        raise GatewayError(
            404,
            f"the model '{request.model}' does not exist; this server serves '{served_model}'",
            code="model_not_found",
            param="model",
        )
