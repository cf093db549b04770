"""KV bytes one request holds, sliding-window layers holding only their window against every
layer holding the whole context (``--no-sliding-window-kv``), in one process.

For each prompt length: one text prompt is prefilled (and one token sampled) by an engine with
each layout; the pages the request holds right after its prompt (before it finishes) are counted
from the pool, and the greedy tokens of both layouts are compared (they must be equal).

    tessera bench --suite kv_layout --model gemma3-small --prompt-tokens 512,2048,8192
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.suites.common import RESULTS, command, machine, write_json

WORDS = "lantern river stone meadow orchard harbour quarry lighthouse".split()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="gemma3-small")
    parser.add_argument("--prompt-tokens", default="512,2048,8192", help="comma-separated prompt lengths (approximate)")
    parser.add_argument("--out", type=Path, default=RESULTS / "kv_layout.json")


def _held_bytes(windowed: bool, model: str, num_words: int) -> tuple[int, int, list[int]]:
    """(bytes held after the prompt, prompt tokens, greedy tokens)."""
    from services.engine.config import EngineConfig
    from services.engine.llm import LLM
    from services.engine.sampling_params import SamplingParams
    from services.gateway.frontend.prompt_wire import prompt_for_library

    llm = LLM(model, EngineConfig(sliding_window_kv=windowed, max_model_len=65536, kv_cache_bytes=2 << 30))
    engine = llm.engine
    body = {"messages": [{"role": "user", "content": " ".join(WORDS[i % len(WORDS)] for i in range(num_words))}]}
    held: list[int] = []

    def count_pages(request) -> None:  # a finish listener: the request's pages are still held
        held.append(engine.kv.pool.num_blocks - engine.kv.pool.num_free_blocks)

    engine.finish_listeners.append(count_pages)
    [result] = llm.generate([prompt_for_library(body)], SamplingParams(max_tokens=1))
    k_cache = engine.runner.kv_caches[0][0]
    bytes_per_page = 2 * len(engine.runner.kv_caches) * k_cache[0].numel() * k_cache.element_size()
    return held[0] * bytes_per_page, result.usage.prompt_tokens, result.token_ids


def run(args: argparse.Namespace) -> int:
    rows = []
    print(f"{'prompt tokens':>14} {'all layers (MiB)':>17} {'windowed (MiB)':>15} {'ratio':>6}  same tokens")
    for target in (int(n) for n in args.prompt_tokens.split(",")):
        num_words = max(1, target - 8)  # each word is about one token, plus the template
        full, num_tokens, full_tokens = _held_bytes(False, args.model, num_words)
        windowed, _, windowed_tokens = _held_bytes(True, args.model, num_words)
        same = full_tokens == windowed_tokens
        rows.append({"prompt_tokens": num_tokens, "full_bytes": full, "windowed_bytes": windowed, "same_tokens": same})
        print(f"{num_tokens:>14} {full / 2**20:>17.1f} {windowed / 2**20:>15.1f} {windowed / full:>6.2f}  {same}")
    write_json(args.out, {"command": command(args), "machine": machine(), "model": args.model, "rows": rows})
    return 0 if all(r["same_tokens"] for r in rows) else 1
