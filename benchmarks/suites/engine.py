"""Engine benchmark against transformers ``generate`` (greedy, float32, same requests).

Measures, in one process and one run:
  * TTFT, cold: request in -> first token (preprocessing included on both sides);
  * decode tokens/s at batch 1, and at batch 8 (8 distinct requests in flight together);
    transformers runs the same 8 requests one at a time;
  * TTFT of a repeated request (processor, encoder and prefix caches hit) against cold.
Prints a table and writes JSON (default benchmarks/results/engine.json).

    tessera bench --suite engine --model small

The transformers side is the tests' reference oracle (tests/oracle.py) and the requests are the
tests' images: this suite runs from a repository checkout.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from benchmarks.suites.common import RESULTS, command, image_size, machine, write_json
from services.engine.config import EngineConfig
from services.engine.llm import LLM
from services.engine.sampling_params import SamplingParams
from services.preprocess.prompt import Prompt

if TYPE_CHECKING:
    from tests.oracle import ReferenceOracle


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="small")
    parser.add_argument("--image-size", default="448x448")
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "engine.json")


def run(args: argparse.Namespace) -> int:
    torch.set_grad_enabled(False)
    rows = measure(args)
    print_table(args, rows)
    result = {
        "benchmark": "engine",
        "command": command(args),
        "model": args.model,
        "image_size": args.image_size,
        "decode_tokens": args.decode_tokens,
        "machine": machine(torch_threads=torch.get_num_threads()),
        "results": rows,
    }
    write_json(args.out, result)
    return 0


def _cases(seed: int, n: int, size: tuple[int, int]):
    from tests.factories import chat_case, encode_image, make_image  # the oracle's requests: a checkout's tests/

    questions = ["What is in this image?", "Describe the colours.", "Count the shapes.", "What style is it?"]
    return [chat_case(encode_image(make_image(*size, seed=seed + i)), questions[i % 4]) for i in range(n)]


def _engine_ttft(llm: LLM, prompt: Prompt) -> float:
    started = time.perf_counter()
    request_id = f"ttft-{time.perf_counter_ns()}"
    llm.engine.add_request(request_id, llm.preprocessor.preprocess(prompt), SamplingParams(max_tokens=1, ignore_eos=True))
    while llm.engine.has_unfinished():
        llm.engine.step()
    return time.perf_counter() - started


def _engine_decode(llm: LLM, prompts: list[Prompt], num_tokens: int) -> tuple[float, float]:
    """(TTFT of the batch, decode tokens/s after every request has its first token)."""
    params = SamplingParams(max_tokens=num_tokens, ignore_eos=True)
    started = time.perf_counter()
    for i, prompt in enumerate(prompts):
        llm.engine.add_request(f"dec-{time.perf_counter_ns()}-{i}", llm.preprocessor.preprocess(prompt), params)
    first_token_at = None
    decoded = 0
    while llm.engine.has_unfinished():
        outputs = llm.engine.step()
        if first_token_at is None and outputs and all(len(o.output_token_ids) >= 1 for o in outputs) and len(outputs) == len(prompts):
            first_token_at = time.perf_counter()
            continue
        if first_token_at is not None:
            decoded += sum(len(o.new_token_ids) for o in outputs)
    end = time.perf_counter()
    return first_token_at - started, decoded / (end - first_token_at)


def _hf_run(oracle: ReferenceOracle, case, num_tokens: int) -> float:
    started = time.perf_counter()
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    oracle.generate(inputs, num_tokens)
    return time.perf_counter() - started


def _hf_decode_rate(oracle: ReferenceOracle, size: tuple[int, int], num_tokens: int) -> float:
    """transformers, one request at a time: decode rate = (N-1) tokens / (time(N) - time(1)), median."""
    hf_rates = []
    for case in _cases(500, 3, size):
        t1 = _hf_run(oracle, case, 1)
        tn = _hf_run(oracle, case, num_tokens)
        hf_rates.append((num_tokens - 1) / (tn - t1))
    return statistics.median(hf_rates)


def measure(args) -> dict:
    """Every figure of the table, tessera against transformers, after one warm-up request each."""
    from tests.oracle import ReferenceOracle

    size = image_size(args.image_size)
    llm = LLM(args.model, EngineConfig())
    oracle = ReferenceOracle(llm.model.path)
    warm = _cases(9000, 1, size)[0]
    _engine_ttft(llm, warm.prompt)
    _hf_run(oracle, warm, 2)

    cold_cases = _cases(100, args.repeats, size)
    ttft_cold = [_engine_ttft(llm, c.prompt) for c in cold_cases]
    ttft_cached = [_engine_ttft(llm, c.prompt) for c in cold_cases]
    hf_ttft = [_hf_run(oracle, c, 1) for c in _cases(200, args.repeats, size)]

    b1_case = _cases(300, 1, size)
    _, engine_b1 = _engine_decode(llm, [b1_case[0].prompt], args.decode_tokens)
    batch8 = _cases(400, 8, size)
    _, engine_b8 = _engine_decode(llm, [c.prompt for c in batch8], args.decode_tokens)
    hf_b1 = _hf_decode_rate(oracle, size, args.decode_tokens)
    return {
        "ttft_cold_s": statistics.median(ttft_cold),
        "ttft_cached_s": statistics.median(ttft_cached),
        "ttft_cached_over_cold": statistics.median(ttft_cached) / statistics.median(ttft_cold),
        "hf_ttft_s": statistics.median(hf_ttft),
        "decode_tok_s_batch1": engine_b1,
        "decode_tok_s_batch8": engine_b8,
        "hf_decode_tok_s_sequential": hf_b1,
        "batch8_over_hf_sequential": engine_b8 / hf_b1,
    }


def print_table(args, rows: dict) -> None:
    engine_b1, engine_b8, hf_b1 = rows["decode_tok_s_batch1"], rows["decode_tok_s_batch8"], rows["hf_decode_tok_s_sequential"]
    print(f"model={args.model} image={args.image_size} decode_tokens={args.decode_tokens}")
    print(f"{'metric':<34} {'tessera':>10} {'transformers':>13}")
    print(f"{'TTFT cold (s)':<34} {rows['ttft_cold_s']:>10.3f} {rows['hf_ttft_s']:>13.3f}")
    print(f"{'TTFT repeated request (s)':<34} {rows['ttft_cached_s']:>10.3f} {'-':>13}")
    print(f"{'  cached / cold':<34} {rows['ttft_cached_over_cold']:>10.3f} {'-':>13}")
    print(f"{'decode tok/s, batch 1':<34} {engine_b1:>10.1f} {hf_b1:>13.1f}")
    print(f"{'decode tok/s, batch 8':<34} {engine_b8:>10.1f} {'(sequential)':>13}")
    print(f"{'  batch 8 / transformers':<34} {rows['batch8_over_hf_sequential']:>10.2f} {'-':>13}")
