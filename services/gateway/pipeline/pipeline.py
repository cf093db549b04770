"""The request path across roles, as coroutines over grpc.aio stubs, with failover and migration.

One attempt (each call in stages.py): preprocess (skipping the image processor for images a live
encoder holds) -> route (one index lookup) -> pixels of the images the chosen encoder lacks, to
that encoder or, when the router chose so, to the prefill node that encodes them itself ->
prefill on the chosen node (it pulls missing embeddings from the chosen encoder, and prefix KV
from the peer the route names when that beats recomputing) -> decode, streaming token events
(an embedding, ``embed``, ends at its prefill: no decode node is routed to).

Failover, in this one place (servicers never retry): a call that fails because a node did
(UNAVAILABLE, a deadline, a draining node's refusal, or a prefill naming the encoder that failed
it) is a NodeFailure. The node is excluded for this request and quarantined in the membership
for everyone, and the attempt starts again from routing; a preprocess failure picks another
preprocess node. A decode node lost mid-stream is a *migration*: the next attempt prefills the
prompt plus the tokens already streamed (their prompt blocks are prefix-cache hits) and the new
decode node continues after them, so the client sees one stream with no repeated token.
A node that refuses a call as busy (at its limit of requests) is skipped for this request only,
not quarantined; when every node of a role is busy the request gets a 429 with Retry-After.
When every node of a role has failed the request, those that failed before the last one are
tried again (``Attempts.readmit``). A request gives up with a 503 when a role has no live node
left, or after ``max_failures`` node failures. Errors about the request itself (4xx) are never
retried. A request has one deadline (``timeout_s`` from its arrival, retries included): every
call gets what is left of it as its gRPC deadline, which the called node sees too, and a request
out of time ends with a 504.
Cancelling the task that runs a request (its client left) cancels the call it awaits, on the node
too, and nothing is retried.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

from opentelemetry import trace

from protos.gen import pb
from services.engine.config import EngineConfig
from services.engine.sampling_params import SamplingParams
from services.gateway.errors import GatewayError
from services.gateway.frontend.limits import check_context_length, check_input_length
from services.gateway.pipeline.adapter_loads import AdapterLoads
from services.gateway.pipeline.call_watchdog import CallWatchdog
from services.gateway.pipeline.failures import AdapterMissing, Attempts, NodeFailure, NodeOverloaded
from services.gateway.pipeline.request_run import Attempt, RequestRun
from services.gateway.pipeline.stages import Stages
from services.gateway.pipeline.token_events import EmbeddingEvent, TokenEvent
from services.router.route import NoLiveNodeError, Route
from services.router.route_attributes import route_attributes
from services.router.router import Router
from services.transport.internal_auth import InternalAuth
from services.transport.internal_channel import ROLE_TO_STUB, SERVICE_TO_STUB, internal_channel
from shared.tracing import outgoing_metadata, tracer
from shared.types import BlockHash, LoraRef, MmHash, PlaceholderRange

# The context limit when no node has said the model's (check_context_length: frontend/limits.py).
DEFAULT_MAX_MODEL_LEN = EngineConfig().max_model_len
EMBED_SAMPLING = SamplingParams(max_tokens=1)  # an embedding samples nothing; the prefill node pools instead


class Pipeline:
    def __init__(
        self,
        router: Router,
        *,
        timeout_s: float = 300.0,
        connect_timeout_s: float = 5.0,
        max_failures: int = 4,
        clock: Callable[[], float] = time.monotonic,
        auth: InternalAuth | None = None,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    ) -> None:
        self.router = router
        self.max_model_len = max_model_len
        self.auth = auth or InternalAuth()  # the internal plane's credentials, on every call to a node
        self.clock = clock
        self.membership = router.membership
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_failures = max_failures
        self._stubs: dict[tuple[str, str], object] = {}
        self._turns = itertools.count()
        self.watchdog = CallWatchdog(self.membership)
        self.num_retries = 0
        self.num_migrations = 0
        self.num_busy_refusals = 0  # calls a busy node refused (tried elsewhere, or a 429)
        self.adapter_loads = AdapterLoads()  # a request's LoRA adapter, on a node that lacked it
        self._model_info: pb.ModelInfoResponse | None = None  # model_info(), once asked
        self.route_observers: list[Callable[[Route], None]] = []  # e.g. the routing-latency histogram
        self.stages = Stages(router, self.stub, self.watchdog, clock, connect_timeout_s=connect_timeout_s)

    def stub(self, role: str, address: str):
        key = (role, address)
        if key not in self._stubs:
            self._stubs[key] = {**ROLE_TO_STUB, **SERVICE_TO_STUB}[role](internal_channel(address, self.auth))
        return self._stubs[key]

    async def stats(self) -> list[tuple[str, str, pb.StatsResponse]]:
        """Every live node's Stats, asked of all at once; a node that does not answer is left out."""
        nodes = [(s.info.role, s.info.grpc_address) for s in self.membership.snapshot().values() if s.info.role in ROLE_TO_STUB]
        answers = await asyncio.gather(
            *(self.stub(role, address).Stats(pb.StatsRequest(), timeout=self.connect_timeout_s) for role, address in nodes),
            return_exceptions=True,
        )
        return [(role, address, answer) for (role, address), answer in zip(nodes, answers) if isinstance(answer, pb.StatsResponse)]

    async def tower_seconds_per_token(self) -> float | None:
        """The live encoders' vision-tower seconds per token, as each measured once started
        (services/encoder/calibration.py): the slowest's, None while none reports one."""
        encoders = [n.info.grpc_address for n in self.membership.nodes("encoder")]
        calls = (
            self.stub("encoder", a).Stats(pb.StatsRequest(), timeout=self.connect_timeout_s, metadata=outgoing_metadata()) for a in encoders
        )
        answers = await asyncio.gather(*calls, return_exceptions=True)
        rates = [a.gauges.get("encoder_tower_seconds_per_token", 0.0) for a in answers if isinstance(a, pb.StatsResponse)]
        return max((r for r in rates if r > 0), default=None)

    async def run(
        self,
        prompt: pb.PromptInput,
        sampling: SamplingParams,
        *,
        cache_salt: str | None = None,
        request_id: str | None = None,
        stream: bool = True,
        fit_max_tokens: bool = False,
        lora: LoraRef | None = None,
    ) -> AsyncIterator[TokenEvent]:
        """Token events: one per token when ``stream``, else just the first and the last of each
        decode node (the last carries every token since that node's first). Cancelling the task
        that runs it (the client went away) cancels the call in flight on its node, and nothing
        is retried. ``fit_max_tokens`` (the client gave no max_tokens): the default shrinks to
        the context the prompt leaves, as vLLM does. Iterate it from one task only
        (services/gateway/pipeline/choices.py), as its trace span is that task's current span."""
        request_id = request_id or f"chatcmpl-{uuid.uuid4().hex}"
        # One trace per request: every downstream call carries this span's context.
        with tracer().start_as_current_span("gateway.generate", attributes={"tessera.request_id": request_id}):
            deadline = self.clock() + self.timeout_s
            run = RequestRun(request_id, prompt, sampling, cache_salt, lora, stream, deadline, Attempts(self.max_failures))
            async for event in self._run(run, fit_max_tokens):
                yield event

    async def embed(
        self, prompt: pb.PromptInput, *, dimensions: int | None = None, cache_salt: str | None = None, request_id: str | None = None
    ) -> EmbeddingEvent:
        """One embedding: preprocessed and routed as a generation (every cache alike, no decode
        node), a prefill that pools its prompt, failing over as a generation does."""
        request_id = request_id or f"embd-{uuid.uuid4().hex}"
        with tracer().start_as_current_span("gateway.embed", attributes={"tessera.request_id": request_id}):
            deadline, spec = self.clock() + self.timeout_s, pb.EmbedSpec(dimensions=dimensions)
            run = RequestRun(request_id, prompt, EMBED_SAMPLING, cache_salt, None, False, deadline, Attempts(self.max_failures), embed=spec)
            run.computes_whole_prompt = (await self.model_info()).pools_every_prompt_row
            async for response in self._run(run, fit_max_tokens=False):
                return response
        raise AssertionError("unreachable")

    async def _run(self, run: RequestRun, fit_max_tokens: bool) -> AsyncIterator[TokenEvent | EmbeddingEvent]:
        """Token events; an embedding's one event is its prefill's pooled vector."""
        for number in itertools.count():
            try:
                attempt, lacking = await self._next_attempt(run, number, fit_max_tokens)
                assert attempt.route.reservation is not None  # routed with reserve=True, released here
                with attempt.route.reservation:
                    if lacking:
                        await self.stages.push_images(attempt, lacking)
                    prefill = await self.stages.prefill(attempt)
                if run.embed is not None:  # it ends here
                    if not prefill.embedding:  # a node of an older release, which ignored PrefillRequest.embed
                        raise NodeFailure("prefill", attempt.route.prefill, "it answered no embedding")
                    yield EmbeddingEvent(list(prefill.embedding), len(attempt.prep.prompt_token_ids), prefill.num_cached_tokens)
                    return
                cached, pulled = prefill.num_cached_tokens, prefill.num_pulled_tokens
                trace.get_current_span().set_attributes({"tessera.prefill.cached_tokens": cached, "tessera.prefill.pulled_tokens": pulled})
                with self.membership.in_flight(attempt.route.decode):
                    async for event in self.stages.decode(attempt, prefill):
                        run.emitted.extend(event.token_ids)
                        yield event
                        if event.finished:
                            return
                raise NodeFailure("decode", attempt.route.decode, "the stream ended early")
            except (NodeFailure, NodeOverloaded) as failure:
                if isinstance(failure, AdapterMissing) and await self.adapter_loads.load(run, failure.address):
                    continue  # loaded there: the next attempt may use that node again
                if isinstance(failure, NodeFailure):
                    self._record_failure(failure, run.attempts, run.deadline, migrating=bool(run.emitted))
                else:  # busy, not broken: another node of the role, without quarantining this one
                    trace.get_current_span().add_event("node_busy", {"tessera.role": failure.role, "tessera.node": failure.address})
                    run.attempts.record_busy(failure)
                    self.num_busy_refusals += 1
                if failure.role == "preprocess":
                    run.preprocess_address = None
            except NoLiveNodeError as exc:
                if not run.attempts.readmit(exc.role):
                    raise run.attempts.no_node_left(exc) from None
        raise AssertionError("unreachable")

    async def _next_attempt(self, run: RequestRun, number: int, fit_max_tokens: bool) -> tuple[Attempt, list[MmHash]]:
        """Preprocess the request once (on a new node if its node failed before answering), then
        route it: the attempt, and the images whose pixels must be pushed."""
        if run.preprocess_address is None:
            run.preprocess_address = self._pick_preprocess(run.attempts.excluded)
        if run.prep is None:
            run.prep = await self.stages.preprocess(
                run.preprocess_address, run.prompt, cache_salt=run.cache_salt, lora=run.lora, deadline=run.deadline
            )
            num_prompt_tokens = len(run.prep.prompt_token_ids)
            room = self.max_model_len - num_prompt_tokens
            if fit_max_tokens and max(1, run.sampling.min_tokens) <= room < run.sampling.max_tokens:
                run.sampling = replace(run.sampling, max_tokens=room)
            param = "messages" if run.prompt.WhichOneof("prompt") == "chat" else "prompt"
            if run.embed is not None:
                check_input_length(num_prompt_tokens, self.max_model_len)
            else:
                check_context_length(num_prompt_tokens, run.sampling.max_tokens, self.max_model_len, param=param)
        reuse_prefix = run.sampling.prompt_logprobs is None and not run.computes_whole_prompt
        route, lacking = await self._route(run, number, reuse_prefix)
        return Attempt(run, number, route, run.preprocess_address, run.prep), lacking

    async def tokenize(self, prompt: pb.PromptInput) -> pb.PreprocessResponse:
        """/tokenize: preprocessing alone (chat template, image expansion), nothing routed."""
        return await self._on_preprocess(lambda address, deadline: self.stages.preprocess(address, prompt, deadline=deadline))

    async def detokenize(self, token_ids: list[int]) -> str:
        return (await self._ask_preprocess("Detokenize", pb.DetokenizeRequest(token_ids=token_ids))).text

    async def media_cost_json(self) -> str:
        """How the model's processor prices an image by its size (services/models/media_cost.py)."""
        return (await self._ask_preprocess("MediaCost", pb.MediaCostRequest())).cost_model_json

    async def model_info(self) -> pb.ModelInfoResponse:
        """The served model's stop ids and vocabulary size, asked of a preprocess node once: they
        are the checkpoint's, the same on every node."""
        if self._model_info is None:
            self._model_info = await self._ask_preprocess("ModelInfo", pb.ModelInfoRequest())
        return self._model_info

    async def _ask_preprocess(self, method: str, request):
        """One unary call of the Preprocess service's ``method``, failing over as a request does."""

        async def call(address: str, deadline: float):
            return await self.stages.call("preprocess", address, getattr(self.stub("preprocess", address), method), request, deadline)

        return await self._on_preprocess(call)

    async def _on_preprocess(self, call: Callable[[str, float], Awaitable]):
        """``call(address, deadline)`` on a preprocess node, failing over as a request does."""
        attempts = Attempts(self.max_failures)
        deadline = self.clock() + self.timeout_s
        while True:
            try:
                return await call(self._pick_preprocess(attempts.excluded), deadline)
            except NodeFailure as failure:
                self._record_failure(failure, attempts, deadline, migrating=False)
            except NodeOverloaded as busy:
                attempts.record_busy(busy)
            except NoLiveNodeError as exc:
                raise attempts.no_node_left(exc) from None

    def _record_failure(self, failure: NodeFailure, attempts: Attempts, deadline: float, *, migrating: bool) -> None:
        """Count a node failure against the request (raising once it is out of retries or of
        time) and quarantine the node for everyone."""
        if self.clock() >= deadline:  # out of time: not the node's fault, and no retry can help
            raise GatewayError(504, f"the request did not finish within its {self.timeout_s:g}s deadline", code="deadline_exceeded")
        trace.get_current_span().add_event(
            "node_failure", {"tessera.role": failure.role, "tessera.node": failure.address, "tessera.migrated": migrating}
        )
        attempts.record(failure)
        self.membership.report_failure(failure.address)
        self.num_retries += 1
        if failure.role == "decode" and migrating:
            self.num_migrations += 1

    def _pick_preprocess(self, excluded: set[str]) -> str:
        nodes = self.membership.nodes("preprocess", exclude=frozenset(excluded))
        if not nodes:
            raise NoLiveNodeError("preprocess")
        return nodes[next(self._turns) % len(nodes)].info.grpc_address

    async def _route(self, run: RequestRun, attempt: int, reuse_prefix: bool) -> tuple[Route, list[MmHash]]:
        """The route, and the request's images no node it names holds (their pixels must be
        pushed). ``reuse_prefix``: whether the request can use a cached prefix at all."""
        prep, excluded = run.prep, run.attempts.excluded
        images = [(MmHash(i.mm_hash), PlaceholderRange(i.offset, i.length)) for i in prep.mm_items]
        hashes = [BlockHash(h) for h in prep.block_hashes] if self.router.index is not None else None
        with tracer().start_as_current_span("gateway.route", attributes={"tessera.attempt": attempt}) as span:
            prompt_ids, exclude = list(prep.prompt_token_ids), frozenset(excluded)
            tower = run.lora is not None and run.lora.tower
            options = {"reserve": True, "reuse_prefix": reuse_prefix, "lora_id": run.lora_id, "lora_tower": tower}
            route = await self.router.route(prompt_ids, images, run.cache_salt, hashes, exclude, decode=run.embed is None, **options)
            num_prompt_tokens = len(prep.prompt_token_ids)
            span.set_attributes(
                route_attributes(route, policy=self.router.policy.name, num_images=len(images), num_prompt_tokens=num_prompt_tokens)
            )
        for observe in self.route_observers:
            observe(route)
        held = route.images_on_encoder | route.images_on_prefill | route.image_to_source.keys() | route.images_covered
        return route, [h for h, _ in images if h not in held]
