"""The gateway pipeline's retry, failover and migration logic, over in-process fake grpc.aio
stubs (the real thing runs on the stack in tests/services/stack/test_failover.py)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from protos.gen import pb
from services.engine.sampling_params import SamplingParams
from services.gateway.errors import GatewayError
from services.gateway.pipeline.failures import Attempts, NodeFailure, NodeOverloaded
from services.gateway.pipeline.pipeline import Pipeline
from services.router.membership import Membership
from services.router.policies import make_policy
from services.router.router import Router
from services.transport.node_error import ErrorKind, NodeError, NodeRef
from shared.index.memory_backend import InProcessIndex
from shared.index.reader import LocalReader
from shared.index.types import NodeInfo
from shared.types import MmHash
from tests.fake_clock import FakeClock
from tests.fake_rpc_error import FakeRpcError, failed_with

PROMPT = [11, 12, 13]
NODES = {"preprocess": ("pre:1", "pre:2"), "encoder": ("e:1", "e:2"), "prefill": ("p:1", "p:2"), "decode": ("d:1", "d:2")}


UNAVAILABLE = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")


class Pending:
    """A unary grpc.aio call: it runs when awaited."""

    def __init__(self, run) -> None:
        self.run, self.cancelled = run, False

    def __await__(self):
        return self._result().__await__()

    async def _result(self):
        return self.run()

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class Stream:
    """A decode stream: yields chunks, then optionally dies."""

    def __init__(self, chunks: list[pb.DecodeChunk], error: grpc.RpcError | None = None) -> None:
        self.chunks, self.error, self.cancelled = chunks, error, False

    async def __aiter__(self):
        for chunk in self.chunks:
            yield chunk
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        self.cancelled = True


class FakeNode:
    """Every role's methods; ``failures`` lists errors to raise, one per call, before succeeding."""

    def __init__(self, address: str, calls: list) -> None:
        self.address, self.calls = address, calls
        self.failures: list[grpc.RpcError] = []
        self.streams: list[Stream] = []
        self.hanging: list = []  # prefill calls to hand out (recorded) before real ones
        self.mm_items: list[pb.MmItem] = []  # the images a preprocess node reports

    def _record(self, method: str, request):
        self.calls.append((method, self.address, request))
        if self.failures:
            raise self.failures.pop(0)

    def _unary(self, method: str, request, response):
        def run():
            self._record(method, request)
            return response

        return Pending(run)

    def Preprocess(self, request, timeout=None, metadata=None):
        return self._unary("Preprocess", request, pb.PreprocessResponse(prompt_token_ids=PROMPT, mm_items=self.mm_items))

    def PushPixels(self, request, timeout=None, metadata=None):
        return self._unary("PushPixels", request, pb.PushPixelsResponse())

    def Stats(self, request, timeout=None, metadata=None):
        return Pending(lambda: pb.StatsResponse(data_address=f"tcp://{self.address}"))

    def Prefill(self, request, timeout=None, metadata=None):
        if self.hanging:
            self.calls.append(("Prefill", self.address, request))
            return self.hanging.pop(0)
        return self._unary("Prefill", request, pb.PrefillResponse(first_token_id=100 + len(request.prior_output_token_ids)))

    def Decode(self, request, timeout=None, metadata=None):
        self.calls.append(("Decode", self.address, request))
        if self.failures:  # a grpc.aio stream fails when read, not when called
            return Stream([], self.failures.pop(0))
        if self.streams:
            return self.streams.pop(0)
        first = request.first_token_id
        tokens = [first, first + 1]
        return Stream(
            [
                pb.DecodeChunk(token_ids=[t], text=f"{len(request.prior_output_token_ids) + i}", finished=i == 1)
                for i, t in enumerate(tokens)
            ]
        )


class FakePipeline(Pipeline):
    def __init__(self, router: Router | None = None, **kwargs) -> None:
        super().__init__(router or Router(Membership(None, NODES), policy=make_policy("round_robin")), **kwargs)
        self.calls: list = []
        self.nodes = {a: FakeNode(a, self.calls) for addresses in NODES.values() for a in addresses}

    def stub(self, role: str, address: str):
        return self.nodes[address]

    def generate(self, max_tokens: int = 8, **kwargs) -> list:
        return asyncio.run(self.collect(SamplingParams(max_tokens=max_tokens, temperature=0.0), **kwargs))

    async def collect(self, sampling: SamplingParams, **kwargs) -> list:
        return [event async for event in self.run(pb.PromptInput(text="x"), sampling, **kwargs)]

    def called(self, method: str) -> list:
        return [(address, request) for m, address, request in self.calls if m == method]


def test_a_failed_prefill_node_is_retried_on_the_other_and_quarantined():
    pipeline = FakePipeline()
    pipeline.nodes["p:1"].failures = [UNAVAILABLE]
    events = pipeline.generate()
    assert [e.token_ids for e in events] == [[100], [101]]
    assert [a for a, _ in pipeline.called("Prefill")] == ["p:1", "p:2"]
    assert pipeline.membership.nodes("prefill")[0].info.grpc_address == "p:2"  # p:1 sits out
    assert pipeline.num_retries == 1 and pipeline.num_migrations == 0


def test_the_encoder_a_prefill_node_names_as_failed_is_avoided_on_the_retry():
    pipeline = FakePipeline()
    failed = failed_with(NodeError(ErrorKind.NODE_FAILED, "encoder down", NodeRef("encoder", "e:1")))
    pipeline.nodes["p:1"].failures = [failed]
    pipeline.generate()
    encoders = [r.encoder_address for _, r in pipeline.called("Prefill")]
    assert encoders == ["e:1", "e:2"]


def test_a_request_error_is_returned_at_once_and_never_retried():
    pipeline = FakePipeline()
    pipeline.nodes["p:1"].failures = [failed_with(NodeError(ErrorKind.INVALID_REQUEST, "too long"))]
    with pytest.raises(GatewayError) as caught:
        pipeline.generate()
    assert caught.value.status == 400 and caught.value.message == "too long" and len(pipeline.called("Prefill")) == 1


def test_a_failed_preprocess_node_is_replaced():
    pipeline = FakePipeline()
    pipeline.nodes["pre:1"].failures = [UNAVAILABLE]
    pipeline.generate()
    assert [a for a, _ in pipeline.called("Preprocess")] == ["pre:1", "pre:2"]


def test_a_stream_cut_by_a_dead_decode_node_migrates_without_repeating_a_token():
    pipeline = FakePipeline()
    cut = Stream([pb.DecodeChunk(token_ids=[100], text="a"), pb.DecodeChunk(token_ids=[7], text="ab")], UNAVAILABLE)
    pipeline.nodes["d:1"].streams = [cut]
    events = pipeline.generate()
    assert [e.token_ids for e in events] == [[100], [7], [102], [103]]
    (_, first), (_, second) = pipeline.called("Prefill")
    assert list(first.prior_output_token_ids) == [] and list(second.prior_output_token_ids) == [100, 7]
    (d1, _), (d2, resumed) = pipeline.called("Decode")
    assert (d1, d2) == ("d:1", "d:2") and list(resumed.prior_output_token_ids) == [100, 7]
    assert resumed.first_token_id == 102  # the token after the ones already sent
    assert cut.cancelled and pipeline.num_migrations == 1


def test_when_no_node_of_a_role_is_left_the_request_gets_a_clear_503():
    pipeline = FakePipeline(Router(Membership(None, {**NODES, "decode": ()}), policy=make_policy("round_robin")))
    with pytest.raises(GatewayError) as caught:
        pipeline.generate()
    assert caught.value.status == 503 and "no live decode node" in caught.value.message


def test_a_node_that_failed_before_the_last_one_is_tried_again_when_none_is_left():
    """d:1 cuts the stream (its host stalled), d:2 then dies: the request goes back to d:1, not
    to a 503, and the client sees one stream."""
    pipeline = FakePipeline()
    pipeline.nodes["d:1"].failures = [UNAVAILABLE]
    pipeline.nodes["d:2"].failures = [UNAVAILABLE]
    events = pipeline.generate()
    assert [e.token_ids for e in events] == [[100], [101]]
    assert [address for address, _ in pipeline.called("Decode")] == ["d:1", "d:2", "d:1"]


def test_readmitting_keeps_out_the_node_that_failed_last_and_nodes_that_were_busy():
    attempts = Attempts(max_failures=4)
    attempts.record(NodeFailure("decode", "d:1", "cut"))
    attempts.record(NodeFailure("decode", "d:2", "dead"))
    attempts.record_busy(NodeOverloaded("decode", "d:3", "busy"))
    attempts.record(NodeFailure("prefill", "p:1", "dead"))
    assert attempts.readmit("decode") and attempts.excluded == {"d:2", "d:3", "p:1"}
    assert not attempts.readmit("decode")  # nothing more to readmit: the 503 follows
    assert not attempts.readmit("encoder")


def test_retries_are_bounded():
    pipeline = FakePipeline(max_failures=1)
    pipeline.nodes["p:1"].failures = [UNAVAILABLE]
    pipeline.nodes["p:2"].failures = [UNAVAILABLE]
    with pytest.raises(GatewayError) as caught:
        pipeline.generate()
    assert caught.value.status == 503 and "gave up after 2 node failures" in caught.value.message


def test_the_watchdog_cancels_calls_to_nodes_that_left_the_cluster():
    from services.gateway.pipeline.call_watchdog import CallWatchdog
    from shared.index.memory_backend import InProcessIndex
    from shared.index.types import NodeInfo

    index = InProcessIndex()
    index.register_node(NodeInfo("decode@d:1", "decode", "d:1"), ttl_s=60)
    epoch = index.register_node(NodeInfo("decode@d:2", "decode", "d:2"), ttl_s=60)
    membership = Membership(LocalReader(index))
    asyncio.run(membership.refresh())
    watchdog = CallWatchdog(membership, interval_s=3600)
    alive, hung = Pending(None), Pending(None)

    async def watch() -> None:
        with watchdog.watching(alive, "d:1") as alive_watch, watchdog.watching(hung, "d:2") as hung_watch:
            watchdog.check()
            assert not alive.cancelled and not hung.cancelled
            index.deregister_node("decode@d:2", epoch)  # its heartbeat lapsed, as a hung node's does
            await membership.refresh()
            watchdog.check()
            assert hung.cancelled and not alive.cancelled
            assert hung_watch.fired_alone() and not alive_watch.fired

    asyncio.run(watch())


def test_every_call_gets_what_is_left_of_one_request_deadline():
    clock, timeouts = FakeClock(), []
    pipeline = FakePipeline(timeout_s=30.0, clock=clock)
    call = pipeline.stages.call

    async def timed(role, address, method, request, deadline, **kwargs):
        timeouts.append(pipeline.stages.remaining_s(deadline))
        clock.now += 4.0  # each stage takes 4 s
        return await call(role, address, method, request, deadline, **kwargs)

    pipeline.stages.call = timed
    pipeline.generate()
    assert timeouts == [30.0, 26.0]  # preprocess, then prefill: one budget, not 30 s per stage


def test_a_request_out_of_time_gets_a_504_and_is_not_retried():
    clock = FakeClock()
    pipeline = FakePipeline(timeout_s=30.0, clock=clock)
    prefill = pipeline.nodes["p:1"]

    def expire(method, request):
        clock.now += 31.0  # the call ran past the request's deadline
        raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")

    prefill._record = expire
    with pytest.raises(GatewayError) as caught:
        pipeline.generate()
    assert caught.value.status == 504 and caught.value.code == "deadline_exceeded"
    assert pipeline.num_retries == 0 and pipeline.called("Prefill") == []


def busy(role: str, address: str | None = None) -> FakeRpcError:
    """A node's refusal at its limit of requests (services/transport/node_admission.py)."""
    return failed_with(NodeError(ErrorKind.OVERLOADED, "at its limit", NodeRef(role, address)))


def test_a_busy_decode_node_is_skipped_for_the_request_without_quarantine_or_a_failure():
    pipeline = FakePipeline()
    pipeline.nodes["d:1"].failures = [busy("decode")]
    events = pipeline.generate()
    assert [e.token_ids for e in events] == [[100], [101]]
    assert [a for a, _ in pipeline.called("Decode")] == ["d:1", "d:2"]
    assert [n.info.grpc_address for n in pipeline.membership.nodes("decode")] == ["d:1", "d:2"]  # not quarantined
    assert pipeline.num_retries == 0 and pipeline.num_busy_refusals == 1


def test_when_every_node_of_a_role_is_busy_the_request_gets_a_429_to_retry_later():
    pipeline = FakePipeline()
    pipeline.nodes["p:1"].failures = [busy("prefill")]
    pipeline.nodes["p:2"].failures = [busy("prefill")]
    with pytest.raises(GatewayError) as caught:
        pipeline.generate()
    error = caught.value
    assert error.status == 429 and error.headers == {"Retry-After": "1"}
    assert error.to_json()["error"]["code"] == "rate_limit_exceeded" and error.error_type == "requests"
    assert "every prefill node is at its limit" in error.message
    assert pipeline.num_retries == 0


def test_a_busy_encoder_relayed_by_the_prefill_node_is_skipped():
    pipeline = FakePipeline()
    pipeline.nodes["p:1"].failures = [busy("encoder", "e:1")]
    pipeline.generate()
    assert [(a, r.encoder_address) for a, r in pipeline.called("Prefill")] == [("p:1", "e:1"), ("p:2", "e:2")]
    assert pipeline.membership.nodes("encoder")[0].info.grpc_address == "e:1"  # not quarantined


def test_resource_exhausted_without_an_overloaded_error_is_not_taken_for_a_busy_node():
    pipeline = FakePipeline()
    pipeline.nodes["p:1"].failures = [FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "message larger than max")]
    with pytest.raises(GatewayError) as caught:
        pipeline.generate()
    assert caught.value.status == 500 and len(pipeline.called("Prefill")) == 1


def test_a_prompt_plus_max_tokens_over_the_context_gets_a_400_naming_both_before_any_prefill():
    pipeline = FakePipeline(max_model_len=10)
    assert [e.token_ids for e in pipeline.generate(max_tokens=7)] == [[100], [101]]  # 3 + 7 fits exactly
    with pytest.raises(GatewayError) as caught:
        pipeline.generate(max_tokens=8)
    error = caught.value
    assert error.status == 400 and error.code == "context_length_exceeded" and error.param == "prompt"
    assert "maximum context length is 10 tokens" in error.message and "11 tokens (3 in the prompt, 8 in the completion)" in error.message
    assert len(pipeline.called("Prefill")) == 1  # only the request that fit


class Hanging:
    """A prefill call that runs until cancelled (a long prompt, or a hung node); as a grpc.aio
    call does, it cancels itself when the task awaiting it is cancelled, and a cancelled call
    raises asyncio.CancelledError."""

    def __init__(self) -> None:
        self.started, self.cancelled = asyncio.Event(), asyncio.Event()

    def __await__(self):
        return self._wait().__await__()

    async def _wait(self):
        self.started.set()
        try:
            await asyncio.wait_for(self.cancelled.wait(), 10)
        except asyncio.CancelledError:
            self.cancel()
            raise
        raise asyncio.CancelledError()

    def cancel(self) -> bool:
        self.cancelled.set()
        return True


def _hang_prefill(pipeline: FakePipeline, address: str) -> Hanging:
    hanging = Hanging()
    pipeline.nodes[address].hanging.append(hanging)
    return hanging


def test_a_client_that_leaves_mid_prefill_cancels_the_call_and_nothing_is_retried():
    pipeline = FakePipeline()
    hanging = _hang_prefill(pipeline, "p:1")

    async def leave_mid_prefill() -> None:
        task = asyncio.create_task(pipeline.collect(SamplingParams(max_tokens=8)))
        await asyncio.wait_for(hanging.started.wait(), 5)
        task.cancel()  # what the HTTP server does when its client disconnects
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(leave_mid_prefill())
    assert hanging.cancelled.is_set()
    assert len(pipeline.called("Prefill")) == 1 and pipeline.called("Decode") == []
    assert pipeline.num_retries == 0 and pipeline.membership.nodes("prefill")[0].info.grpc_address == "p:1"


def test_a_prefill_call_the_watchdog_cancels_is_that_nodes_failure_and_retried():
    index = InProcessIndex()
    epochs = {}
    for role, addresses in NODES.items():
        for address in addresses:
            epochs[address] = index.register_node(NodeInfo(f"{role}@{address}", role, address, f"tcp://{address}"), ttl_s=60)
    membership = Membership(LocalReader(index))
    asyncio.run(membership.refresh())
    pipeline = FakePipeline(Router(membership, policy=make_policy("round_robin")))
    pipeline.watchdog.interval_s = 0.05
    hanging = _hang_prefill(pipeline, "p:1")

    async def lose_the_prefill_node() -> list:
        task = asyncio.create_task(pipeline.collect(SamplingParams(max_tokens=8)))
        await asyncio.wait_for(hanging.started.wait(), 5)
        index.deregister_node("prefill@p:1", epochs["p:1"])  # its heartbeat lapsed, as a hung node's does
        await membership.refresh()
        return await asyncio.wait_for(task, 5)

    assert [e.token_ids for e in asyncio.run(lose_the_prefill_node())] == [[100], [101]]
    assert [a for a, _ in pipeline.called("Prefill")] == ["p:1", "p:2"] and pipeline.num_retries == 1
    assert hanging.cancelled.is_set() and pipeline.watchdog.num_cancelled == 1


IMAGE_ITEM = pb.MmItem(mm_hash="img", offset=1, length=4, grid_thw=[1, 4, 4])


def pipeline_encoding_on_prefill() -> FakePipeline:
    """A cluster whose prefill nodes hold a vision tower, routed with encode_dispatch="prefill"."""
    index = InProcessIndex()
    for role, addresses in NODES.items():
        for address in addresses:
            info = NodeInfo(f"{role}@{address}", role, address, f"tcp://{address}", can_encode=role == "prefill")
            index.register_node(info, ttl_s=60)
    membership = Membership(LocalReader(index))
    asyncio.run(membership.refresh())
    pipeline = FakePipeline(Router(membership, policy=make_policy("round_robin"), index=LocalReader(index), encode_dispatch="prefill"))
    for address in NODES["preprocess"]:
        pipeline.nodes[address].mm_items = [IMAGE_ITEM]
    return pipeline


def test_images_a_prefill_node_encodes_have_their_pixels_pushed_to_it_per_attempt():
    pipeline = pipeline_encoding_on_prefill()
    pipeline.generate()
    [(_, push)] = pipeline.called("PushPixels")
    [(prefill_address, prefill)] = pipeline.called("Prefill")
    assert push.target_id == prefill_address and push.target_data_address == f"tcp://{prefill_address}"
    assert push.key_prefix.startswith("px/") and push.force and list(push.mm_hashes) == ["img"]
    assert list(prefill.local_encode_mm_hashes) == ["img"] and prefill.local_pixels_key_prefix == push.key_prefix


def test_pixels_a_prefill_node_reports_missing_are_pushed_to_it_again():
    pipeline = pipeline_encoding_on_prefill()
    missing = failed_with(NodeError(ErrorKind.MISSING_PIXELS, "pixels never arrived", missing_mm_hashes=(MmHash("img"),)))
    for address in NODES["prefill"]:
        pipeline.nodes[address].failures = [missing]
    assert [e.token_ids for e in pipeline.generate()] == [[100], [101]]
    pushes = [request for _, request in pipeline.called("PushPixels")]
    assert len(pushes) == 2 and len({(p.target_id, p.key_prefix) for p in pushes}) == 1
    assert pipeline.num_retries == 0  # resent within the attempt, not failed over


def test_images_without_a_prefill_node_that_encodes_go_to_the_encoder():
    pipeline = FakePipeline()
    for address in NODES["preprocess"]:
        pipeline.nodes[address].mm_items = [IMAGE_ITEM]
    pipeline.generate()
    [(_, push)] = pipeline.called("PushPixels")
    [(_, prefill)] = pipeline.called("Prefill")
    assert push.target_id == prefill.encoder_address and push.key_prefix == "" and not push.force
    assert list(prefill.local_encode_mm_hashes) == []


def test_a_defaulted_max_tokens_shrinks_to_the_context_the_prompt_leaves():
    pipeline = FakePipeline(max_model_len=10)  # the fake prompt has 3 tokens: 7 left
    asyncio.run(pipeline.collect(SamplingParams(max_tokens=256, temperature=0.0), fit_max_tokens=True))
    [(_, prefill)] = pipeline.called("Prefill")
    [(_, decode)] = pipeline.called("Decode")
    assert prefill.sampling.max_tokens == decode.sampling.max_tokens == 7
    with pytest.raises(GatewayError) as caught:  # asked for explicitly: never shrunk
        asyncio.run(pipeline.collect(SamplingParams(max_tokens=256, temperature=0.0)))
    assert caught.value.status == 400 and "maximum context length is 10 tokens" in caught.value.message
