"""Preprocessing benchmark: time per image cold and on a processor-cache hit, and mm_hash GB/s.

Cold: each request carries a never-seen image (decode + hash + HF image processing).
Hit: the same image again (decode + hash, image processor skipped).
Prints a table and writes JSON (default benchmarks/results/preprocess.json).

    tessera bench --suite preprocess [--model tiny] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from benchmarks.suites.common import RESULTS, command, image_size, machine, write_json
from services.bench.workloads import user_turn
from services.gateway.frontend.prompt_wire import prompt_for_library
from services.models.registry import resolve_model
from services.preprocess.preprocessor import Preprocessor
from services.preprocess.prompt import Prompt
from shared.hashing import mm_hash_of_pixels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sizes", default="448x448,1024x768,2048x1536")
    parser.add_argument("--out", type=Path, default=RESULTS / "preprocess.json")


def run(args: argparse.Namespace) -> int:
    sizes = [image_size(s) for s in args.sizes.split(",")]
    preprocessor = Preprocessor(resolve_model(args.model))
    rows = bench_sizes(preprocessor, sizes, args.repeats)
    hashing = bench_hash(64 * 1024 * 1024, args.repeats)

    print(f"{'size':>10} {'tokens':>7} {'cold ms':>9} {'hit ms':>8} {'hit/cold':>9}")
    for row in rows:
        print(
            f"{row['size']:>10} {row['image_tokens']:>7} {row['cold_ms_median']:>9.1f} "
            f"{row['hit_ms_median']:>8.1f} {row['hit_over_cold']:>9.2f}"
        )
    print(f"mm_hash (blake3, {hashing['payload_mb']:.0f} MB payload): {hashing['gb_per_s']:.2f} GB/s, median {hashing['median_ms']:.1f} ms")
    result = {
        "benchmark": "preprocess",
        "command": command(args),
        "model": args.model,
        "repeats": args.repeats,
        "machine": machine(),
        "per_image": rows,
        "mm_hash": hashing,
    }
    write_json(args.out, result)
    return 0


def _request(url: str) -> Prompt:
    return prompt_for_library({"messages": user_turn(url, "Describe.")})


def _time(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bench_sizes(preprocessor: Preprocessor, sizes: list[tuple[int, int]], repeats: int) -> list[dict]:
    # The test images (noise over gradients: photo-like entropy, so PNG decoding costs what a
    # photo's does), as every recorded run used; they live in tests/, so this needs a checkout.
    from tests.factories import image_data_url, make_image

    rows = []
    for width, height in sizes:
        urls = [image_data_url(make_image(width, height, seed=1000 + i)) for i in range(repeats)]
        preprocessor.preprocess(_request(image_data_url(make_image(width, height, seed=999))))  # warm-up
        cold = [_time(lambda u=u: preprocessor.preprocess(_request(u))) for u in urls]
        hit = [_time(lambda u=u: preprocessor.preprocess(_request(u))) for u in urls]
        tokens = preprocessor.preprocess(_request(urls[0])).mm_items[0].placeholder.length
        rows.append(
            {
                "size": f"{width}x{height}",
                "image_tokens": tokens,
                "cold_ms_median": statistics.median(cold) * 1e3,
                "hit_ms_median": statistics.median(hit) * 1e3,
                "hit_over_cold": statistics.median(hit) / statistics.median(cold),
            }
        )
    return rows


def bench_hash(num_bytes: int, repeats: int) -> dict:
    payload = os.urandom(num_bytes)
    kwargs = {"merge_size": 2}
    times = [
        _time(
            lambda: mm_hash_of_pixels(model_id="m", modality="image", mode="RGB", size=(1, 1), pixel_bytes=payload, processor_kwargs=kwargs)
        )
        for _ in range(repeats)
    ]
    return {
        "payload_mb": num_bytes / 1e6,
        "median_ms": statistics.median(times) * 1e3,
        "gb_per_s": num_bytes / statistics.median(times) / 1e9,
    }
