"""Workloads exported for `vllm bench serve --dataset-name custom_image`: one user turn of text
and image parts per request, in order, with the reuse each workload exercises intact."""

from __future__ import annotations

import json

from services.bench.vllm_dataset import custom_image_line, write_custom_image_dataset
from services.bench.workloads import WorkloadSpec, build_workload
from services.cli.main import main

SPEC = WorkloadSpec(num_requests=8, image_size=(64, 64))


def _images(line: dict) -> list[str]:
    return [part["image_url"]["url"] for part in line["content"] if part["type"] == "image_url"]


def _text(line: dict) -> str:
    return "".join(part.get("text", "") for part in line["content"])


def test_shared_images_keep_their_repeated_images_byte_for_byte(tmp_path):
    path = tmp_path / "shared.jsonl"
    assert (
        main(["bench", "--workload", "shared_images", "--requests", "8", "--image-size", "64x64", "--export-vllm-dataset", str(path)]) == 0
    )
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 8 and all(line["output_tokens"] == 16 for line in lines)
    urls = [url for line in lines for url in _images(line)]
    assert len(urls) == 8 and len(set(urls)) == 2 and all(url.startswith("data:image/png;base64,") for url in urls)
    assert lines == [custom_image_line(r, 16) for r in build_workload("shared_images", SPEC)], "in workload order"


def test_a_conversation_turn_extends_the_previous_turn_and_a_system_prompt_is_folded_in(tmp_path):
    turns = [custom_image_line(r, 8) for r in build_workload("multi_turn", SPEC)]
    # Two conversations interleaved: request k + 2 is the next turn of request k's conversation.
    for k in range(len(turns) - 2):
        earlier, later = turns[k]["content"], turns[k + 2]["content"]
        assert later[: len(earlier)] == earlier, k
        assert _images(turns[k + 2]) == _images(turns[k])
    document = custom_image_line(build_workload("long_prompts", SPEC)[0], 8)
    assert _text(document).startswith("System: You are a careful reader.") and "Summarize it." in _text(document)
    assert write_custom_image_dataset(build_workload("cold_images", SPEC), tmp_path / "d" / "cold.jsonl", output_tokens=4) == 8
