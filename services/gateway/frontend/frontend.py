"""The front door every API shares: built once per gateway, it owns the guards a request meets
before any node sees it, so the HTTP routes and gRPC Generate apply the same ones:
  * draining: a gateway that is draining takes no new request (503);
  * request limits: ``--max-logprobs`` and the model length (request_limits.py);
  * admission: choices in flight at this gateway (admission.py, 429);
  * the media budget: vision tokens in flight at the encoders (media_budget.py, 413 / 429);
  * the served model's defaults: its names, the checkpoint's sampling defaults, the default
    max_tokens, the family's tool parser.
A door converts its wire format to the pipeline's Generations, asks the Frontend for its limits
and its admission, and turns the events back into its wire format."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from services.gateway.errors import GatewayError
from services.gateway.frontend.admission import Admission, Ticket
from services.gateway.frontend.media_budget import MediaTicket
from services.gateway.frontend.openai_api import Generation
from services.gateway.frontend.request_limits import RequestLimits
from services.gateway.pipeline.token_events import TokenEvent
from services.gateway.state import GatewayState
from services.models.sampling_defaults import NO_DEFAULTS, SamplingDefaults


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What the API says of the model it serves and how it fills a request."""

    model_root: str | None = None  # what --model named (a built-in, a path): /v1/models' root
    tool_parser: str | None = None  # the family's tool-call parser (tool_calls.py), if it has one
    sampling_defaults: SamplingDefaults = NO_DEFAULTS  # the checkpoint's generation-config defaults


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
    def __init__(self, state: GatewayState, admission: Admission, model: ServedModel) -> None:
        self.state, self.admission, self.model = state, admission, model

    @property
    def served_names(self) -> tuple[str, ...]:
        return self.state.served_names

    @property
    def default_max_tokens(self) -> int:
        return self.state.default_max_tokens

    def check_open(self) -> None:
        if self.state.draining:
            raise GatewayError(503, "the gateway is draining; retry on another gateway")

    async def limits(self, *asked: object) -> RequestLimits:
        """The deployment's limits; the vocabulary's size (asked of a node once) when a request
        asks for the whole vocabulary (-1) or the cap is the vocabulary."""
        state = self.state
        vocab_size = None
        if state.max_logprobs == -1 or -1 in asked:
            vocab_size = (await state.pipeline.model_info()).vocab_size
        return RequestLimits(state.pipeline.max_model_len, state.max_logprobs, vocab_size)

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
