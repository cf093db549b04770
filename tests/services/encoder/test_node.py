"""The encoder node runs a batch of calls as one vision-tower pass while it fits the pass bound
(past it, in several passes): each call gets its own images' embeddings (as if encoded alone),
an image two calls share is encoded once, and an input that breaks the tower fails only the call
that brought it."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.encoder.node import EncodeItem, EncoderNode
from services.preprocess.config import PreprocessConfig
from services.preprocess.node import PreprocessNode
from services.transport.tensor_channel import TensorInbox, TensorSender
from tests.factories import chat_case, encode_image, make_image


@pytest.fixture()
def setup(tiny_model):
    encoder = EncoderNode(tiny_model, data_bind="tcp://127.0.0.1:0", cache_tokens=4096, pixel_wait_s=1.0)
    preprocess = PreprocessNode(tiny_model, PreprocessConfig())
    sinks = [TensorInbox("tcp://127.0.0.1:0") for _ in range(2)]  # stand in for two prefill nodes
    yield encoder, preprocess, sinks
    for closable in (*sinks, preprocess, encoder):
        closable.close()


def push(preprocess: PreprocessNode, encoder: EncoderNode, seed: int, size: tuple[int, int]) -> tuple[EncodeItem, torch.Tensor]:
    """An image's pixels pushed to the encoder, as the preprocess node does; and those pixels."""
    prompt = chat_case(encode_image(make_image(*size, seed=seed)), "What is it?").prompt
    item = preprocess.preprocess(prompt).mm_items[0]
    preprocess.push_pixels([item.mm_hash], target_id="e", target_address=encoder.data_address, force=False)
    return EncodeItem(item.mm_hash, item.placeholder.length, item.image.grid_thw), item.image.pixel_values


def test_a_batch_is_one_pass_and_each_call_gets_its_own_embeddings(setup):
    encoder, preprocess, sinks = setup
    (a, pixels_a), (b, pixels_b) = push(preprocess, encoder, 1, (56, 84)), push(preprocess, encoder, 2, (84, 56))
    results = asyncio.run(encoder.encode_batch([([a], sinks[0].address), ([b, a], sinks[1].address)]))
    assert [(r.num_encoded, r.num_cache_hits, r.missing_pixels) for r in results] == [(1, 0, []), (2, 0, [])]
    assert encoder.num_batches == 1 and encoder.vision.num_items_encoded == 2  # "a" once, for both calls
    first_a = sinks[0].wait(a.mm_hash, 5).tensors["embeds"]
    assert torch.equal(first_a, sinks[1].wait(a.mm_hash, 5).tensors["embeds"])
    batched_b = sinks[1].wait(b.mm_hash, 5).tensors["embeds"]
    # The same images encoded one at a time: equal within float32 noise. The noise depends on the
    # CPU's kernels (the batch's longer rows are summed in another order): up to 2e-5 seen on an
    # AMD EPYC, on values of about 1, so 1e-4 rather than 1e-5.
    [alone_a] = encoder.compute.run(encoder.vision.encode, [pixels_a], [a.grid_thw])
    [alone_b] = encoder.compute.run(encoder.vision.encode, [pixels_b], [b.grid_thw])
    torch.testing.assert_close(first_a, alone_a, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(batched_b, alone_b, atol=1e-4, rtol=1e-4)


def test_pixels_that_break_the_tower_fail_only_their_own_call(setup):
    encoder, preprocess, sinks = setup
    good, _ = push(preprocess, encoder, 3, (56, 56))
    bad = EncodeItem("bad-image", 4, (1, 4, 4))
    sender = TensorSender()
    try:
        sender.send(encoder.data_address, "bad-image", {"pixel_values": torch.zeros(5, 3)}, {"grid_thw": [1, 4, 4]})
        results = asyncio.run(encoder.encode_batch([([good], sinks[0].address), ([bad], sinks[1].address)]))
    finally:
        sender.close()
    assert results[0].num_encoded == 1 and isinstance(results[1], Exception)
    assert sinks[0].wait(good.mm_hash, 5) is not None
    assert encoder.vision.num_items_encoded == 1  # the shared pass failed; the good image then ran alone


def test_a_call_larger_than_one_pass_is_encoded_in_passes_each_within_the_bound(tiny_model, setup):
    _, preprocess, sinks = setup
    encoder = EncoderNode(tiny_model, data_bind="tcp://127.0.0.1:0", cache_tokens=4096, pixel_wait_s=1.0, max_pass_rows=10)
    try:
        items = [push(preprocess, encoder, 10 + i, (56, 84))[0] for i in range(3)]  # 6 rows each
        [result] = asyncio.run(encoder.encode_batch([(items, sinks[0].address)]))
        assert result.num_encoded == 3 and encoder.num_batches == 3  # 6 + 6 > 10: a pass each
        assert all(sinks[0].wait(item.mm_hash, 5).tensors["embeds"].shape[0] == item.num_embeds for item in items)
    finally:
        encoder.close()


def test_the_tower_rate_is_measured_after_start_up_and_counts_as_no_traffic(setup):
    encoder, _, _ = setup
    encoder.calibrated.result(timeout=60)  # measured on the compute thread, after start-up
    assert encoder.seconds_per_token > 0
    assert encoder.metrics.tower_seconds_per_token.value == encoder.seconds_per_token
    assert encoder.metrics.num_items_encoded.value == 0 and encoder.metrics.tower_seconds.value == 0


def test_a_tower_adapters_items_run_in_a_pass_of_their_own_with_its_updates(tiny_model, setup, tmp_path):
    """One batch, one call with a LoRA adapter on the tower and one without: two passes; the
    adapter's images (mm_hashes of their own, pixels found through the plain ones) get its
    tower's embeddings, the others the base tower's."""
    from services.engine.config import EngineConfig
    from shared.types import LoraRef
    from tests.peft_adapters import TOWER_TARGETS, make_adapter

    _, preprocess, sinks = setup
    path = make_adapter(tiny_model.path, tmp_path / "t", seed=5, targets=TOWER_TARGETS)
    lora = EngineConfig(enable_lora=True, lora_modules=(f"t={path}",))
    encoder = EncoderNode(tiny_model, data_bind="tcp://127.0.0.1:0", cache_tokens=4096, pixel_wait_s=1.0, lora=lora, calibrate=False)
    try:
        registry = encoder.adapters.registry
        adapter = registry.resolve(LoraRef("t", registry.fingerprint("t"), tower=True))
        prompt = chat_case(encode_image(make_image(56, 84, seed=31)), "What is it?").prompt
        plain, adapted = preprocess.preprocess(prompt).mm_items[0], preprocess.preprocess(prompt, lora=adapter.ref).mm_items[0]
        assert adapted.mm_hash != plain.mm_hash
        preprocess.push_pixels([plain.mm_hash, adapted.mm_hash], target_id="e", target_address=encoder.data_address, force=False)
        items = [EncodeItem(i.mm_hash, i.placeholder.length, i.image.grid_thw, a) for i, a in ((plain, None), (adapted, adapter))]
        results = asyncio.run(encoder.encode_batch([([items[0]], sinks[0].address), ([items[1]], sinks[1].address)]))
        assert [r.num_encoded for r in results] == [1, 1] and encoder.num_batches == 2
        base, own = sinks[0].wait(plain.mm_hash, 5).tensors["embeds"], sinks[1].wait(adapted.mm_hash, 5).tensors["embeds"]
        with encoder.tower_loras.running(adapter):
            [expected] = encoder.compute.run(encoder.vision.encode, [plain.image.pixel_values], [plain.image.grid_thw])
        torch.testing.assert_close(own, expected, atol=1e-4, rtol=1e-4)
        assert not torch.allclose(own, base, atol=1e-3)
    finally:
        encoder.close()
