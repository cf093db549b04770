"""Helpers shared by the end-to-end tests of stacks (test_stack_e2e, test_stack_api, test_qwen3_5)."""

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


def ask_greedy(stack, case, model: str | None = None) -> tuple[str, int]:
    """A greedy chat answer from the stack's served model (or ``model``: a LoRA adapter's name),
    and its prompt's cached tokens."""
    reply = client_for(stack).chat.completions.create(model=model or stack.served_model, messages=case.body["messages"], **GREEDY)
    return reply.choices[0].message.content, reply.usage.prompt_tokens_details.cached_tokens


def counter(stack, name: str) -> float:
    """A tessera_ counter summed over the stack's nodes."""
    return stack.metrics().get(f"tessera_{name}", 0.0)
