"""vLLM's ``/v1/chat/completions/batch``: several conversations in one request, one choice each.

The body is a chat completion request whose ``messages`` is a list of conversations. Every other
field applies to each conversation alike, so each is checked by the chat request model itself
(the same rules, the same 400s) and runs as its own prompt; choice i answers conversation i, and
the usage counts every prompt once. As vLLM: no streaming, no tools, no ``n`` > 1, and no
forwarded prompt ids (one list of ids cannot stand for several conversations).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from services.gateway.errors import GatewayError
from services.gateway.frontend.limits import NO_LIMITS, RequestLimits
from services.gateway.frontend.openai_api import ApiRequest, pop_ignored_fields, to_chat_request
from services.gateway.frontend.served_adapters import ServedAdapters
from services.gateway.frontend.tenants import Tenant
from services.gateway.protocol.batch_chat import BatchChatCompletionRequest
from services.gateway.protocol.chat import ChatCompletionRequest
from services.gateway.protocol.validation_errors import validation_error
from services.models.sampling_defaults import NO_DEFAULTS, SamplingDefaults


def conversations(batch: BatchChatCompletionRequest) -> list[ChatCompletionRequest]:
    """One chat request per conversation, each validated as /v1/chat/completions validates."""
    shared = dict(batch.model_extra or {})
    _refuse_batch_only(shared)
    requests = []
    for number, conversation in enumerate(batch.messages):
        try:
            requests.append(ChatCompletionRequest.model_validate({**shared, "messages": conversation}))
        except ValidationError as exc:
            raise _in_conversation(validation_error(exc.errors()), number) from None
    return requests


def _in_conversation(error: GatewayError, number: int) -> GatewayError:
    """A conversation's error as the batch names it: ``messages[1][0].content``, or a shared
    field's prefixed with the conversation it failed in."""
    param = error.param
    if param is not None and param.startswith("messages"):
        param = f"messages[{number}]" + param.removeprefix("messages")
        return GatewayError(400, param + error.message.removeprefix(error.param or ""), param=param)
    return GatewayError(400, f"conversation {number}: {error.message}", param=param)


def _refuse_batch_only(shared: dict[str, Any]) -> None:
    """What vLLM's batch endpoint refuses, though one conversation may ask it."""
    refused = {
        "stream": shared.get("stream") not in (None, False),
        "use_beam_search": shared.get("use_beam_search") not in (None, False),
        "tools": bool(shared.get("tools")),
        "n": shared.get("n") not in (None, 1),
        "kv_transfer_params": (shared.get("kv_transfer_params") or {}).get("prompt_token_ids") is not None,
    }
    for field, asked in refused.items():
        if asked:
            raise GatewayError(400, f"Batch chat completions do not support `{field}` as sent ({shared[field]!r})", param=field)


def to_batch_chat_request(
    batch: BatchChatCompletionRequest,
    *,
    served_names: tuple[str, ...],
    default_max_tokens: int,
    tenant: Tenant | None,
    sampling_defaults: SamplingDefaults = NO_DEFAULTS,
    limits: RequestLimits = NO_LIMITS,
    adapters: ServedAdapters | None = None,
) -> tuple[ApiRequest, list[str], list[str]]:
    """(the conversations as one request, choice i for conversation i; each one's echo; the
    fields no conversation's model knows, by name)."""
    requests = conversations(batch)
    ignored = list(dict.fromkeys(name for request in requests for name in pop_ignored_fields(request)))
    singles = [
        to_chat_request(
            r,
            served_names=served_names,
            default_max_tokens=default_max_tokens,
            tenant=tenant,
            sampling_defaults=sampling_defaults,
            limits=limits,
            adapters=adapters,
        )
        for r in requests
    ]
    generations = tuple(replace(single.generations[0], index=i, prompt_index=i) for i, single in enumerate(singles))
    return replace(singles[0], generations=generations, echo=""), [single.echo for single in singles], ignored
