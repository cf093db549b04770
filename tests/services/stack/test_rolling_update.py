"""A rolling update under one name and one index: two stacks serve checkpoints v1 and v2, both
called "vlm", and register in the same Valkey. Each node's model id is name@fingerprint, so each
gateway routes only to nodes with its own weights and no cached work crosses: both stay exact
against their own weights on every cache path (cold, then processor, encoder and prefix hits).
Slow (two stacks, ~75 s); the default suite checks the ids themselves in
tests/services/models/test_fingerprint.py."""

from __future__ import annotations

import shutil

import torch
from safetensors.torch import load_file, save_file

from tests.factories import chat_case
from tests.oracle import ReferenceOracle
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.e2e_helpers import client_for, png


def make_v2(v1, directory):
    """v1 with different text weights: every final-norm channel rescaled."""
    shutil.copytree(v1, directory)
    weights = load_file(str(directory / "model.safetensors"))
    name = next(n for n in sorted(weights) if n.endswith("norm.weight") and "visual" not in n and "layers" not in n)
    weights[name] = weights[name] * (1 + torch.rand(weights[name].shape, generator=torch.Generator().manual_seed(0)))
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def test_v1_and_v2_under_one_name_on_one_index_each_stay_exact(tiny_model, repo_root, tmp_path):
    v1 = tmp_path / "v1" / "vlm"
    shutil.copytree(tiny_model.path, v1)
    v2 = make_v2(tiny_model.path, tmp_path / "v2" / "vlm")
    case = chat_case(png(72, 56, 21), "Describe this image.")
    expected = {}
    for version, path in (("v1", v1), ("v2", v2)):
        oracle = ReferenceOracle(path)
        tokens = oracle.generate(oracle.process(oracle.chat_text(case.oracle_messages), case.images), 8).token_ids
        expected[version] = oracle.tokenizer.decode(tokens, skip_special_tokens=True)
        del oracle
    assert expected["v1"] != expected["v2"]  # the two versions do answer differently
    for name in ("stack-v1", "stack-v2"):
        (tmp_path / name).mkdir()
    first = launch_stack(tmp_path / "stack-v1", repo_root, "--model", str(v1))
    try:
        second = launch_stack(
            tmp_path / "stack-v2",
            repo_root,
            "--model",
            str(v2),
            "--index-url",
            first.state()["valkey"]["url"],
            index_password=first.index_password,
        )
        try:
            for _ in range(2):  # cold, then every cache path hit
                for version, stack in (("v1", first), ("v2", second), ("v1", first)):
                    reply = client_for(stack).chat.completions.create(
                        model="vlm", messages=case.body["messages"], temperature=0, max_tokens=8, extra_body={"ignore_eos": True}
                    )
                    assert reply.choices[0].message.content == expected[version], version
            for stack in (first, second):  # each gateway sees its own four nodes only
                up = [name for name in stack.metrics() if name.startswith("tessera_node_up{") and 'role="gateway"' not in name]
                assert len(up) == 4, up
                assert stack.metrics()["tessera_prefix_cache_hits_total"] > 0
        finally:
            stop_stack(second)
    finally:
        stop_stack(first)
