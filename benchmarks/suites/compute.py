"""The engine's compute on one device, in process: the decode step at several widths, the vision
tower per image, and a token-exactness check against transformers' ``generate`` on that device.

    tessera bench --suite compute --model small --device cuda
    tessera bench --suite compute --model small --device cpu --batches 1,4,16

Decode step: ``batch`` text requests are prefilled, then each following ``Engine.step()`` (one
token for every request: scheduling, the forward, the head, sampling, output processing) is
timed; the median of ``--steps`` steps. ``max_num_seqs`` is raised to the widest batch. The
step returns its tokens as Python ints, so a GPU step is timed to its end without an explicit
synchronize.

Vision tower: the preprocessed pixels of ``n`` distinct images of each ``--image-sizes`` size in
one ``encode`` call, the device synchronized around it; the median of ``--repeats`` calls, after
one warm-up.

Exactness: greedy float32 tokens of an image request and a text request, the engine's (both in
one batch) against transformers' ``generate`` on the same device, TF32 off on both sides (CUDA
turns it on for cuDNN's convolutions by default, which would round differently on each side).

The transformers reference and the requests are the tests' (tests/oracle.py, tests/factories.py):
this suite runs from a repository checkout.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.suites.common import RESULTS, command, image_size, machine, write_json
from services.engine.config import EngineConfig
from services.engine.llm import LLM
from services.engine.sampling_params import SamplingParams

MAX_STEP_TOKENS = 2048  # a decode-step request's budget: never reached, the requests are aborted
QUESTIONS = ("What is in this image?", "Describe the colours.", "Count the shapes.", "What style is it?")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="small")
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda (default: cuda where present)"
    )
    parser.add_argument("--attention-backend", default="torch", choices=["auto", "torch", "flashinfer"])
    parser.add_argument("--batches", default="1,4,16,64,256", help="decode widths, requests stepping together")
    parser.add_argument("--steps", type=int, default=32, help="timed decode steps per width")
    parser.add_argument("--image-sizes", default="448x448,1024x768")
    parser.add_argument("--image-batches", default="1,4", help="images per vision-tower call")
    parser.add_argument("--repeats", type=int, default=5, help="timed vision-tower calls per size and batch")
    parser.add_argument("--check-tokens", type=int, default=24, help="greedy tokens compared with transformers (0: no check)")
    parser.add_argument("--out", type=Path, default=None, help="default benchmarks/results/compute-DEVICE.json")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cases(seed: int, num: int, size: tuple[int, int]):
    from tests.factories import chat_case, encode_image, make_image  # the oracle's requests: a checkout's tests/

    return [chat_case(encode_image(make_image(*size, seed=seed + i)), QUESTIONS[i % 4]) for i in range(num)]


def decode_step_ms(llm: LLM, batch: int, num_steps: int) -> float:
    """Median wall time of one engine step while ``batch`` text requests decode together. The
    requests may run long (those prefilled first decode while the rest prefill); they are aborted
    once ``num_steps`` steps are timed."""
    from tests.factories import chat_case

    params = SamplingParams(max_tokens=MAX_STEP_TOKENS, ignore_eos=True)
    request_ids = [f"step-{batch}-{i}" for i in range(batch)]
    for i, request_id in enumerate(request_ids):
        prompt = chat_case(f"Request {i}: write a long story about a lantern, a river and a stone.").prompt
        llm.engine.add_request(request_id, llm.preprocessor.preprocess(prompt), params)
    with_token: set[str] = set()
    for _ in range(MAX_STEP_TOKENS):  # bounded; every request has its first token long before
        with_token.update(o.request_id for o in llm.engine.step() if o.output_token_ids)
        if len(with_token) == batch:
            break
    else:
        raise RuntimeError(f"{batch} requests did not all start decoding (is max_num_seqs below {batch}?)")
    times = []
    for _ in range(num_steps):
        started = time.perf_counter()
        outputs = llm.engine.step()
        times.append(time.perf_counter() - started)
        if len(outputs) != batch:
            raise RuntimeError(f"a step of {batch} decoding requests gave {len(outputs)} tokens")
    for request_id in request_ids:
        llm.engine.abort(request_id)
    return statistics.median(times) * 1e3


def vision_ms(llm: LLM, size: tuple[int, int], num_images: int, repeats: int) -> float:
    """Median wall time of one vision-tower call over ``num_images`` distinct images of ``size``."""
    vision = llm.engine.runner.vision
    assert vision is not None
    items = [llm.preprocessor.preprocess(case.prompt).mm_items[0].image for case in _cases(700, num_images, size)]
    pixels, grids = [item.pixel_values for item in items], [item.grid_thw for item in items]
    device = llm.engine.runner.device
    vision.encode(pixels, grids)  # warm-up
    times = []
    for _ in range(repeats):
        _sync(device)
        started = time.perf_counter()
        vision.encode(pixels, grids)
        _sync(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def check_tokens(llm: LLM, num_tokens: int) -> list[dict]:
    """The engine's greedy tokens against transformers' on the engine's device, one row per request."""
    from tests.factories import chat_case
    from tests.oracle import ReferenceOracle

    device = llm.engine.runner.device
    cases = [*_cases(800, 1, (448, 448)), chat_case("Name three rivers and say why each matters.")]
    ours = llm.generate([c.prompt for c in cases], SamplingParams(max_tokens=num_tokens, ignore_eos=True))
    oracle = ReferenceOracle(llm.model.path)
    oracle.model.to(device)
    rows = []
    for case, result in zip(cases, ours):
        inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images).to(device)
        reference = oracle.generate(inputs, num_tokens)
        first_divergence = next((i for i, (a, b) in enumerate(zip(result.token_ids, reference.token_ids)) if a != b), None)
        rows.append(
            {
                "request": "image" if case.images else "text",
                "equal": result.token_ids == reference.token_ids,
                "first_divergence": first_divergence,
                "oracle_top2_margin_there": None if first_divergence is None else reference.top2_margin(first_divergence),
                "tessera": result.token_ids,
                "transformers": reference.token_ids,
            }
        )
    return rows


def run(args: argparse.Namespace) -> int:
    torch.set_grad_enabled(False)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    batches = [int(b) for b in args.batches.split(",")]
    config = EngineConfig(device=args.device, attention_backend=args.attention_backend, max_num_seqs=max(256, *batches))
    llm = LLM(args.model, config)
    result: dict = {
        "benchmark": "compute",
        "command": command(args),
        "model": args.model,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "attention_backend": type(llm.engine.runner.backend).__name__,
        "machine": machine(torch=torch.__version__, torch_threads=torch.get_num_threads()),
    }
    print(f"model={args.model} device={result['device_name'] or device} attention={result['attention_backend']}", flush=True)
    if args.check_tokens:
        result["exactness"] = check_tokens(llm, args.check_tokens)
        for row in result["exactness"]:
            print(f"  {row['request']} request: {'equal' if row['equal'] else 'DIFFERENT at ' + str(row['first_divergence'])}", flush=True)
    decode_step_ms(llm, batches[0], 8)  # warm-up: the first steps on a device pay for loading its kernels
    result["decode_step_ms"] = {}
    print(f"{'decode width':>12} {'step p50 (ms)':>14} {'tokens/s':>10}")
    for batch in batches:
        step = decode_step_ms(llm, batch, args.steps)
        result["decode_step_ms"][batch] = step
        print(f"{batch:>12} {step:>14.2f} {batch / step * 1e3:>10.0f}", flush=True)
    result["vision_ms"] = {}
    print(f"{'image size':>12} {'images':>7} {'call p50 (ms)':>14} {'per image (ms)':>15}")
    for size_text in args.image_sizes.split(","):
        for num_images in (int(n) for n in args.image_batches.split(",")):
            call = vision_ms(llm, image_size(size_text), num_images, args.repeats)
            result["vision_ms"][f"{size_text}x{num_images}"] = call
            print(f"{size_text:>12} {num_images:>7} {call:>14.2f} {call / num_images:>15.2f}", flush=True)
    write_json(args.out or RESULTS / f"compute-{device.type}.json", result)
    return 0
