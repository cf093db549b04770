"""One request's state in the pipeline: what it asks, its budgets, and how far it got, in one
record that every attempt and stage reads, instead of parameters threaded through each call.

A request lives across attempts (a failover re-routes it, a migration continues it on another
decode node); an ``Attempt`` is one route tried for it. What survives an attempt lives on the
``RequestRun``: the preprocessing (done once), the tokens already streamed (a migration continues
after them) and the cached-token count the client is told (that of the first prefill)."""

from __future__ import annotations

from dataclasses import dataclass, field

from protos.gen import pb
from services.engine.sampling_params import SamplingParams
from services.gateway.pipeline.failures import Attempts
from services.router.route import Route
from shared.types import LoraRef


@dataclass(slots=True)
class RequestRun:
    request_id: str
    prompt: pb.PromptInput
    sampling: SamplingParams
    cache_salt: str | None
    lora: LoraRef | None  # its LoRA adapter; None: the base model
    stream: bool
    deadline: float  # one budget for the whole request, every retry included
    attempts: Attempts  # the node-failure budget and the nodes this request avoids
    preprocess_address: str | None = None
    prep: pb.PreprocessResponse | None = None
    emitted: list[int] = field(default_factory=list)  # answer tokens already yielded
    cached_tokens: int | None = None  # set by the first decode call (stages.py)
    adapter_loads: set[str] = field(default_factory=set)  # nodes its LoRA adapter was loaded on for it
    embed: pb.EmbedSpec | None = None  # an embedding request: it ends at its prefill, no decode node
    # It reads every prompt row (prompt logprobs; an embedding of a CLS or MEAN checkpoint): no
    # cached prefix is worth anything to it, nor covers its images.
    computes_whole_prompt: bool = False

    @property
    def lora_id(self) -> str | None:
        """Its adapter's fingerprint, the "lora" key of its block hashes."""
        return None if self.lora is None else self.lora.fingerprint


@dataclass(frozen=True, slots=True)
class PixelTarget:
    role: str  # "encoder", or "prefill" for a prefill node encoding the images itself
    address: str
    key_prefix: str = ""  # data-plane keys are key_prefix + mm_hash; "" for an encoder


@dataclass(frozen=True, slots=True)
class Attempt:
    """One route tried for a request, after it was preprocessed."""

    run: RequestRun
    number: int
    route: Route
    preprocess_address: str
    prep: pb.PreprocessResponse

    @property
    def request_id(self) -> str:
        """The id nodes see: one per attempt, so a retry never meets its predecessor's state."""
        return f"{self.run.request_id}-{self.number}"

    def encoder_target(self) -> PixelTarget:
        return PixelTarget("encoder", self.route.encoder)

    def prefill_target(self) -> PixelTarget:
        return PixelTarget("prefill", self.route.prefill, key_prefix=f"px/{self.request_id}/")
