"""Probing a running stack (``tessera serve``) and its cache index, for the failure tests:
greedy requests through the official openai client (one at a time, or concurrent streams), the
reference oracle's answer, which nodes the index serves as an image's holders, and bounded polling.
"""

from __future__ import annotations

import os
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from openai import OpenAI

from services.preprocess.preprocessor import Preprocessor
from services.stack.redis_server import redis_answers
from services.transport.node_stats import read_stats
from tests.factories import encode_image, make_image
from tests.services.stack.conftest import RunningStack

MAX_TOKENS = 8
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS, "extra_body": {"ignore_eos": True}}


def stack_env() -> dict[str, str]:
    """The test's environment, without overrides of the roles' index settings (so every node
    registers with NodeSettings' default heartbeat TTL)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_SERVE_INDEX")}


def openai_client(stack: RunningStack) -> OpenAI:
    return OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)


def png_image(seed: int) -> bytes:
    return encode_image(make_image(112, 112, seed=seed))


def oracle_text(oracle, case) -> str:
    tokens = oracle.generate(oracle.process(oracle.chat_text(case.oracle_messages), case.images), MAX_TOKENS).token_ids
    return oracle.tokenizer.decode(tokens, skip_special_tokens=True)


def wait_until(predicate, timeout_s: float, interval_s: float = 0.1):
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout_s`` passes (None)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value or None
        time.sleep(interval_s)


def index_is_up(stack, url: str) -> bool:
    return redis_answers(url, password=stack.index_password)


def mm_hash_of(preprocessor: Preprocessor, case) -> str:
    return preprocessor.preprocess(case.prompt).mm_items[0].mm_hash


def served_holders(index, mm_hashes: list[str], role: str = "encoder") -> dict[str, set[str]]:
    """mm_hash -> the node ids of ``role`` the index serves as holders (live heartbeat, current
    epoch, a live record). Prefill nodes publish the embeddings they hold too; these tests follow
    encoders."""
    result = index.lookup(mm_hashes, [])
    live = index.live_nodes()
    named = {n for n, epoch in result.node_to_epoch.items() if n in live and live[n].epoch == epoch and live[n].info.role == role}
    return {h: set(result.mm_holders[h]) & named for h in mm_hashes}


def is_serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False


def ask(stack: RunningStack, case, *, stream: bool = False, during=None) -> tuple[str, int]:
    """(text, cached prompt tokens) of one greedy request; ``during`` runs once the first streamed
    token has arrived (the request is then past routing, encoding and prefill, and still decoding)."""
    client = openai_client(stack)
    if not stream:
        reply = client.chat.completions.create(model="tiny", messages=case.body["messages"], **GREEDY)
        assert reply.usage.completion_tokens == MAX_TOKENS
        return reply.choices[0].message.content, reply.usage.prompt_tokens_details.cached_tokens
    chunks = client.chat.completions.create(
        model="tiny", messages=case.body["messages"], stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    text, usage, called = "", None, during is None
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            if not called:
                during()
                called = True
            text += chunk.choices[0].delta.content
        if chunk.usage:
            usage = chunk.usage
    assert called, "no token was streamed"
    assert usage is not None and usage.completion_tokens == MAX_TOKENS
    return text, usage.prompt_tokens_details.cached_tokens


class Streams:
    """Concurrent streaming requests; ``wait_flowing(n)`` returns once n of them got a token.
    With ``logprobs=True`` in ``greedy``, ``tokens`` holds each stream's token strings, one per
    generated token (what the decode nodes name each token id)."""

    def __init__(self, stack: RunningStack, cases, greedy: dict, *, model: str = "tiny") -> None:
        self.greedy, self.model = greedy, model
        self.client = OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=120)
        self.cases = cases
        self.texts: list[str | None] = [None] * len(cases)
        self.tokens: list[list[str] | None] = [None] * len(cases)
        self.errors: list[BaseException] = []
        self._flowing = threading.Semaphore(0)
        self._threads = [threading.Thread(target=self._one, args=(i,)) for i in range(len(cases))]
        for thread in self._threads:
            thread.start()

    def _one(self, i: int) -> None:
        try:
            messages = self.cases[i].body["messages"]
            chunks = self.client.chat.completions.create(model=self.model, messages=messages, stream=True, **self.greedy)
            text, tokens, first = "", [], True
            for chunk in chunks:
                if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
                    tokens += [lp.token for lp in chunk.choices[0].logprobs.content]
                if chunk.choices and chunk.choices[0].delta.content:
                    if first:
                        self._flowing.release()
                        first = False
                    text += chunk.choices[0].delta.content
            self.texts[i] = text
            self.tokens[i] = tokens
        except BaseException as exc:
            self.errors.append(exc)
            self._flowing.release()

    def wait_flowing(self, num_streams: int) -> None:
        for _ in range(num_streams):
            assert self._flowing.acquire(timeout=120), "no stream started"

    def join(self) -> tuple[list[str | None], list[BaseException]]:
        for thread in self._threads:
            thread.join(timeout=300)
        return self.texts, self.errors


def busiest_decode_node(stack: RunningStack, timeout_s: float = 30.0) -> dict:
    """The decode node with the most streams running, once one runs any. Which node holds streams
    still decoding depends on timing (a fast node may finish its first streams while the last ones
    start), so the victim is chosen by what it runs, not by name; and a stream's first token comes
    from its prefill node, a moment before its decode node runs it."""
    nodes = [node for name, node in stack.state()["roles"].items() if name.split("-")[0] == "decode"]
    deadline = time.monotonic() + timeout_s
    while True:
        running = [read_stats("decode", node["grpc_address"], stack.internal_auth()).gauges["engine_requests_running"] for node in nodes]
        if max(running) > 0:
            return nodes[running.index(max(running))]
        assert time.monotonic() < deadline, f"no decode node ran a stream within {timeout_s} s"
        time.sleep(0.01)
