"""Every attention backend must equal dense causal attention on the same packed batch.
flashinfer runs only where CUDA is present."""

from __future__ import annotations

import pytest
import torch

from kernels import torch_backend
from kernels.attention import AttentionBatch
from kernels.selector import available_backends, create_backend


def _dense_reference(qs, ks, vs, scale, *, spans=None, window=None):
    """Per request: allowed(q, k) = (k <= q or q and k in one span) and (no window or k > q - window)."""
    outs = []
    for i, (q, k, v) in enumerate(zip(qs, ks, vs)):
        n, ctx = q.shape[0], k.shape[0]
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        scores = torch.einsum("nhd,chd->hnc", q, k) * scale
        q_pos, k_pos = torch.arange(ctx - n, ctx)[:, None], torch.arange(ctx)[None, :]
        mask = k_pos <= q_pos
        for lo, hi in spans[i] if spans else []:
            mask |= (q_pos >= lo) & (q_pos < hi) & (k_pos >= lo) & (k_pos < hi) & (k_pos < ctx)
        if window is not None:
            mask &= k_pos > q_pos - window
        scores = scores.masked_fill(~mask, float("-inf"))
        outs.append(torch.einsum("hnc,chd->nhd", scores.softmax(-1), v))
    return torch.cat(outs)


# (context length, new tokens): a prefill, a chunk after a cached prefix, two decodes.
MIXED = [(9, 9), (13, 5), (7, 1), (16, 1)]


def _case(device, num_heads=4, num_kv_heads=2, head_dim=16, block_size=4, shapes=MIXED):
    gen = torch.Generator().manual_seed(0)
    num_blocks = sum(-(-ctx // block_size) for ctx, _ in shapes) + 8
    k_cache = torch.zeros(num_blocks, block_size, num_kv_heads, head_dim)
    v_cache = torch.zeros_like(k_cache)
    free = list(torch.randperm(num_blocks, generator=gen).tolist())
    qs, ks, vs, tables, slots, qsl = [], [], [], [], [], [0]
    new_k, new_v = [], []
    for ctx, n in shapes:
        table = [free.pop() for _ in range(-(-ctx // block_size))]
        k = torch.randn(ctx, num_kv_heads, head_dim, generator=gen)
        v = torch.randn(ctx, num_kv_heads, head_dim, generator=gen)
        for t in range(ctx - n):  # the cached prefix is already in the pages
            k_cache[table[t // block_size], t % block_size] = k[t]
            v_cache[table[t // block_size], t % block_size] = v[t]
        slots.extend(table[t // block_size] * block_size + t % block_size for t in range(ctx - n, ctx))
        qs.append(torch.randn(n, num_heads, head_dim, generator=gen))
        ks.append(k)
        vs.append(v)
        new_k.append(k[ctx - n :])
        new_v.append(v[ctx - n :])
        tables.append(table)
        qsl.append(qsl[-1] + n)
    batch = AttentionBatch(qsl, [c for c, _ in shapes], tables, torch.tensor(slots), block_size)
    to = lambda t: t.to(device)  # noqa: E731
    return (to(torch.cat(qs)), to(k_cache), to(v_cache), to(torch.cat(new_k)), to(torch.cat(new_v)), batch, qs, ks, vs)


@pytest.mark.parametrize("name", ["torch", "flashinfer"])
def test_backend_matches_dense_attention(name):
    if name not in available_backends():
        pytest.skip(f"{name} backend needs CUDA and its package; not available here")
    device = torch.device("cuda" if name == "flashinfer" else "cpu")
    q, k_cache, v_cache, k_new, v_new, batch, qs, ks, vs = _case(device)
    batch.slot_mapping = batch.slot_mapping.to(device)
    backend = create_backend(name, device)
    backend.prepare(batch, num_heads=4, num_kv_heads=2, head_dim=16)
    backend.write_kv(k_cache, v_cache, k_new, v_new, batch)
    out = backend.attend(q, k_cache, v_cache, batch, scale=16**-0.5)
    expected = _dense_reference(qs, ks, vs, 16**-0.5)
    torch.testing.assert_close(out.cpu().float(), expected, atol=2e-3 if name == "flashinfer" else 1e-5, rtol=1e-3)


@pytest.mark.parametrize("max_group_keys", [65536, 24])
def test_torch_backend_batches_decodes_of_every_length(monkeypatch, max_group_keys):
    """Decode rows are attended in padded groups (cut where padding would double the keys, or at
    MAX_GROUP_KEYS): short and long contexts side by side, in any order, beside a prefill, must
    equal dense attention row by row."""
    monkeypatch.setattr(torch_backend, "MAX_GROUP_KEYS", max_group_keys)
    shapes = [(1, 1), (23, 1), (5, 5), (2, 1), (3, 1), (17, 1), (4, 1), (40, 1), (9, 1), (6, 2), (12, 1)]
    q, k_cache, v_cache, k_new, v_new, batch, qs, ks, vs = _case(torch.device("cpu"), shapes=shapes)
    backend = create_backend("torch", torch.device("cpu"))
    backend.prepare(batch, num_heads=4, num_kv_heads=2, head_dim=16)
    assert len(batch.plan.decode_groups) > 1  # the lengths force several groups
    backend.write_kv(k_cache, v_cache, k_new, v_new, batch)
    out = backend.attend(q, k_cache, v_cache, batch, scale=16**-0.5)
    torch.testing.assert_close(out, _dense_reference(qs, ks, vs, 16**-0.5), atol=1e-5, rtol=1e-3)


def test_factory_chooses_in_one_place():
    assert create_backend("auto", torch.device("cpu")).name == "torch"
    with pytest.raises(ValueError, match="unknown attention backend"):
        create_backend("triton", torch.device("cpu"))
    if "flashinfer" not in available_backends():
        with pytest.raises(ValueError, match="needs CUDA"):
            create_backend("flashinfer", torch.device("cpu"))


# Spans lie whole inside a step's new tokens (the scheduler never splits one); the decode rows
# carry spans that ended earlier, which must change nothing for them.
SPANS = [[(2, 6)], [(9, 13)], [(1, 4)], [(3, 8)]]


@pytest.mark.parametrize("window", [None, 3, 6], ids=["no_window", "window_3", "window_6"])
@pytest.mark.parametrize("with_spans", [False, True], ids=["causal", "image_spans"])
def test_torch_backend_matches_dense_attention_with_image_spans_and_sliding_windows(window, with_spans):
    q, k_cache, v_cache, new_k, new_v, batch, qs, ks, vs = _case(torch.device("cpu"))
    batch.bidirectional_spans = SPANS if with_spans else None
    backend = create_backend("torch", torch.device("cpu"))
    backend.prepare(batch, num_heads=4, num_kv_heads=2, head_dim=16)
    backend.write_kv(k_cache, v_cache, new_k, new_v, batch)
    for _ in range(2):  # a second layer of the same step reuses the plan and its windowed masks
        out = backend.attend(q, k_cache, v_cache, batch, 0.25, sliding_window=window)
        expected = _dense_reference(qs, ks, vs, 0.25, spans=SPANS if with_spans else None, window=window)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_an_image_span_makes_earlier_tokens_see_later_ones():
    q, k_cache, v_cache, new_k, new_v, batch, qs, ks, vs = _case(torch.device("cpu"), shapes=[(9, 9)])
    backend = create_backend("torch", torch.device("cpu"))
    outputs = []
    for spans in (None, [[(2, 6)]]):
        batch.bidirectional_spans = spans
        backend.prepare(batch, num_heads=4, num_kv_heads=2, head_dim=16)
        backend.write_kv(k_cache, v_cache, new_k, new_v, batch)
        outputs.append(backend.attend(q, k_cache, v_cache, batch, 0.25))
    causal, spanned = outputs
    torch.testing.assert_close(causal[:2], spanned[:2])  # before the span: unchanged
    assert not torch.allclose(causal[2:5], spanned[2:5])  # inside: now sees the span's later tokens
    torch.testing.assert_close(causal[6:], spanned[6:])  # after it: causal saw the whole span anyway


def test_a_model_that_needs_masks_gets_the_torch_backend():
    assert create_backend("auto", torch.device("cpu"), needs_masks=True).name == "torch"
    with pytest.raises(ValueError, match="flashinfer"):
        create_backend("flashinfer", torch.device("cpu"), needs_masks=True)


@pytest.mark.parametrize("shapes", [[(40, 40)], [(40, 24)]], ids=["whole prompt", "after a cached prefix"])
def test_torch_backend_prefills_on_the_cpu_flash_kernel(shapes):
    """3-D inputs send SDPA to its math path, which materializes every score (half a prefill's
    time at 1,400 tokens); the prefill must reach the flash kernel."""
    q, k_cache, v_cache, k_new, v_new, batch, qs, ks, vs = _case(torch.device("cpu"), shapes=shapes)
    backend = create_backend("torch", torch.device("cpu"))
    backend.prepare(batch, num_heads=4, num_kv_heads=2, head_dim=16)
    backend.write_kv(k_cache, v_cache, k_new, v_new, batch)
    with torch.profiler.profile() as profile:
        out = backend.attend(q, k_cache, v_cache, batch, scale=16**-0.5)
    kernels = {event.key for event in profile.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in kernels
    assert "aten::_scaled_dot_product_attention_math" not in kernels
    torch.testing.assert_close(out, _dense_reference(qs, ks, vs, 16**-0.5), atol=1e-5, rtol=1e-3)
