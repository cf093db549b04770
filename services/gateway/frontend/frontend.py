"""The front door every API shares: built once per gateway, it owns the guards a request meets
before any node sees it and the rules that turn it into pipeline runs, so the HTTP routes and
gRPC Generate apply the same ones:
  * draining: a gateway that is draining takes no new request (503);
  * request limits: ``--max-logprobs`` and the model length (limits.py);
  * admission: choices in flight at this gateway (limits.py, 429);
  * the media budget: vision tokens in flight at the encoders (media_budget.py, 413 / 429);
  * the served model's names and defaults: the checkpoint's sampling defaults, the default
    max_tokens, the family's tool parser (config.py), applied by openai_api.py's conversions;
  * tenant scoping of cache salts and media uuids (tenants.py, in the same conversions).
  * the runner: which APIs this gateway serves (``check_serves``: generation, embeddings or both).
A door converts its wire format to a request here and the events back to its wire format."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from protos.gen import pb
from services.gateway.errors import GatewayError
from services.gateway.frontend.batch_chat import to_batch_chat_request
from services.gateway.frontend.config import POOLING_APIS, UNSERVED, FrontendConfig, ServedModel
from services.gateway.frontend.limits import Admission, RequestLimits, Ticket
from services.gateway.frontend.media_budget import MediaTicket
from services.gateway.frontend.openai_api import ApiRequest, Generation, to_chat_request, to_completion_request
from services.gateway.frontend.tenants import Tenant
from services.gateway.generate.typed import typed_generations
from services.gateway.pipeline.token_events import TokenEvent
from services.gateway.protocol.batch_chat import BatchChatCompletionRequest
from services.gateway.protocol.chat import ChatCompletionRequest
from services.gateway.protocol.completion import CompletionRequest
from services.gateway.state import GatewayState


@dataclass(slots=True)
class Admitted:
    """A request's admission (released when its work ends) and its media's share of the budget
    (released at its first token: its images are encoded by then). Both release once."""

    ticket: Ticket
    media: MediaTicket

    def first_token(self) -> None:
        self.media.release()

    def release(self) -> None:
        self.media.release()
        self.ticket.release()


class Frontend:
    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.admission = Admission(state.config.max_num_requests)

    @property
    def config(self) -> FrontendConfig:
        return self.state.config

    @property
    def model(self) -> ServedModel:
        return self.state.config.model

    def check_serves(self, api: str) -> None:
        """Refuse an API (a config.UNSERVED key) this gateway's runner does not serve: 404, as
        vLLM, which registers no route for it, with the message of vLLM's missing handler."""
        runner = self.config.runner
        if runner != "both" and (api in POOLING_APIS) != (runner == "pooling"):
            raise GatewayError(404, UNSERVED[api], error_type="NotFoundError", code="not_found")

    def check_open(self) -> None:
        if self.state.draining:
            raise GatewayError(503, "the gateway is draining; retry on another gateway")

    async def limits(self, *asked: object) -> RequestLimits:
        """The deployment's limits; the vocabulary's size (asked of a node once) when a request
        asks for the whole vocabulary (-1) or the cap is the vocabulary."""
        pipeline, max_logprobs = self.state.pipeline, self.config.max_logprobs
        vocab_size = None
        if max_logprobs == -1 or -1 in asked:
            vocab_size = (await pipeline.model_info()).vocab_size
        return RequestLimits(pipeline.max_model_len, max_logprobs, vocab_size)

    async def chat(self, request: ChatCompletionRequest, tenant: Tenant | None) -> ApiRequest:
        config = self.config
        return to_chat_request(
            request,
            served_names=config.served_names,
            default_max_tokens=config.default_max_tokens,
            tenant=tenant,
            tool_parser=config.model.tool_parser,
            sampling_defaults=config.model.sampling_defaults,
            limits=await self.limits(request.top_logprobs, request.prompt_logprobs),
            adapters=config.adapters,
        )

    async def completion(self, request: CompletionRequest, tenant: Tenant | None) -> ApiRequest:
        return to_completion_request(
            request,
            served_names=self.config.served_names,
            tenant=tenant,
            sampling_defaults=self.config.model.sampling_defaults,
            limits=await self.limits(request.logprobs, request.prompt_logprobs),
            adapters=self.config.adapters,
        )

    async def batch_chat(self, batch: BatchChatCompletionRequest, tenant: Tenant | None) -> tuple[ApiRequest, list[str], list[str]]:
        """vLLM's batch of conversations as one request (batch_chat.py): the request, each
        conversation's echo, and the fields no conversation's model knows."""
        config, shared = self.config, batch.model_extra or {}
        return to_batch_chat_request(
            batch,
            served_names=config.served_names,
            default_max_tokens=config.default_max_tokens,
            tenant=tenant,
            sampling_defaults=config.model.sampling_defaults,
            limits=await self.limits(shared.get("top_logprobs"), shared.get("prompt_logprobs")),
            adapters=config.adapters,
        )

    async def typed(self, request: pb.GenerateRequest, tenant: Tenant | None) -> tuple[str, tuple[Generation, ...]]:
        """gRPC Generate's typed request (generate/typed.py): its request id and choices."""
        sampling, config = request.sampling, self.config
        limits = await self.limits(*(getattr(sampling, name) for name in ("logprobs", "prompt_logprobs") if sampling.HasField(name)))
        return typed_generations(
            request,
            served_names=config.served_names,
            default_max_tokens=config.default_max_tokens,
            tenant=tenant,
            limits=limits,
            adapters=config.adapters,
        )

    async def admit(self, generations: tuple[Generation, ...]) -> Admitted:
        """Admit the request's choices, then price and admit its media; a refusal of either
        leaves nothing held."""
        self.check_open()
        ticket = self.admission.admit(len(generations))
        prompts = list({g.prompt_index: g.prompt for g in generations}.values())
        try:
            return Admitted(ticket, await self.state.media.admit(prompts))
        except BaseException:
            ticket.release()
            raise

    def events(self, generation: Generation, *, stream: bool, request_id: str | None = None) -> AsyncIterator[TokenEvent]:
        """One choice's token events, counted in flight; closing the iterator cancels its work."""
        return self.state.events(generation, stream=stream, request_id=request_id)

    async def tokenize(self, prompt: pb.PromptInput) -> list[int]:
        return list((await self.state.pipeline.tokenize(prompt)).prompt_token_ids)
