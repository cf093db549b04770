"""Isolation on the real stack: poisoned requests, each failing in a different role, sent while
healthy streams run. Every healthy stream gets exactly the answer it gets alone, every poisoned
request gets a clear error of its own, no node is counted as failed (so none is quarantined), and
the stack stays healthy. Shares the session's stack with test_stack_e2e and test_stack_api.

What reaches each role:
- preprocess, from the API: an image that decodes but whose aspect ratio the model cannot
  represent, and a prompt over the preprocess node's token limit;
- the gateway, from the API: a prompt plus max_tokens beyond max_model_len;
- encoder, prefill and decode: no request from the API can fail there on its own (the gateway
  clamps tiny temperatures to greedy and validates every field, preprocess checks token ids
  against the vocabulary and decodes and sizes every image), so their poison is what a faulty
  caller on the internal plane could send, sent with the stack's internal secret: pixels that do
  not fit their patch grid (encoder), a NaN logit bias (the gateway clips biases to +-100), which
  makes the sampler's logits NaN, and a token id outside the vocabulary (prefill), and that bias
  in a decode step (decode).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import torch
from openai import APIStatusError

from protos.gen import pb, rpc
from services.engine.sampling_params import SamplingParams
from services.engine.sampling_wire import sampling_to_pb
from services.models.qwen2_vl.config import read_config as load_config
from services.transport.internal_channel import internal_channel
from services.transport.node_error import node_error_of
from services.transport.node_stats import read_stats
from services.transport.tensor_channel import ChannelAuth, TensorInbox, TensorSender
from tests.factories import chat_case
from tests.services.stack.e2e_helpers import client_for, png

HEALTHY = [
    chat_case(png(112, 84, 41), "Describe this picture."),
    chat_case("Tell me about rivers."),
    chat_case(png(84, 84, 42), "Which colour dominates?"),
    chat_case("Count from one to ten."),
]
STREAM = {"temperature": 0, "max_tokens": 48, "extra_body": {"ignore_eos": True}}
NAN_BIAS = SamplingParams(max_tokens=8, temperature=1.0, logit_bias=((5, float("nan")),))  # sampling fails on NaN logits
PROMPT = [10 + i for i in range(40)]
# (the role that failed it; its HTTP status, or its gRPC code / the kind of its typed node error;
# its message, or for the expected outcomes a fragment of it)
Outcome = tuple[str, str, str]


def test_poisoned_requests_on_every_role_fail_alone_beside_healthy_streams(stack, tiny_model):
    client = client_for(stack)
    alone = [_stream(client, case.body["messages"]) for case in HEALTHY]
    failures_before = stack.metrics()["tessera_gateway_node_failures_total"]
    nodes = _Nodes(stack, load_config(tiny_model.path).text.vocab_size)
    try:
        streaming = threading.Barrier(len(HEALTHY) + 1)
        with ThreadPoolExecutor(len(HEALTHY) + 2 * len(nodes.poisons())) as pool:
            healthy = [pool.submit(_stream, client, case.body["messages"], streaming) for case in HEALTHY]
            early = [pool.submit(poison, "early") for poison in nodes.poisons()]  # beside preprocess, encode and prefill
            streaming.wait(timeout=120)  # every healthy stream is decoding now
            late = [pool.submit(poison, "late") for poison in nodes.poisons()]  # beside their decode steps
            answers = [f.result(timeout=180) for f in healthy]
            outcomes = [f.result(timeout=180) for f in early + late]
    finally:
        nodes.close()
    assert answers == alone
    expected = nodes.expected() * 2
    assert [(role, status) for role, status, _ in outcomes] == [(role, status) for role, status, _ in expected]
    assert [fragment in message for (_, _, message), (_, _, fragment) in zip(outcomes, expected)] == [True] * len(expected), outcomes
    assert stack.metrics()["tessera_gateway_node_failures_total"] == failures_before  # no node blamed
    assert httpx.get(stack.base_url.removesuffix("/v1") + "/health", timeout=10).json()["status"] == "ok"
    assert _stream(client, HEALTHY[0].body["messages"]) == alone[0]


def _stream(client, messages, streaming: threading.Barrier | None = None) -> tuple[str, int]:
    """A healthy streamed answer: (text, completion tokens)."""
    chunks = client.chat.completions.create(model="tiny", messages=messages, stream=True, stream_options={"include_usage": True}, **STREAM)
    text, usage = "", None
    for chunk in chunks:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            if streaming is not None:  # the first token is out: this stream is decoding
                streaming.wait(timeout=120)
                streaming = None
        usage = chunk.usage or usage
    return text, usage.completion_tokens


class _Nodes:
    """The poisons, one per way in; each returns what failed and how, never raising."""

    def __init__(self, stack, vocab_size: int) -> None:
        self.stack = stack
        self.vocab_size = vocab_size
        self.auth = stack.internal_auth()
        roles = stack.state()["roles"]
        self.grpc_address = {role: roles[role]["grpc_address"] for role in ("encoder", "prefill", "decode")}
        self.data_address = {
            role: read_stats(role, address, self.auth, timeout_s=30).data_address for role, address in self.grpc_address.items()
        }
        channel_auth = ChannelAuth(key=self.auth.tensor_key)
        self.sender = TensorSender(auth=channel_auth)
        self.sink = TensorInbox("tcp://127.0.0.1:0", auth=channel_auth)  # stands in for a prefill or decode node's inbox

    def poisons(self) -> list[Callable[[str], Outcome]]:
        return [
            self.bad_aspect_ratio,
            self.prompt_over_the_preprocess_limit,
            self.context_over_max_model_len,
            self.pixels_that_do_not_fit_their_grid,
            self.prefill_sampling_nan,
            self.prefill_token_outside_the_vocabulary,
            self.decode_sampling_nan,
        ]

    def expected(self) -> list[Outcome]:
        return [
            ("preprocess", "400", "aspect ratio 300.0 exceeds 200"),
            ("preprocess", "400", "the limit is 32768"),
            (
                "gateway",
                "400",
                "40000 in the completion). Please reduce the length of the messages or completion. [context_length_exceeded]",
            ),
            ("encoder", "INTERNAL/REQUEST_FAILED", "encoding failed for this request"),
            ("prefill", "INTERNAL/REQUEST_FAILED", "sampling failed for this request"),
            ("prefill", "INVALID_ARGUMENT/INVALID_REQUEST", f"is outside the vocabulary of {self.vocab_size}"),
            ("decode", "INTERNAL/REQUEST_FAILED", "decode failed: sampling failed for this request"),
        ]

    # -- from the API ---------------------------------------------------------------------------
    def bad_aspect_ratio(self, _: str) -> Outcome:
        messages = chat_case(png(1, 300, 43), "What is this?").body["messages"]
        return self._api("preprocess", messages, max_tokens=4)

    def prompt_over_the_preprocess_limit(self, _: str) -> Outcome:
        return self._api("preprocess", [{"role": "user", "content": "go " * 33000}], max_tokens=4)

    def context_over_max_model_len(self, _: str) -> Outcome:
        return self._api("gateway", [{"role": "user", "content": "Hi."}], max_tokens=40000)

    def _api(self, role: str, messages: list[dict], **sampling) -> Outcome:
        try:
            client_for(self.stack).chat.completions.create(model="tiny", messages=messages, **sampling)
        except APIStatusError as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            code = body.get("code") or body.get("error", {}).get("code")
            return role, str(exc.status_code), f"{exc.message} [{code}]"
        return role, "200", "served"

    # -- on the internal plane ------------------------------------------------------------------
    def pixels_that_do_not_fit_their_grid(self, round_name: str) -> Outcome:
        mm_hash = f"poison-pixels-{round_name}"
        self.sender.send(self.data_address["encoder"], mm_hash, {"pixel_values": torch.zeros(16, 100)}, {"grid_thw": [1, 4, 4]})
        request = pb.EncodeRequest(items=[pb.MmItem(mm_hash=mm_hash, length=4, grid_thw=[1, 4, 4])], target_data_address=self.sink.address)
        return self._rpc("encoder", lambda channel: rpc.EncodeStub(channel).Encode(request, timeout=60))

    def prefill_sampling_nan(self, round_name: str) -> Outcome:
        request = self._prefill_request(f"poison-nan-{round_name}", PROMPT, NAN_BIAS)
        return self._rpc("prefill", lambda channel: rpc.PrefillStub(channel).Prefill(request, timeout=60))

    def prefill_token_outside_the_vocabulary(self, round_name: str) -> Outcome:
        request = self._prefill_request(f"poison-vocab-{round_name}", [*PROMPT, self.vocab_size + 7], SamplingParams(max_tokens=4))
        return self._rpc("prefill", lambda channel: rpc.PrefillStub(channel).Prefill(request, timeout=60))

    def decode_sampling_nan(self, round_name: str) -> Outcome:
        rid = f"poison-decode-{round_name}"
        greedy = self._prefill_request(rid, PROMPT, SamplingParams(max_tokens=8), self.data_address["decode"])

        async def prefill_then_decode(channel: grpc.aio.Channel) -> list[pb.DecodeChunk]:
            async with internal_channel(self.grpc_address["prefill"], self.auth) as prefill:
                first = (await rpc.PrefillStub(prefill).Prefill(greedy, timeout=60)).first_token_id
            request = pb.DecodeRequest(
                request_id=rid,
                prompt_token_ids=PROMPT,
                first_token_id=first,
                sampling=sampling_to_pb(NAN_BIAS),
                stream=True,
            )
            return [chunk async for chunk in rpc.DecodeStub(channel).Decode(request, timeout=60)]

        return self._rpc("decode", prefill_then_decode)

    def _prefill_request(self, rid: str, token_ids: list[int], sampling: SamplingParams, target: str = "") -> pb.PrefillRequest:
        return pb.PrefillRequest(
            request_id=rid, prompt_token_ids=token_ids, decode_data_address=target or self.sink.address, sampling=sampling_to_pb(sampling)
        )

    def _rpc(self, role: str, call: Callable[[grpc.aio.Channel], Awaitable[object]]) -> Outcome:
        """``call`` on a channel of its own to ``role``'s node, on this pool thread's own loop."""

        async def over_a_channel() -> None:
            async with internal_channel(self.grpc_address[role], self.auth) as channel:
                await call(channel)

        try:
            asyncio.run(over_a_channel())
        except grpc.RpcError as exc:
            error = node_error_of(exc)
            return role, f"{exc.code().name}/{error.kind.name if error is not None else '-'}", exc.details()
        return role, "OK", "served"

    def close(self) -> None:
        self.sender.close()
        self.sink.close()
