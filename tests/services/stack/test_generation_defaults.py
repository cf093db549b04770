"""A checkpoint's generation_config.json sampling defaults reach requests that leave those fields
unset (vLLM's --generation-config auto), end to end: Qwen2-VL-7B-Instruct's file on a checkpoint in
that repository's layout, a greedy request, and transformers' ``generate``, which applies the same
file's penalty (1.05), token for token. The reply is long enough for the penalty to change a greedy
choice (this random model repeats a token first at step 43), which the test checks first."""

from __future__ import annotations

import json

from tests.factories import chat_case, encode_image, make_image
from tests.hub_layouts import write_layout
from tests.oracle import ReferenceOracle
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.e2e_helpers import client_for

MAX_TOKENS = 64
QWEN2_VL_7B_INSTRUCT_GENERATION = {
    "bos_token_id": 151643,
    "pad_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.05,
    "temperature": 0.1,
    "top_k": 1,
    "top_p": 0.001,
    "transformers_version": "4.37.0",
}


def test_the_checkpoints_repetition_penalty_applies_as_in_transformers(repo_root, tmp_path):
    model_dir = write_layout("qwen2-vl-7b", tmp_path / "Qwen2-VL-7B-Instruct")
    (model_dir / "generation_config.json").write_text(json.dumps(QWEN2_VL_7B_INSTRUCT_GENERATION))
    case = chat_case(encode_image(make_image(112, 84, seed=9)), "Describe this image in detail.")
    oracle = ReferenceOracle(model_dir)
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    penalised = oracle.generate(inputs, MAX_TOKENS).token_ids  # the file's 1.05 applies
    assert penalised != oracle.generate(inputs, MAX_TOKENS, repetition_penalty=1.0).token_ids  # else this proves nothing
    (tmp_path / "stack").mkdir()
    stack = launch_stack(tmp_path / "stack", repo_root, "--model", str(model_dir))
    try:
        reply = client_for(stack).chat.completions.create(
            model=model_dir.name, messages=case.body["messages"], temperature=0, max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True}
        )
        assert reply.choices[0].message.content == oracle.tokenizer.decode(penalised, skip_special_tokens=True)
    finally:
        stop_stack(stack)
