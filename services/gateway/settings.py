"""``tessera serve --role gateway``'s settings, apart from the server: the CLI lists every role's
settings to build its flags, and must not import the HTTP stack (seconds per process) to do so."""

from __future__ import annotations

from dataclasses import dataclass

from services.models.sampling_defaults import GENERATION_CONFIG_MODES
from services.router.policies import make_policy
from services.router.scoring import EncodeDispatch
from services.transport.internal_auth import InternalPlaneSettings

# What a gateway serves (vLLM's --runner): "generate" (chat and completions), "pooling"
# (embeddings and score; no decode node is needed, and generation is refused with vLLM's error),
# or Tessera's "both" (one deployment serves both, sharing every cache).
RUNNERS = ("generate", "pooling", "both")


@dataclass(frozen=True, slots=True)
class Settings(InternalPlaneSettings):
    """Flags of ``tessera serve --role gateway``, each also ``TESSERA_SERVE_<NAME>``; the internal
    plane's (its secret and mTLS) authenticate the gateway's calls to the nodes."""

    model: str = "tiny"
    runner: str = "generate"  # RUNNERS
    # The names the API answers to, comma-separated; the first is the default and the metrics'
    # model_name. Empty: a built-in's own name, or the checkpoint's id.
    served_model_name: str = ""
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    http_backlog: int = 4096  # pending connections the kernel queues before refusing
    http_keep_alive_s: float = 30.0  # an idle client connection is closed after this
    # vLLM's --root-path: the path prefix a path-routing proxy serves the API under ("/llm"); the
    # routes answer with and without it.
    root_path: str = ""
    generate_address: str = "127.0.0.1:50051"
    # Where nodes are discovered (their records are the cluster), and the cache lookups' index.
    index_url: str = ""
    index_ttl_s: float = 5.0
    # Static node lists (comma-separated), for setups without an index.
    preprocess_address: str = ""
    encoder_address: str = ""
    prefill_address: str = ""
    decode_address: str = ""
    default_max_tokens: int = 256
    # Serve the metric families named as vLLM's under vllm: as well as tessera: (dashboards,
    # KEDA triggers and endpoint pickers that read vllm:num_requests_waiting, unchanged).
    vllm_metric_names: bool = False
    # vLLM's --enable-force-include-usage: every stream's chunks carry the usage so far, asked
    # for or not (as stream_options.continuous_usage_stats).
    enable_force_include_usage: bool = False
    # vLLM's --max-logprobs: the most alternatives a request may ask per token (output and prompt
    # tokens alike); -1: the vocabulary, so a request's -1 (all of it) is served.
    max_logprobs: int = 20
    # Sampling defaults for the fields a request leaves unset: "auto", the checkpoint's
    # generation_config.json (as vLLM's --generation-config auto), or "vllm", none.
    generation_config: str = "auto"
    routing_policy: str = "cache_aware"
    # Where images the chosen encoder lacks are encoded: "adaptive" (on a prefill node with its
    # own vision tower when the encoder tier's queue would cost more; services/router/scoring.py),
    # "encoder" (always the encoder tier) or "prefill" (the prefill node whenever it can encode).
    encode_dispatch: str = "adaptive"
    cache_lookups: bool = True  # off: the index serves membership only (a no-reuse baseline)
    request_timeout_s: float = 300.0
    max_node_failures: int = 4  # per request, before it fails with 503
    max_num_requests: int = 2048  # choices in flight at this gateway; past it, 429 with Retry-After
    # Vision tokens in flight per live encoder, priced from image headers before anything is
    # decoded (services/gateway/frontend/media_budget.py): past it 429, a request over all of it 413; 0: off.
    max_media_tokens_per_encoder: int = 262144
    # Of that budget, the share kept for small requests (those costing at most a quarter of it),
    # so large ones sent back to back never starve them (media_budget.py); 0: none kept.
    media_reserve_fraction: float = 0.25
    # API keys for the HTTP and Generate APIs (services/gateway/frontend/tenants.py); neither: no auth.
    api_key: str = ""  # one key, tenant "default"
    api_keys_file: str = ""  # JSON: key -> tenant name, or -> {"tenant": NAME, "shared_cache": BOOL}
    drain_timeout_s: float = 30.0  # on SIGTERM: time open streams get to finish

    def __post_init__(self) -> None:
        InternalPlaneSettings.__post_init__(self)
        if self.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {', '.join(RUNNERS)}, got {self.runner!r}")
        static = (self.preprocess_address, self.encoder_address, self.prefill_address)
        if not self.index_url and not all((*static, self.decode_address if self.runner != "pooling" else "-")):
            raise ValueError(
                "the gateway needs --index-url (nodes are discovered there), or all of --preprocess-address, "
                "--encoder-address, --prefill-address and (unless --runner pooling) --decode-address (comma-separated lists)"
            )
        if self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be -1 (the vocabulary) or at least 0, got {self.max_logprobs}")
        if self.root_path and (not self.root_path.startswith("/") or self.root_path.endswith("/")):
            raise ValueError(f"root_path must start with '/' and not end with one (as '/llm'), got {self.root_path!r}")
        if not 0 <= self.media_reserve_fraction < 1:
            raise ValueError(f"media_reserve_fraction must be at least 0 and below 1, got {self.media_reserve_fraction}")
        if self.generation_config not in GENERATION_CONFIG_MODES:
            raise ValueError(f"generation_config must be one of {', '.join(GENERATION_CONFIG_MODES)}, got {self.generation_config!r}")
        make_policy(self.routing_policy)  # raises for an unknown name, naming the known ones
        EncodeDispatch(self.encode_dispatch)  # likewise
        non_negative = (self.max_node_failures, self.drain_timeout_s, self.max_media_tokens_per_encoder)
        if self.index_ttl_s <= 0 or min(non_negative) < 0 or self.max_num_requests < 1:
            raise ValueError(
                "index_ttl_s must be positive, max_node_failures, drain_timeout_s and max_media_tokens_per_encoder >= 0, "
                "max_num_requests >= 1"
            )
