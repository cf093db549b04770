"""The gateway's API-facing configuration as one typed record: what the served model is called
and how it fills a request, the limits every door applies, and how the HTTP app is mounted.
Built once from the role's Settings (``from_settings``) and handed to create_app, which hands it
to the Frontend and the state; nothing threads its fields one by one."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.gateway.frontend.limits import DEFAULT_MAX_LOGPROBS
from services.gateway.frontend.media_budget import DEFAULT_RESERVE_FRACTION
from services.gateway.frontend.served_adapters import ServedAdapters
from services.gateway.settings import Settings
from services.models.sampling_defaults import NO_DEFAULTS, SamplingDefaults

MAX_BODY_BYTES = 64 * 1024 * 1024

# Where a runner does not serve an API, vLLM registers no route for it (404); the message is the
# one vLLM's handlers raise when they are missing.
UNSERVED = {
    "chat": "The model does not support Chat Completions API",
    "completions": "The model does not support Completions API",
    "generate": "The model does not support the Generate API",
    "embeddings": "The model does not support Embeddings API",
    "score": "The model does not support Score API",
}
POOLING_APIS = frozenset({"embeddings", "score"})


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What the API says of the model it serves and how it fills a request."""

    model_root: str | None = None  # what --model named (a built-in, a path): /v1/models' root
    tool_parser: str | None = None  # the family's tool-call parser (output/tool_calls.py), if it has one
    sampling_defaults: SamplingDefaults = NO_DEFAULTS  # the checkpoint's generation-config defaults


@dataclass(frozen=True, slots=True)
class FrontendConfig:
    served_names: tuple[str, ...]  # the names the API answers to; the first is the default
    default_max_tokens: int = 256
    model: ServedModel = field(default_factory=ServedModel)
    max_num_requests: int = 2048  # choices in flight (limits.py)
    max_logprobs: int = DEFAULT_MAX_LOGPROBS  # vLLM's --max-logprobs (limits.py); -1: the vocabulary
    max_media_tokens_per_encoder: int = 0  # the media budget (media_budget.py); 0: none
    media_reserve_fraction: float = DEFAULT_RESERVE_FRACTION  # of it, kept for small requests
    force_include_usage: bool = False  # every stream carries the usage on every chunk (vLLM's flag)
    vllm_metric_names: bool = False  # the vLLM-named families under vllm: too (metrics/metrics.py)
    root_path: str = ""  # vLLM's --root-path: the prefix a path-routing proxy serves the API under
    max_body_bytes: int = MAX_BODY_BYTES
    # The LoRA adapters served beside the base model (--lora-modules, and runtime loads): mutable,
    # shared by every door.
    adapters: ServedAdapters = field(default_factory=ServedAdapters)
    runner: str = "generate"  # settings.RUNNERS: what this gateway serves

    @property
    def serves_generation(self) -> bool:
        return self.runner != "pooling"

    @property
    def serves_embeddings(self) -> bool:
        return self.runner != "generate"

    @property
    def routed_roles(self) -> tuple[str, ...]:
        """The roles a request needs a node of: a pooling gateway needs no decode node."""
        return ("preprocess", "encoder", "prefill") if not self.serves_generation else ("preprocess", "encoder", "prefill", "decode")

    def __post_init__(self) -> None:
        if not self.served_names:
            raise ValueError("the gateway needs at least one served model name")

    @classmethod
    def from_settings(
        cls, settings: Settings, served_names: tuple[str, ...], model: ServedModel, adapters: ServedAdapters | None = None
    ) -> FrontendConfig:
        return cls(
            adapters=adapters or ServedAdapters(),
            served_names=served_names,
            default_max_tokens=settings.default_max_tokens,
            model=model,
            max_num_requests=settings.max_num_requests,
            max_logprobs=settings.max_logprobs,
            max_media_tokens_per_encoder=settings.max_media_tokens_per_encoder,
            media_reserve_fraction=settings.media_reserve_fraction,
            force_include_usage=settings.enable_force_include_usage,
            vllm_metric_names=settings.vllm_metric_names,
            root_path=settings.root_path,
            runner=settings.runner,
        )
