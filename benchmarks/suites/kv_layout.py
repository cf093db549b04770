"""KV bytes one request holds, sliding-window layers holding only their window against every
layer holding the whole context (``--no-sliding-window-kv``), in one process.

For each prompt length: one text prompt is prefilled (and one token sampled) by an engine with
each layout; the pages the request holds right after its prompt (before it finishes) are counted
from the pool, and the greedy tokens of both layouts are compared (they must be equal).

    tessera bench --suite kv_layout --model gemma3-small --prompt-tokens 512,2048,8192

For a hybrid model (Qwen3.5), the request's KV pages plus its state slot against the same
checkpoint with every layer full attention (the same dimensions and weights where they exist,
written beside it: ``--hybrid``), each engine's own count:

    tessera bench --suite kv_layout --hybrid --model qwen3_5-tiny --prompt-tokens 512,2048,8192
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.suites.common import RESULTS, command, machine, write_json

WORDS = "lantern river stone meadow orchard harbour quarry lighthouse".split()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="gemma3-small")
    parser.add_argument("--prompt-tokens", default="512,2048,8192", help="comma-separated prompt lengths (approximate)")
    parser.add_argument("--hybrid", action="store_true", help="a hybrid model's KV + state against all layers full attention")
    parser.add_argument("--out", type=Path, default=None, help="default results/kv_layout.json (kv_layout_hybrid.json with --hybrid)")


def _held_bytes(windowed: bool, model: str, num_words: int) -> tuple[int, int, list[int]]:
    """(bytes held after the prompt, prompt tokens, greedy tokens); a hybrid model's state slot
    counted in."""
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
    state = engine.runner.checkpoint.shape.state
    state_bytes = state.bytes_per_request() if state is not None else 0
    return held[0] * bytes_per_page + state_bytes, result.usage.prompt_tokens, result.token_ids


def _all_full_attention(model: str, out: Path) -> Path:
    """``model``'s checkpoint with every layer full attention, the same dimensions (weights of the
    layers that change drawn as the built-ins draw theirs)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from services.models.builtins.weights import fill_deterministic
    from services.models.registry import resolve_model

    source = resolve_model(model).path
    config = AutoConfig.from_pretrained(source)
    config.text_config.layer_types = ["full_attention"] * config.text_config.num_hidden_layers
    full = AutoModelForImageTextToText.from_config(config).to(torch.float32)
    fill_deterministic(full, seed=1, std=0.3)
    full.save_pretrained(out)
    for file in source.iterdir():
        if file.suffix != ".safetensors" and file.name not in ("config.json", "model.safetensors.index.json", "tessera_build.json"):
            shutil.copy(file, out / file.name)
    return out


def run_hybrid(args: argparse.Namespace) -> int:
    import tempfile

    rows = []
    print(f"{'prompt tokens':>14} {'all full attention (MiB)':>25} {'hybrid KV + state (MiB)':>24} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        full_model = str(_all_full_attention(args.model, Path(tmp) / "all-full-attention"))
        for target in (int(n) for n in args.prompt_tokens.split(",")):
            num_words = max(1, target - 8)
            hybrid, num_tokens, _ = _held_bytes(True, args.model, num_words)
            full, _, _ = _held_bytes(True, full_model, num_words)
            rows.append({"prompt_tokens": num_tokens, "full_attention_bytes": full, "hybrid_bytes": hybrid})
            print(f"{num_tokens:>14} {full / 2**20:>25.2f} {hybrid / 2**20:>24.2f} {hybrid / full:>6.2f}")
    out = args.out or RESULTS / "kv_layout_hybrid.json"
    write_json(out, {"command": command(args), "machine": machine(), "model": args.model, "rows": rows})
    return 0


def run(args: argparse.Namespace) -> int:
    if args.hybrid:
        return run_hybrid(args)
    rows = []
    print(f"{'prompt tokens':>14} {'all layers (MiB)':>17} {'windowed (MiB)':>15} {'ratio':>6}  same tokens")
    for target in (int(n) for n in args.prompt_tokens.split(",")):
        num_words = max(1, target - 8)  # each word is about one token, plus the template
        full, num_tokens, full_tokens = _held_bytes(False, args.model, num_words)
        windowed, _, windowed_tokens = _held_bytes(True, args.model, num_words)
        same = full_tokens == windowed_tokens
        rows.append({"prompt_tokens": num_tokens, "full_bytes": full, "windowed_bytes": windowed, "same_tokens": same})
        print(f"{num_tokens:>14} {full / 2**20:>17.1f} {windowed / 2**20:>15.1f} {windowed / full:>6.2f}  {same}")
    write_json(args.out or RESULTS / "kv_layout.json", {"command": command(args), "machine": machine(), "model": args.model, "rows": rows})
    return 0 if all(r["same_tokens"] for r in rows) else 1
