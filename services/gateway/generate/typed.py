"""A typed public GenerateRequest (protos/tessera.proto) to the pipeline's choices: the
protobuf counterpart of openai_api.py, with the same rules (served names, n choices with seed +
i, the default max_tokens shrunk to the context, --max-logprobs, tenant-scoped cache salt and
image uuids)."""

from __future__ import annotations

import uuid
from dataclasses import replace

from protos.gen import pb
from services.engine.sampling_params import SamplingParams
from services.engine.sampling_wire import sampling_from_pb
from services.gateway.errors import GatewayError
from services.gateway.frontend.limits import NO_LIMITS, RequestLimits
from services.gateway.frontend.openai_api import Generation, check_model, lora_of
from services.gateway.frontend.prompt_wire import scoped_prompt
from services.gateway.frontend.sampling import choice_seed
from services.gateway.frontend.served_adapters import ServedAdapters
from services.gateway.frontend.tenants import Tenant, request_cache_salt
from services.gateway.protocol.sampling_request import MAX_CHOICES


def typed_generations(
    request: pb.GenerateRequest,
    *,
    served_names: tuple[str, ...],
    default_max_tokens: int,
    tenant: Tenant | None,
    limits: RequestLimits = NO_LIMITS,
    adapters: ServedAdapters | None = None,
) -> tuple[str, tuple[Generation, ...]]:
    """The request id its chunks carry, and one Generation per choice; ``limits``: the
    deployment's (limits.py), as the HTTP API applies them."""
    lora = lora_of(check_model(request.model or None, served_names, adapters), adapters)
    num_choices = request.n or 1
    if num_choices > MAX_CHOICES:
        raise GatewayError(400, f"n must be at most {MAX_CHOICES}, got {num_choices}", param="n")
    wire = pb.SamplingParams()
    wire.CopyFrom(request.sampling)
    fit = wire.max_tokens == 0  # proto3 zeros are "not set": the defaults the proto documents
    if fit:
        wire.max_tokens = default_max_tokens
    if wire.top_p == 0:
        wire.top_p = 1.0
    if wire.HasField("logprobs"):
        wire.logprobs = limits.logprobs(wire.logprobs, "sample logprobs", "sampling.logprobs")
    if wire.HasField("prompt_logprobs"):
        wire.prompt_logprobs = limits.logprobs(wire.prompt_logprobs, "prompt logprobs", "sampling.prompt_logprobs")
    try:
        sampling = sampling_from_pb(wire)
    except ValueError as exc:
        raise GatewayError(400, f"sampling: {exc}", param="sampling") from None
    prompt = scoped_prompt(request.prompt, tenant)
    cache_salt = request_cache_salt(tenant, request.cache_salt or None)
    generations = tuple(
        Generation(
            index=i, prompt_index=0, prompt=prompt, sampling=_for_choice(sampling, i), cache_salt=cache_salt, lora=lora, fit_max_tokens=fit
        )
        for i in range(num_choices)
    )
    return request.request_id or f"gen-{uuid.uuid4().hex}", generations


def _for_choice(sampling: SamplingParams, choice: int) -> SamplingParams:
    return sampling if sampling.seed is None else replace(sampling, seed=choice_seed(sampling.seed, choice))
