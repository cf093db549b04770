"""From the OpenAI wire models to the pipeline's inputs: one Generation per choice.

A chat request is one prompt; a completion request is a batch of prompts. Each prompt gets
``n`` choices, numbered prompt-major (choice = prompt * n + i, as OpenAI numbers them), and
choice i samples with ``seed + i`` so seeded choices differ yet stay reproducible.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from pydantic import BaseModel, ValidationError

from protos.gen import pb
from services.engine.sampling_params import SamplingParams, StructuredOutput
from services.gateway.errors import GatewayError
from services.gateway.frontend.limits import NO_LIMITS, RequestLimits
from services.gateway.frontend.media_budget import has_media
from services.gateway.frontend.prompt_wire import chat_prompt, raw_prompt, truncation
from services.gateway.frontend.sampling import BeamSearch, beam_search_of, sampling_params, structured_output
from services.gateway.frontend.served_adapters import ServedAdapters
from services.gateway.frontend.tenants import Tenant, request_cache_salt
from services.gateway.output.tool_calls import ToolMode, tool_mode_of
from services.gateway.protocol.chat import ChatCompletionRequest
from services.gateway.protocol.completion import CompletionRequest
from services.gateway.protocol.validation_errors import validation_error
from services.models.sampling_defaults import NO_DEFAULTS, SamplingDefaults
from shared.types import LoraRef

log = logging.getLogger("tessera.gateway")


@dataclass(frozen=True, slots=True)
class Generation:
    """One choice: what the pipeline runs."""

    index: int
    prompt_index: int
    prompt: pb.PromptInput
    sampling: SamplingParams
    cache_salt: str | None
    lora: LoraRef | None = None  # the LoRA adapter the request's model named; None: the base model
    # max_tokens was not given: the default shrinks to the context the prompt leaves (as vLLM
    # does), instead of failing a long prompt that the default alone would push over the limit.
    fit_max_tokens: bool = False


@dataclass(frozen=True, slots=True)
class ApiRequest:
    model: str  # the served name the response carries: the one the request named
    generations: tuple[Generation, ...]
    stream: bool
    include_usage: bool
    continuous_usage: bool = False  # every chunk carries the usage so far
    tool_mode: ToolMode | None = None  # chat only: how the output becomes tool calls
    echo: str = ""  # chat only: text each choice's reply starts with (ChatCompletionRequest.echoed_text)
    return_token_ids: bool = False  # vLLM's: prompt and output token ids in the response
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids: logprobs name tokens by id
    beam: BeamSearch | None = None  # use_beam_search: the choices are the best beams (beam_search.py)


def to_chat_request(
    request: ChatCompletionRequest,
    *,
    served_names: tuple[str, ...],
    default_max_tokens: int,
    tenant: Tenant | None = None,
    tool_parser: str | None = None,
    sampling_defaults: SamplingDefaults = NO_DEFAULTS,
    limits: RequestLimits = NO_LIMITS,
    adapters: ServedAdapters | None = None,
) -> ApiRequest:
    """``tool_parser``: the model family's tool-call parser (tool_calls.py), if it has one;
    ``sampling_defaults``: the checkpoint's, for the sampling fields the request leaves unset;
    ``limits``: the deployment's (limits.py); ``adapters``: the LoRA adapters served, which
    ``model`` may name."""
    model = check_model(request.model, served_names, adapters)
    tools = tool_mode_of(request.tools, request.tool_choice, tool_parser, parallel=request.parallel_tool_calls is not False)
    max_tokens = request.max_completion_tokens or request.max_tokens or default_max_tokens
    fit = request.max_completion_tokens is None and request.max_tokens is None
    prompt = chat_prompt(request.messages, request.tools, request.template_kwargs(), tenant, request.mm_processor_kwargs)
    if (forwarded := request.forwarded_prompt_ids()) is not None:
        if has_media(prompt):
            raise GatewayError(400, "kv_transfer_params.prompt_token_ids cannot stand for messages with images or videos")
        prompt = raw_prompt(forwarded, [], tenant)
    structured = structured_output(request)
    forced = tools.constraint() if tools is not None else None
    if forced is not None and structured is not None:
        raise GatewayError(400, f"tool_choice {tools.kind} constrains the output already; drop the structured output it conflicts with")
    fanned = _fan_out(
        request,
        model,
        [prompt],
        max_tokens,
        tenant,
        fit_max_tokens=fit,
        structured=forced or structured,
        tool_mode=tools,
        sampling_defaults=sampling_defaults,
        limits=limits,
        lora=lora_of(model, adapters),
    )
    return replace(fanned, echo=request.echoed_text())


def to_completion_request(
    request: CompletionRequest,
    *,
    served_names: tuple[str, ...],
    tenant: Tenant | None = None,
    sampling_defaults: SamplingDefaults = NO_DEFAULTS,
    limits: RequestLimits = NO_LIMITS,
    adapters: ServedAdapters | None = None,
) -> ApiRequest:
    model = check_model(request.model, served_names, adapters)
    media = request.multi_modal_data
    images, videos = (media.images(), media.videos()) if media is not None else ([], [])
    prompts = [raw_prompt(prompt, images, tenant, videos, request.mm_processor_kwargs) for prompt in request.prompts()]
    return _fan_out(
        request,
        model,
        prompts,
        16 if request.max_tokens is None else max(request.max_tokens, 1),  # echo alone still runs one step
        tenant,
        fit_max_tokens=request.max_tokens is None,
        structured=structured_output(request),
        sampling_defaults=sampling_defaults,
        limits=limits,
        lora=lora_of(model, adapters),
    )


def chat_body(body: object, route: str) -> ChatCompletionRequest:
    """A raw JSON chat body (the Generate API's request_json) validated as HTTP validates it,
    its unknown fields logged and dropped."""
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None
    report_ignored_fields(request, route)
    return request


def _fan_out(
    request: ChatCompletionRequest | CompletionRequest,
    model: str,
    prompts: list[pb.PromptInput],
    max_tokens: int,
    tenant: Tenant | None,
    *,
    fit_max_tokens: bool,
    structured: StructuredOutput | None,
    tool_mode: ToolMode | None = None,
    sampling_defaults: SamplingDefaults = NO_DEFAULTS,
    limits: RequestLimits = NO_LIMITS,
    lora: LoraRef | None = None,
) -> ApiRequest:
    cache_salt = request_cache_salt(tenant, request.cache_salt)
    if (wire_truncation := truncation(request, limits.max_model_len)) is not None:
        for prompt in prompts:
            prompt.truncation.CopyFrom(wire_truncation)
    generations = tuple(
        Generation(
            index=prompt_index * request.n + i,
            prompt_index=prompt_index,
            prompt=prompt,
            sampling=sampling_params(request, max_tokens, choice=i, structured=structured, defaults=sampling_defaults, limits=limits),
            cache_salt=cache_salt,
            lora=lora,
            fit_max_tokens=fit_max_tokens,
        )
        for prompt_index, prompt in enumerate(prompts)
        for i in range(request.n)
    )
    options = request.stream_options
    return ApiRequest(
        model=model,
        generations=generations,
        stream=request.stream,
        include_usage=bool(options and options.include_usage),
        continuous_usage=bool(options and options.include_usage and options.continuous_usage_stats),  # as vLLM: only with usage
        tool_mode=tool_mode,
        return_token_ids=request.return_token_ids,
        tokens_as_ids=bool(request.return_tokens_as_token_ids),
        beam=beam_search_of(request, max_tokens, fit_max_tokens=fit_max_tokens),
    )


def check_model(requested: str | None, served_names: tuple[str, ...], adapters: ServedAdapters | None = None) -> str:
    """The served name a request's ``model`` names (the first when it names none): the base
    model's, or a LoRA adapter's."""
    if requested is None:
        return served_names[0]
    if requested not in served_names and (adapters is None or requested not in adapters.by_name):
        names = [*served_names, *(served.ref.name for served in adapters or ())]
        raise GatewayError(
            404,
            f"the model '{requested}' does not exist; this server serves {', '.join(repr(n) for n in names)}",
            code="model_not_found",
            param="model",
        )
    return requested


def lora_of(model: str, adapters: ServedAdapters | None) -> LoraRef | None:
    """The adapter a resolved ``model`` names; None for the base model."""
    served = adapters.by_name.get(model) if adapters is not None else None
    return None if served is None else served.ref


# Fields a request carried that the server does not know: accepted and ignored, as vLLM does.
#
# The wire models keep unknown fields aside (pydantic's ``extra="allow"``); this takes them out of
# the validated request, so nothing downstream ever sees them, and names them by their path
# (``metadata``, ``messages[1].reasoning_content``) for the log and the response header.
HEADER = "tessera-ignored-fields"


def pop_ignored_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """The unknown fields' paths, in request order; ``model`` no longer holds them."""
    extra = model.__pydantic_extra__
    names = [prefix + name for name in extra or ()]
    if extra:
        extra.clear()
    for name in type(model).model_fields:
        names += _walk(getattr(model, name), prefix + name)
    return names


def _walk(value: object, path: str) -> list[str]:
    if isinstance(value, BaseModel):
        return pop_ignored_fields(value, path + ".")
    if isinstance(value, list):
        return [name for i, item in enumerate(value) for name in _walk(item, f"{path}[{i}]")]
    return []


def report_ignored_fields(model: BaseModel, route: str) -> dict[str, str]:
    """Takes the unknown fields out of ``model``, logs them once, and returns the header naming
    them (empty when there were none)."""
    return ignored_header(pop_ignored_fields(model), route)


def ignored_header(names: list[str], route: str) -> dict[str, str]:
    """The header naming the ignored fields ``names`` (empty when there are none), logged once."""
    if not names:
        return {}
    log.warning("%s: ignored fields the server does not know: %s", route, ", ".join(names))
    return {HEADER: ", ".join(names)}
