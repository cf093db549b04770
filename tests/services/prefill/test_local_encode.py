"""A prefill node that encodes an image itself (the router's adaptive dispatch): the pixels pushed
to its inbox are encoded by its own tower beside the engine (not inside an engine step), and the
first token equals transformers' greedy one; concurrent requests for one image encode it once.
The embeddings stay in its cache for later requests; pixels that never arrive are reported
missing (the gateway pushes them again); a node without a vision tower says so instead of
failing its engine step."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from protos.gen import pb, rpc
from services.engine.config import EngineConfig
from services.engine.sampling_params import SamplingParams
from services.engine.sampling_wire import sampling_to_pb
from services.prefill.node import PrefillNode
from services.prefill.server import PrefillServicer
from services.transport.internal_auth import InternalAuth
from services.transport.node_admission import NodeAdmission
from services.transport.node_error import ErrorKind, node_error_of
from services.transport.tensor_channel import TensorInbox, TensorSender
from tests.aio_server import serving
from tests.factories import chat_case, encode_image, make_image

IMAGE_TOKEN_ID = 151655


@pytest.fixture(scope="module")
def case():
    return chat_case(encode_image(make_image(64, 48, seed=7)), "What is in this picture?")


@pytest.fixture(scope="module")
def inputs(oracle, case):
    return oracle.process(oracle.chat_text(case.oracle_messages), case.images)


@pytest.fixture(scope="module")
def nodes(tiny_model):
    config = EngineConfig(max_num_batched_tokens=64)
    encoding = PrefillNode(tiny_model, config, data_bind="tcp://127.0.0.1:0", local_encode=True, embedding_wait_s=1.0)
    plain = PrefillNode(tiny_model, config, data_bind="tcp://127.0.0.1:0", embedding_wait_s=1.0)
    sink = TensorInbox("tcp://127.0.0.1:0")  # stands in for a decode node's inbox
    sender = TensorSender()
    yield encoding, plain, sink, sender
    for closable in (sender, sink, plain, encoding):
        closable.close()


def _item(inputs, mm_hash: str) -> pb.MmItem:
    token_ids = inputs.token_ids
    offset = token_ids.index(IMAGE_TOKEN_ID)
    length = token_ids.count(IMAGE_TOKEN_ID)
    return pb.MmItem(mm_hash=mm_hash, offset=offset, length=length, grid_thw=inputs.image_grid_thw[0].tolist())


def _request(request_id: str, inputs, sink: TensorInbox, mm_hash: str, *, local: bool) -> pb.PrefillRequest:
    return pb.PrefillRequest(
        request_id=request_id,
        prompt_token_ids=inputs.token_ids,
        mm_items=[_item(inputs, mm_hash)],
        decode_data_address=sink.address,
        sampling=sampling_to_pb(SamplingParams(max_tokens=1)),
        local_encode_mm_hashes=[mm_hash] if local else [],
        local_pixels_key_prefix=f"px/{request_id}/" if local else "",
    )


def _run(node: PrefillNode, scenario) -> None:
    servicer = PrefillServicer(node, InternalAuth(), NodeAdmission("prefill"))

    async def main() -> None:
        async with serving(lambda server: rpc.add_PrefillServicer_to_server(servicer, server)) as channel:
            await scenario(rpc.PrefillStub(channel))

    asyncio.run(main())


def test_a_prefill_node_encodes_pushed_pixels_itself_and_matches_the_oracle(nodes, inputs, oracle):
    encoding, _, sink, sender = nodes
    expected = oracle.generate(inputs, 1).token_ids[0]

    async def scenario(stub) -> None:
        sender.send(
            encoding.data_address,
            "px/local-1/img-a",
            {"pixel_values": inputs.pixel_values},
            {"grid_thw": inputs.image_grid_thw[0].tolist()},
        )
        first = await stub.Prefill(_request("local-1", inputs, sink, "img-a", local=True), timeout=120)
        assert first.first_token_id == expected
        # The embeddings stay cached here: a later request needs neither pixels nor an encoder.
        again = await stub.Prefill(_request("local-2", inputs, sink, "img-a", local=False), timeout=120)
        assert again.first_token_id == expected

    _run(encoding, scenario)
    assert encoding.metrics.embeddings.num_local_encodes.value == 1.0
    assert encoding.engine.runner.vision.num_items_encoded == 1
    assert sink.wait("local-1", 10) is not None and sink.wait("local-2", 10) is not None  # KV shipped both times


def test_concurrent_requests_for_one_image_encode_it_once_and_both_match_the_oracle(nodes, inputs, oracle):
    encoding, _, sink, sender = nodes
    expected = oracle.generate(inputs, 1).token_ids[0]
    encoded_before = encoding.engine.runner.vision.num_items_encoded

    async def scenario(stub) -> None:
        for rid in ("twin-1", "twin-2"):
            sender.send(
                encoding.data_address,
                f"px/{rid}/img-twin",
                {"pixel_values": inputs.pixel_values},
                {"grid_thw": inputs.image_grid_thw[0].tolist()},
            )
        firsts = await asyncio.gather(
            *(stub.Prefill(_request(rid, inputs, sink, "img-twin", local=True), timeout=120) for rid in ("twin-1", "twin-2"))
        )
        assert [f.first_token_id for f in firsts] == [expected, expected]

    _run(encoding, scenario)
    assert encoding.engine.runner.vision.num_items_encoded == encoded_before + 1


def test_pixels_that_never_arrive_are_reported_missing(nodes, inputs):
    encoding, _, sink, _ = nodes

    async def scenario(stub) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Prefill(_request("lost-1", inputs, sink, "img-lost", local=True), timeout=60)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        error = node_error_of(caught.value)
        assert error.kind is ErrorKind.MISSING_PIXELS and error.missing_mm_hashes == ("img-lost",)

    _run(encoding, scenario)


def test_a_node_without_a_vision_tower_refuses_to_encode_with_a_clear_error(nodes, inputs):
    _, plain, sink, sender = nodes
    assert not plain.can_encode

    async def scenario(stub) -> None:
        sender.send(
            plain.data_address, "px/plain-1/img-b", {"pixel_values": inputs.pixel_values}, {"grid_thw": inputs.image_grid_thw[0].tolist()}
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Prefill(_request("plain-1", inputs, sink, "img-b", local=True), timeout=60)
        assert caught.value.code() == grpc.StatusCode.INTERNAL and "no vision tower" in caught.value.details()
        assert node_error_of(caught.value).kind is ErrorKind.REQUEST_FAILED

    _run(plain, scenario)


def test_pixels_that_do_not_fit_their_image_are_refused_before_the_engine(nodes, inputs):
    encoding, _, sink, sender = nodes
    wrong = inputs.pixel_values[:-4]  # four patches short of its grid

    async def scenario(stub) -> None:
        sender.send(encoding.data_address, "px/wrong-1/img-c", {"pixel_values": wrong}, {"grid_thw": inputs.image_grid_thw[0].tolist()})
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Prefill(_request("wrong-1", inputs, sink, "img-c", local=True), timeout=60)
        assert caught.value.code() == grpc.StatusCode.INTERNAL and "do not match its grid" in caught.value.details()

    _run(encoding, scenario)


def test_a_local_encode_runs_the_requests_adapter_on_the_tower(tiny_model, inputs, tmp_path):
    """A LoRA adapter that changes the tower (made by peft on the tower's layers too): the prefill
    node's own tower runs it for the request's image, and the first token equals transformers'
    with the adapter merged."""
    from services.models.lora.files import adapter_fingerprint
    from services.transport.convert import lora_from_pb
    from tests.oracle import ReferenceOracle
    from tests.peft_adapters import TOWER_TARGETS, make_adapter, merged_model

    path = make_adapter(tiny_model.path, tmp_path / "t", seed=6, targets=TOWER_TARGETS)
    oracle = ReferenceOracle(tiny_model.path, load_model=False)
    oracle.model = merged_model(tiny_model.path, path)
    expected = oracle.generate(inputs, 1).token_ids[0]
    config = EngineConfig(max_num_batched_tokens=64, enable_lora=True, lora_modules=(f"t={path}",))
    node = PrefillNode(tiny_model, config, data_bind="tcp://127.0.0.1:0", local_encode=True, embedding_wait_s=1.0)
    sink, sender = TensorInbox("tcp://127.0.0.1:0"), TensorSender()
    request = _request("tower-1", inputs, sink, "img-t", local=True)
    request.lora.CopyFrom(pb.LoraRef(name="t", fingerprint=adapter_fingerprint(path), tower=True))

    async def scenario(stub) -> None:
        grid = {"grid_thw": inputs.image_grid_thw[0].tolist()}
        sender.send(node.data_address, "px/tower-1/img-t", {"pixel_values": inputs.pixel_values}, grid)
        assert (await stub.Prefill(request, timeout=120)).first_token_id == expected

    try:
        _run(node, scenario)
        assert node.metrics.embeddings.num_local_encodes.value == 1.0
        # The embeddings it encoded are the adapter's tower's, not the base tower's.
        runner, ref = node.engine.runner, lora_from_pb(request)
        held = node.loop.call(lambda engine: engine.runner.encoder_outputs["img-t"]).result(10)
        pixels, grid = [inputs.pixel_values], [tuple(inputs.image_grid_thw[0].tolist())]
        with runner.tower_loras.running(node.loras.resolve(ref)):
            [adapted] = runner.vision.encode(pixels, grid)
        [base] = runner.vision.encode(pixels, grid)
        torch.testing.assert_close(held, adapted, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(held, base, atol=1e-3)
    finally:
        for closable in (sender, sink, node):
            closable.close()
