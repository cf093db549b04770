"""Decode step time with LoRA adapters in the batch: 16 streams decoding, (a) on an engine without
LoRA, (b) on an engine with LoRA on but every stream on the base model, (c) 4 adapters of rank 16
on 4 streams each. Adapters are made by peft on the model's language layers (q/k/v/o and the
MLP projections), random, as tests/peft_adapters.py makes them. One process, the same prompts
and the same number of steps for each; the median of the timed steps (the decode phase only).

    tessera bench --suite lora_step --model small
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.suites.common import RESULTS, command, machine, write_json

TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="small")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed per configuration")
    parser.add_argument("--out", type=Path, default=None, help="default results/lora_step.json")


def make_adapter(model_dir: Path, out: Path, seed: int, rank: int) -> Path:
    """A random PEFT adapter of ``rank`` on ``model_dir``'s language layers, saved to ``out``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32)
    torch.manual_seed(seed)
    get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, init_lora_weights=False)).save_pretrained(
        str(out)
    )
    return out


def _step_times(model: str, enable_lora: bool, adapter_dirs: list[Path], streams: int, steps: int) -> list[float]:
    """Seconds per decode step of ``streams`` requests, stream i on adapter i % len(adapter_dirs)."""
    from services.engine.config import EngineConfig
    from services.engine.llm import LLM
    from services.engine.sampling_params import SamplingParams
    from services.gateway.frontend.prompt_wire import prompt_for_library

    llm = LLM(model, EngineConfig(enable_lora=enable_lora, max_loras=max(1, len(adapter_dirs)), max_lora_rank=64))
    adapters = [llm.load_lora(f"adapter-{i}", path) for i, path in enumerate(adapter_dirs)]
    sampling = SamplingParams(max_tokens=steps + 8, ignore_eos=True)
    for i in range(streams):
        body = {"messages": [{"role": "user", "content": f"Stream {i}: tell me a long story about lighthouses and rivers."}]}
        lora = adapters[i % len(adapters)] if adapters else None
        llm.engine.add_request(f"s{i}", llm.preprocessor.preprocess(prompt_for_library(body)), sampling, lora=lora)
    engine, times = llm.engine, []
    while engine.has_unfinished() and len(times) < steps:
        decoding = all(r.num_computed_tokens >= r.num_prompt_tokens for r in engine.scheduler.running) and not engine.scheduler.waiting
        started = time.perf_counter()
        engine.step()
        if decoding and len(engine.scheduler.running) == streams:
            times.append(time.perf_counter() - started)
    return times


def run(args: argparse.Namespace) -> int:
    from services.models.registry import resolve_model

    model_dir = resolve_model(args.model).path
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [make_adapter(model_dir, Path(tmp) / f"a{i}", seed=i, rank=args.rank) for i in range(args.adapters)]
        configs = {
            "no LoRA": _step_times(args.model, False, [], args.streams, args.steps),
            "LoRA on, base rows": _step_times(args.model, True, [], args.streams, args.steps),
            f"{args.adapters} adapters": _step_times(args.model, True, dirs, args.streams, args.steps),
        }
    base = statistics.median(configs["no LoRA"])
    rows = []
    print(f"{'configuration':>20} {'step p50 (ms)':>14} {'ratio':>6} {'steps':>6}")
    for name, times in configs.items():
        median = statistics.median(times)
        rows.append({"configuration": name, "step_p50_ms": median * 1e3, "ratio_to_no_lora": median / base, "steps_timed": len(times)})
        print(f"{name:>20} {median * 1e3:>14.1f} {median / base:>6.2f} {len(times):>6}")
    out = args.out or RESULTS / "lora_step.json"
    write_json(
        out, {"command": command(args), "machine": machine(), "model": args.model, "streams": args.streams, "rank": args.rank, "rows": rows}
    )
    return 0
