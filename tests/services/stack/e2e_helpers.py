"""Helpers shared by the end-to-end tests of the default stack (test_stack_e2e, test_stack_api)."""

from __future__ import annotations

from openai import OpenAI

from tests.factories import encode_image, make_image

GREEDY = {"temperature": 0, "max_tokens": 12, "extra_body": {"ignore_eos": True}}


def client_for(stack) -> OpenAI:
    return OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=120)


def oracle_text(oracle, case, max_tokens=12):
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    tokens = oracle.generate(inputs, max_tokens).token_ids
    return oracle.tokenizer.decode(tokens, skip_special_tokens=True), len(inputs.token_ids)


def png(w, h, seed):
    return encode_image(make_image(w, h, seed=seed))
