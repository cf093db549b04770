"""Detokenization cost per generated token: the whole output decoded again at every token,
against the incremental detokenizer (services/engine/detokenizer.py), at several output lengths.
Both produce the same text after every token (checked here too). Prints a table, writes JSON.

    tessera bench --suite detokenize --model small --lengths 256,1024,4096
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks.suites.common import RESULTS, command, machine, write_json

TEXT = "The quick brown fox jumps over the lazy dog. Grüße, 世界 🙂 naïve café. "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="small")
    parser.add_argument("--lengths", default="256,1024,4096", help="output lengths in tokens")
    parser.add_argument("--repeats", type=int, default=3, help="runs per length; the median is reported")
    parser.add_argument("--out", type=Path, default=RESULTS / "detokenize.json")


def run(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from services.engine.detokenizer import DetokenizerState, IncrementalDetokenizer
    from services.models.registry import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(args.model).path))
    lengths = [int(n) for n in args.lengths.split(",")]
    ids = tokenizer.encode(TEXT * (max(lengths) // 10 + 1), add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer, frozenset())
    rows = []
    for length in lengths:
        output = ids[:length]
        full_s, incremental_s = [], []
        for _ in range(args.repeats):
            grown: list[int] = []
            state = DetokenizerState()
            full = incremental = 0.0
            for token in output:  # as the engine grows a request's output, one token per step
                grown.append(token)
                started = time.perf_counter()
                expected = tokenizer.decode(grown, skip_special_tokens=True)
                full += time.perf_counter() - started
                started = time.perf_counter()
                text = detokenizer.text(state, grown)
                incremental += time.perf_counter() - started
                if text != expected:
                    raise AssertionError(f"incremental text differs from the full decode at token {len(grown)}")
            full_s.append(full / length)
            incremental_s.append(incremental / length)
        full_us, incremental_us = statistics.median(full_s) * 1e6, statistics.median(incremental_s) * 1e6
        rows.append({"tokens": length, "full_us_per_token": full_us, "incremental_us_per_token": incremental_us})
    print(f"{'tokens':>7}  {'full decode':>12}  {'incremental':>12}  full / incremental")
    for row in rows:
        ratio = row["full_us_per_token"] / row["incremental_us_per_token"]
        print(f"{row['tokens']:7d}  {row['full_us_per_token']:9.0f} us  {row['incremental_us_per_token']:9.0f} us  {ratio:.1f}x")
    write_json(args.out, {"benchmark": "detokenize", "command": command(args), "model": args.model, "machine": machine(), "results": rows})
    return 0
