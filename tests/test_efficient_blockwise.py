"""mha_lib.efficient.blockwise_attention: the online softmax tile by tile, with tile skipping.

Against PyTorch's own F.scaled_dot_product_attention (is_causal=True, and the masks), over
shapes that do not divide into tiles, Lq != Lk, batches and heads, three dtypes; the tile
counts (36 of 64 for a causal L of 1,024 in tiles of 128); the work actually done, counted by
PyTorch's FLOP counter; and FlexAttention's block mask, which must find the same tiles.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from conftest import TOLERANCES, randn
from mha_lib import scaled_dot_product_attention
from mha_lib.bench.steps import make_mask
from mha_lib.efficient import TileCounts, blockwise_attention

# (B, H, Lq, Lk, block): whole tiles, cut tiles, Lq < Lk, Lq > Lk, one tile, one token
SHAPES = [(1, 1, 256, 256, 64), (2, 3, 200, 200, 64), (2, 3, 70, 130, 32), (1, 2, 130, 70, 32),
          (3, 2, 40, 40, 128), (2, 1, 1, 9, 4)]
DTYPES = [torch.float32, torch.float64, torch.bfloat16]


@pytest.fixture(autouse=True)
def one_thread():
    """The tiles are small: on a shared 2-core machine two threads per small op wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def qkv(B, H, Lq, Lk, dtype, d_k=16, d_v=8):
    return randn(B, H, Lq, d_k, dtype=dtype), randn(B, H, Lk, d_k, dtype=dtype), randn(B, H, Lk, d_v, dtype=dtype)


def halves(H: int, L: int) -> torch.Tensor:
    """Chapter 12's mask, (H, L, L): even heads see keys [0, L//2), odd heads keys [L//2, L)."""
    return make_mask("halves", L, H)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("skip", [True, False])
def test_causal_equals_pytorch_is_causal(shape, dtype, skip):
    B, H, Lq, Lk, block = shape
    q, k, v = qkv(B, H, Lq, Lk, dtype)
    out, tiles = blockwise_attention(q, k, v, causal=True, block=block, skip=skip)
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True).to(dtype)
    assert out.shape == (B, H, Lq, 8) and out.dtype == dtype
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])
    assert tiles.computed + tiles.skipped == B * H * -(-Lq // block) * -(-Lk // block)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("L, block", [(256, 64), (200, 64), (9, 4)])
def test_halves_mask_equals_pytorch(L, block, dtype):
    q, k, v = qkv(2, 4, L, L, dtype)
    mask = halves(4, L)  # (H, L, L)
    out, tiles = blockwise_attention(q, k, v, mask, block=block)
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask).to(dtype)
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])
    assert 0 < tiles.computed < tiles.computed + tiles.skipped


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_other_masks_and_broadcasting_equal_pytorch(dtype):
    """A padding mask (B, 1, 1, Lk), a float bias with -inf (ALiBi-like, per head), a causal mask
    given twice (mask and causal=True), and one key/value head shared by every query head."""
    B, H, L = 3, 2, 75
    q, k, v = qkv(B, H, L, L, dtype)
    keep = torch.arange(L)[None, :] < torch.tensor([L, 40, 3])[:, None]  # (B, Lk)
    distance = (torch.arange(L)[:, None] - torch.arange(L)[None, :]).to(dtype)  # (L, L)
    bias = (-torch.tensor([0.5, 0.25], dtype=dtype)[:, None, None] * distance).masked_fill(distance < 0, float("-inf"))
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    for mask, flag in ((keep[:, None, None, :], False), (bias, False), (causal, True), (keep[:, None, None, :], True)):
        out, _ = blockwise_attention(q, k, v, mask, causal=flag, block=16)
        full = mask & causal if flag else mask
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=full)
        torch.testing.assert_close(out, expected, **TOLERANCES[dtype])
    shared_k, shared_v = k[:, :1], v[:, :1]  # (B, 1, L, d): one key/value head for both query heads
    out, tiles = blockwise_attention(q, shared_k, shared_v, causal=True, block=16)
    expected = F.scaled_dot_product_attention(q, shared_k.expand_as(k), shared_v.expand_as(v), is_causal=True)
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])
    assert tiles.computed == B * H * 15  # 5 query blocks of 16: 1 + 2 + 3 + 4 + 5 tiles each


def test_a_query_that_may_attend_to_nothing_gets_zeros():
    q, k, v = qkv(1, 2, 40, 40, torch.float64)
    mask = torch.ones(2, 40, 40, dtype=torch.bool)
    mask[0, 5] = False  # head 0, query 5: every key blocked
    mask[1, :, :20] = False  # head 1 sees keys 20-39 only: its first tile column is skipped
    for skip in (True, False):
        out, _ = blockwise_attention(q, k, v, mask, block=16, skip=skip)
        expected, _ = scaled_dot_product_attention(q, k, v, mask)
        assert torch.isfinite(out).all()
        assert torch.equal(out[0, 0, 5], torch.zeros(8, dtype=torch.float64))
        torch.testing.assert_close(out, expected, **TOLERANCES[torch.float64])


def test_gradients_equal_pytorch():
    q, k, v = (x.requires_grad_() for x in qkv(2, 2, 50, 50, torch.float64))
    out, _ = blockwise_attention(q, k, v, causal=True, block=16)
    grads = torch.autograd.grad(out.pow(2).sum(), (q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = torch.autograd.grad(ref.pow(2).sum(), (q, k, v))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, **TOLERANCES[torch.float64])


def test_tile_counts_at_1024_in_tiles_of_128():
    """Causal: the 8 diagonal tiles need the mask, the 28 below it none, the 28 above are skipped.
    Halves (2 heads): each head computes its half of the keys, 32 of 64 tiles, none masked."""
    q = torch.randn(1, 2, 1024, 16)
    _, causal = blockwise_attention(q, q, q, causal=True)
    _, causal_all = blockwise_attention(q, q, q, causal=True, skip=False)
    _, split = blockwise_attention(q, q, q, halves(2, 1024))
    _, split_all = blockwise_attention(q, q, q, halves(2, 1024), skip=False)
    assert causal == TileCounts(computed=2 * 36, skipped=2 * 28, masked=2 * 8)
    assert causal_all == TileCounts(computed=2 * 64, skipped=0, masked=2 * 36)
    assert split == TileCounts(computed=2 * 32, skipped=2 * 32, masked=0)
    assert split_all == TileCounts(computed=2 * 64, skipped=0, masked=2 * 32)
    assert causal.computed < causal_all.computed and split.computed < split_all.computed


def test_tile_counts_when_the_length_is_not_a_multiple_of_the_tile():
    q = torch.randn(1, 1, 200, 8)  # tiles of 64: 4 blocks, the last one of 8 rows
    _, tiles = blockwise_attention(q, q, q, causal=True, block=64)
    assert tiles == TileCounts(computed=10, skipped=6, masked=4)
    _, tiles = blockwise_attention(q[..., :70, :], q, q, causal=True, block=64)  # Lq 70 < Lk 200, top-left
    assert tiles == TileCounts(computed=3, skipped=5, masked=2)  # queries 64-69 reach key block 1; key block 0 is whole


def matmul_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("kind", ["causal", "halves"])
def test_skipping_does_fewer_multiplications(kind):
    """PyTorch's FLOP counter (every QKᵀ and P·V product): skipping does computed/total of the work."""
    q = torch.randn(1, 2, 512, 16)
    mask = halves(2, 512) if kind == "halves" else None
    run = lambda skip: blockwise_attention(q, q, q, mask, causal=kind == "causal", skip=skip)  # noqa: E731
    skipped, every = matmul_flops(lambda: run(True)), matmul_flops(lambda: run(False))
    _, tiles = run(True)
    assert every == 2 * 2 * (2 * 512 * 512 * 16)  # 2 heads, QKᵀ and P·V, 2 L² d each: no tile left out
    assert skipped * (tiles.computed + tiles.skipped) == every * tiles.computed
    assert skipped < every


def test_flex_attention_block_mask_finds_the_same_tiles():
    """FlexAttention's create_block_mask (no compiling): kv_num_blocks (tiles that need the mask) and
    full_kv_num_blocks (tiles that need none), summed, are the tiles blockwise_attention computes."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    L = 1024
    q = torch.randn(1, 2, L, 16)
    cases = {
        "causal": (lambda b, h, i, j: i >= j, None, True, None),
        "halves": (lambda b, h, i, j: (j < L // 2) == (h % 2 == 0), halves(2, L), False, 2),
    }
    for name, (mask_mod, mask, causal, heads) in cases.items():
        block_mask = flex.create_block_mask(mask_mod, B=None, H=heads, Q_LEN=L, KV_LEN=L, device="cpu")
        assert block_mask.BLOCK_SIZE == (128, 128)
        partial, full = int(block_mask.kv_num_blocks.sum()), int(block_mask.full_kv_num_blocks.sum())
        _, tiles = blockwise_attention(q[:, :heads or 1], q[:, :heads or 1], q[:, :heads or 1], mask, causal=causal)
        assert (partial + full, partial) == (tiles.computed, tiles.masked), name
    assert (partial, full) == (0, 64)  # halves: 32 full tiles per head


@pytest.mark.parametrize("kwargs, message", [
    (dict(block=0), "block"), (dict(block=2.5), "block"), (dict(causal="yes"), "causal"), (dict(skip=1), "skip"),
])
def test_bad_arguments_are_named(kwargs, message):
    q = torch.randn(1, 4, 8)
    with pytest.raises((TypeError, ValueError), match=message):
        blockwise_attention(q, q, q, **kwargs)


def test_bad_masks_are_refused_as_by_the_explicit_function():
    q = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="mask"):
        blockwise_attention(q, q, q, torch.ones(5, 4, dtype=torch.bool))
