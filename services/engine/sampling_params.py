"""What a request asks of sampling, and what sampling reports back: plain records, free of torch,
so the gateway that builds them and the wire that carries them need no tensor library (the sampler
that reads them is sampling.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MAX_LOGPROB_TOKEN_IDS = 128  # ids a request may name for logprobs (vLLM's bound)
MAX_PENALTY = 2.0  # presence and frequency penalties lie in [-2, 2], as OpenAI and vLLM require
# Below this a temperature is greedy (argmax), as in vLLM: dividing logits by a denormal-sized
# temperature overflows to inf, and no race or softmax can draw from that.
GREEDY_TEMPERATURE_EPS = 1e-5


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """A sampled token's logprob and the most likely alternatives, most likely first; or, when
    the sampling names ``logprob_token_ids``, the sampled token and those ids, in that order."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class PromptTokenLogprobs:
    """A prompt token's logprob given the tokens before it, its rank in the vocabulary (1: the
    most likely) and the most likely alternatives, most likely first."""

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A constraint on the output's text (compiled in structured_output.py), named as vLLM
    names them: ``json`` (a JSON Schema), ``regex``, ``choice`` (one of a list of strings) and
    ``grammar`` (Lark, or GBNF)."""

    kind: Literal["json", "regex", "choice", "grammar"]
    spec: str  # the JSON Schema text, the regex, a JSON list of the choices, or the grammar text
    compact_whitespace: bool = False  # JSON only: no whitespace outside strings


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; k: the sampled token's logprob and the k most likely
    # None: none; k: each prompt token's logprob (from the second on) and the k most likely. The
    # prompt is then computed whole: a cached prefix's logits were never kept (as vLLM).
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1 disables
    min_p: float = 0.0  # 0 disables
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), ids unique
    allowed_token_ids: tuple[int, ...] | None = None  # None: any token; else only these are sampled
    # None: the logprobs' alternatives are the k most likely; else the sampled token and these
    # ids, whatever their rank (vLLM's logprob_token_ids). Needs ``logprobs``.
    logprob_token_ids: tuple[int, ...] | None = None
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not self.temperature >= 0:  # NaN too
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        # The most alternatives is the gateway's --max-logprobs; the vocabulary bounds them here
        # (services/engine/engine.py).
        for name in ("logprobs", "prompt_logprobs"):
            if (value := getattr(self, name)) is not None and value < 0:
                raise ValueError(f"{name} must be at least 0, got {value}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY:
                raise ValueError(f"{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {getattr(self, name)}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        if len({token for token, _ in self.logit_bias}) != len(self.logit_bias):
            raise ValueError("logit_bias names a token twice")
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise ValueError("allowed_token_ids is empty: no token could be sampled")
        self._check_logprob_token_ids()

    def _check_logprob_token_ids(self) -> None:
        ids = self.logprob_token_ids
        if ids is None:
            return
        if not 0 < len(ids) <= MAX_LOGPROB_TOKEN_IDS:
            raise ValueError(f"logprob_token_ids must name 1 to {MAX_LOGPROB_TOKEN_IDS} token ids, got {len(ids)}")
        if self.logprobs is None:
            raise ValueError("when using `logprob_token_ids`, `logprobs` must be set.")  # vLLM's words

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS

    @property
    def has_logits_processors(self) -> bool:
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.min_tokens
            or self.logit_bias
            or self.allowed_token_ids
        )

    @property
    def has_grammar(self) -> bool:
        return self.structured is not None

    @property
    def has_truncation(self) -> bool:
        """top-k, top-p or min-p: a sampled request whose candidates are cut before the draw."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @property
    def reads_logits(self) -> bool:
        """False for the model runner's own paths: the argmax of the raw logits (greedy), or a
        race over them (sampled at a temperature, with nothing cut: kernels/race.py), among the
        grammar's allowed tokens with one, and nothing reported."""
        truncated = not self.is_greedy and self.has_truncation
        return truncated or self.logprobs is not None or self.has_logits_processors
