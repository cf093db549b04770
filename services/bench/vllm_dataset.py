"""A workload as a dataset `vllm bench serve` replays (``--dataset-name custom_image``), so vLLM's
own client can drive Tessera and vLLM with our cache-reuse workloads.

Each request becomes one JSONL line ``{"content": [parts...], "output_tokens": N}``: a single
user turn of text and image parts (images stay data URLs, which vLLM's client sends as they
are). That format has one user turn, so a request's messages (a system prompt, a conversation's
replayed turns, the question) are folded into it, each behind a "Role: " label, images kept in
place. The reuse each workload exercises survives the folding: repeated images
are byte-identical, and each turn of a conversation extends the previous turn's parts.

    tessera bench --workload shared_images --requests 32 --export-vllm-dataset shared.jsonl
    vllm bench serve --backend openai-chat --endpoint /v1/chat/completions --dataset-name custom_image \\
      --dataset-path shared.jsonl --disable-shuffle --custom-output-len 16 --ignore-eos ...
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from services.bench.workloads import BenchRequest


def _parts(content: str | list[dict]) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [dict(part) for part in content]


def custom_image_line(request: BenchRequest, output_tokens: int) -> dict:
    parts: list[dict] = []
    for i, message in enumerate(request.messages):
        # Every message, the last included, gets its label: a conversation's first turn is then
        # an exact prefix of its second.
        parts.append({"type": "text", "text": ("\n" if i else "") + f"{message['role'].capitalize()}: "})
        parts.extend(_parts(message["content"]))
    return {"content": parts, "output_tokens": output_tokens}


def write_custom_image_dataset(requests: Iterable[BenchRequest], path: Path, *, output_tokens: int) -> int:
    """Write ``requests`` in order (replay them with --disable-shuffle); how many lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(custom_image_line(request, output_tokens)) for request in requests]
    path.write_text("".join(line + "\n" for line in lines))
    return len(lines)
