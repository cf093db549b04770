"""Embeddings and scores through the front door: the same guards as a generation (draining,
admission, the media budget, the model's names and tenant scoping), then one pipeline embed per
prompt, all at once.

What a gateway serves is its runner's (vLLM's ``--runner``): a pooling gateway refuses chat and
completions, a generating one embeddings and score: 404, as vLLM (which registers no route for
them), with the message of vLLM's missing handler (Frontend.check_serves); ``--runner both``
serves both on one deployment, so an image embedded for retrieval and then asked about shares
every cache.

Prompts as vLLM builds them for an embedding model: ``input`` texts and token ids raw (no template),
``messages`` through the chat template (no generation prompt unless asked). A score input that is
content parts (an image and text) is rendered as one user message through the chat template,
where vLLM joins the parts into raw text with the model's placeholders: the template is what
this gateway knows of where an image goes; plain texts are raw on both.
"""

from __future__ import annotations

import asyncio
import base64
import math
import time
import uuid
from array import array

from protos.gen import pb
from services.gateway.errors import GatewayError
from services.gateway.frontend.openai_api import Generation, check_model
from services.gateway.frontend.prompt_wire import chat_prompt, raw_prompt
from services.gateway.frontend.tenants import Tenant, request_cache_salt
from services.gateway.pipeline.pipeline import EMBED_SAMPLING
from services.gateway.pipeline.token_events import EmbeddingEvent
from services.gateway.protocol.chat import ChatMessage
from services.gateway.protocol.embeddings import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
    ScoreContent,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from services.gateway.protocol.responses import PromptTokensDetails


def embedding_prompts(request: EmbeddingRequest, tenant: Tenant | None, max_model_len: int) -> list[pb.PromptInput]:
    if request.messages is not None:
        prompts = [chat_prompt(request.messages, None, request.template_kwargs(), tenant, request.mm_processor_kwargs)]
    else:
        prompts = [raw_prompt(p, [], tenant) for p in request.inputs()]
    return _truncated(prompts, request.truncate_prompt_tokens, max_model_len)


def score_prompts(request: ScoreRequest, tenant: Tenant | None, max_model_len: int) -> tuple[list[pb.PromptInput], list[pb.PromptInput]]:
    def prompt(item: str | ScoreContent) -> pb.PromptInput:
        if isinstance(item, str):
            return raw_prompt(item, [], tenant)
        message = ChatMessage(role="user", content=item.content)
        return chat_prompt([message], None, {"add_generation_prompt": False}, tenant, request.mm_processor_kwargs)

    first, second = request.sides()
    truncate = request.truncate_prompt_tokens
    return _truncated([prompt(i) for i in first], truncate, max_model_len), _truncated([prompt(i) for i in second], truncate, max_model_len)


def _truncated(prompts: list[pb.PromptInput], asked: int | None, max_model_len: int) -> list[pb.PromptInput]:
    """vLLM's truncate_prompt_tokens for a pooling request: keep the last ``asked`` tokens; -1,
    the model length (nothing is generated, so no token is left for an output)."""
    if asked is None:
        return prompts
    wire = pb.Truncation(num_tokens=max_model_len if asked == -1 else asked, side=pb.Truncation.LEFT)
    for prompt in prompts:
        prompt.truncation.CopyFrom(wire)
    return prompts


async def embed_all(
    frontend, prompts: list[pb.PromptInput], *, dimensions: int | None, cache_salt: str | None, request_id: str | None = None
) -> list[EmbeddingEvent]:
    """Admit the prompts and their media as a generation's choices, then embed them at once.
    ``frontend``: services/gateway/frontend/frontend.py's Frontend."""
    limit = frontend.config.max_num_requests
    if len(prompts) > limit:  # never admitted, however long the client waits: not a 429
        raise GatewayError(400, f"{len(prompts)} inputs in one request; this gateway runs at most {limit} at once (--max-num-requests)")
    generations = tuple(Generation(i, i, prompt, EMBED_SAMPLING, cache_salt) for i, prompt in enumerate(prompts))
    admitted = await frontend.admit(generations)
    state = frontend.state
    ids = [None] * len(prompts) if request_id is None else [f"{request_id}.{i}" for i in range(len(prompts))]
    calls = (state.pipeline.embed(p, dimensions=dimensions, cache_salt=cache_salt, request_id=i) for p, i in zip(prompts, ids))
    tasks = [asyncio.ensure_future(call) for call in calls]
    state.num_in_flight += len(tasks)  # a draining gateway waits for them as for streams
    try:
        return list(await asyncio.gather(*tasks))
    finally:  # one failed (or the client left): the others stop too, before their budgets are returned
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        state.num_in_flight -= len(tasks)
        admitted.release()


async def embeddings(frontend, request: EmbeddingRequest, tenant: Tenant | None) -> EmbeddingResponse:
    config = frontend.config
    frontend.check_serves("embeddings")
    frontend.check_open()
    model = check_model(request.model, config.served_names)
    prompts = embedding_prompts(request, tenant, frontend.state.pipeline.max_model_len)
    salt = request_cache_salt(tenant, request.cache_salt)
    events = await embed_all(frontend, prompts, dimensions=request.dimensions, cache_salt=salt)
    data = [EmbeddingData(index=i, embedding=encoded(e.embedding, request.encoding_format)) for i, e in enumerate(events)]
    return EmbeddingResponse(id=f"embd-{uuid.uuid4().hex}", created=int(time.time()), model=model, data=data, usage=_usage(events))


async def score(frontend, request: ScoreRequest, tenant: Tenant | None) -> ScoreResponse:
    """vLLM's score for an embedding model: the cosine of each pair's embeddings (one query
    against every document, or pairwise)."""
    config = frontend.config
    frontend.check_serves("score")
    frontend.check_open()
    model = check_model(request.model, config.served_names)
    first, second = score_prompts(request, tenant, frontend.state.pipeline.max_model_len)
    salt = request_cache_salt(tenant, request.cache_salt)
    events = await embed_all(frontend, [*first, *second], dimensions=None, cache_salt=salt)
    queries, documents = events[: len(first)], events[len(first) :]
    pairs = zip(queries * len(documents) if len(queries) == 1 else queries, documents)
    data = [ScoreData(index=i, score=cosine(q.embedding, d.embedding)) for i, (q, d) in enumerate(pairs)]
    return ScoreResponse(id=f"score-{uuid.uuid4().hex}", created=int(time.time()), model=model, data=data, usage=_usage(events))


def encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    """float: the values; base64: their float32 little-endian bytes (as vLLM and OpenAI send them)."""
    if encoding_format == "float":
        return vector
    values = array("f", vector)
    if values.itemsize != 4:
        raise GatewayError(500, "this platform has no 4-byte float array")
    if array("H", [1]).tobytes() != b"\x01\x00":
        values.byteswap()
    return base64.b64encode(values.tobytes()).decode("ascii")


def cosine(a: list[float], b: list[float]) -> float:
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return sum(x * y for x, y in zip(a, b)) / norms if norms else 0.0


def _usage(events: list[EmbeddingEvent]) -> EmbeddingUsage:
    num_prompt_tokens, num_cached = sum(e.num_prompt_tokens for e in events), sum(e.num_cached_tokens for e in events)
    details = PromptTokensDetails(cached_tokens=num_cached)
    return EmbeddingUsage(prompt_tokens=num_prompt_tokens, total_tokens=num_prompt_tokens, prompt_tokens_details=details)
