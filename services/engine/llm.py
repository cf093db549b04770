"""A small Python API over preprocessing and the engine.

llm = LLM("tiny")
[result] = llm.generate([prompt], SamplingParams(max_tokens=32))   # prompt: a Prompt
(services/preprocess/prompt.py; from an OpenAI-shaped body: prompt_from_wire(prompt_from_body(body)),
services/gateway/frontend/prompt_wire.py and services/preprocess/prompt_wire.py)
result.text, result.token_ids, result.usage
[embedded] = llm.embed([prompt])   # the checkpoint's pooling (services/models/pooling.py)
embedded.embedding, embedded.usage

With LoRA (EngineConfig(enable_lora=True, max_loras=N)): adapter = llm.load_lora("name", path), then
llm.generate(prompts, sampling, lora=adapter) (or one adapter or None per prompt).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from services.engine.config import EngineConfig
from services.engine.engine import Engine
from services.engine.sampling_params import SamplingParams
from services.models.lora.adapter import LoraAdapter, read_adapter
from services.models.registry import resolve_model
from services.preprocess.config import PreprocessConfig
from services.preprocess.preprocessor import Preprocessor
from services.preprocess.prompt import Prompt


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class GenerationResult:
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    request_id: str
    embedding: list[float]
    usage: Usage  # completion_tokens 0: an embedding generates nothing


class LLM:
    def __init__(
        self, model: str = "tiny", engine_config: EngineConfig | None = None, preprocess_config: PreprocessConfig | None = None
    ) -> None:
        self.model = resolve_model(model)
        self.preprocessor = Preprocessor(self.model, preprocess_config)
        self.engine = Engine(self.model, engine_config, tokenizer=self.preprocessor.tokenizer)
        self._ids = itertools.count()

    def load_lora(self, name: str, path: str | Path) -> LoraAdapter:
        """A PEFT adapter directory read for this model (services/models/lora/adapter.py)."""
        adapter = read_adapter(name, Path(path), self.model.family.weight_group, max_rank=self.engine.config.max_lora_rank)
        runner = self.engine.runner
        for bank in (runner.text_loras, runner.tower_loras):
            if bank is not None:
                bank.check(adapter)
        return adapter

    def generate(
        self,
        prompts: list[Prompt],
        sampling: SamplingParams | list[SamplingParams] | None = None,
        *,
        cache_salt: str | None = None,
        lora: LoraAdapter | list[LoraAdapter | None] | None = None,
    ) -> list[GenerationResult]:
        """Run every request to completion, batched together; results in input order."""
        params = sampling if isinstance(sampling, list) else [sampling or SamplingParams()] * len(prompts)
        adapters = lora if isinstance(lora, list) else [lora] * len(prompts)
        if len(params) != len(prompts) or len(adapters) != len(prompts):
            raise ValueError("one SamplingParams (and LoRA adapter) per request, or a single one for all")
        order = []
        for prompt, p, adapter in zip(prompts, params, adapters):
            request_id = f"req-{next(self._ids)}"
            prepared = self.preprocessor.preprocess(prompt, lora=adapter.ref if adapter is not None else None)
            self.engine.add_request(request_id, prepared, p, cache_salt=cache_salt, lora=adapter)
            order.append(request_id)
        finals = {}
        for output in self.engine.run_to_completion():
            if output.finished:
                finals[output.request_id] = output
        for _, error in self.engine.take_failures():
            raise error  # the others ran to completion; this call reports the failure
        return [
            GenerationResult(
                request_id=rid,
                text=finals[rid].text,
                token_ids=finals[rid].output_token_ids,
                finish_reason=finals[rid].finish_reason or "",
                usage=Usage(finals[rid].num_prompt_tokens, len(finals[rid].output_token_ids), finals[rid].num_cached_tokens),
            )
            for rid in order
        ]

    def embed(
        self,
        prompts: list[Prompt],
        *,
        dimensions: int | None = None,
        cache_salt: str | None = None,
        lora: LoraAdapter | None = None,
    ) -> list[EmbeddingResult]:
        """Each prompt's embedding (a prefill that pools instead of sampling), batched together;
        results in input order."""
        task = self.engine.pooling_task(dimensions)
        order = []
        for prompt in prompts:
            request_id = f"embd-{next(self._ids)}"
            prepared = self.preprocessor.preprocess(prompt, lora=lora.ref if lora is not None else None)
            self.engine.add_request(request_id, prepared, SamplingParams(max_tokens=1), cache_salt=cache_salt, lora=lora, pooling=task)
            order.append(request_id)
        finals = {o.request_id: o for o in self.engine.run_to_completion() if o.finished}
        for _, error in self.engine.take_failures():
            raise error
        return [
            EmbeddingResult(rid, finals[rid].embedding or [], Usage(finals[rid].num_prompt_tokens, 0, finals[rid].num_cached_tokens))
            for rid in order
        ]
