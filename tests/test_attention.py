"""scaled_dot_product_attention against PyTorch's F.scaled_dot_product_attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import TOLERANCES, causal, randn, random_lengths, reference_weights
from mha_lib import causal_mask, padding_mask, scaled_dot_product_attention

# (batch dims, Lq, Lk, d_k, d_v): self-attention, cross-attention with d_v != d_k,
# no batch dims at all, and a single query.
SHAPES = [
    ((2, 3), 5, 5, 8, 8),
    ((2, 4), 3, 7, 8, 6),
    ((), 4, 6, 16, 4),
    ((3,), 1, 9, 5, 2),
]


def make_qkv(batch, Lq, Lk, d_k, d_v, dtype, device):
    return (randn(*batch, L, d, device=device, dtype=dtype) for L, d in ((Lq, d_k), (Lk, d_k), (Lk, d_v)))


def make_mask(kind, batch, Lq, Lk, device):
    """Masks of several shapes, none of which blocks a whole row."""
    if kind is None:
        return None
    if kind == "causal":  # (Lq, Lk)
        return causal(Lq, Lk, device)
    if kind == "padding":  # (B, 1, 1, Lk) for 4-D inputs, (B, 1, Lk) for 3-D
        mask = padding_mask(random_lengths(batch[0] if batch else 1, Lk), max_len=Lk).to(device)
        return mask[:, 0] if len(batch) == 1 else (mask[0, 0] if not batch else mask)
    if kind == "random_bool":  # the full shape, every row keeps at least one key
        mask = torch.rand(*batch, Lq, Lk) > 0.5
        mask[..., 0] = True
        return mask.to(device)
    if kind == "float":  # added to the scores, with some -inf
        mask = torch.randn(*batch, Lq, Lk)
        mask[..., 1:][torch.rand(*batch, Lq, Lk - 1) > 0.7] = float("-inf")
        return mask.to(device)
    raise ValueError(kind)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mask_kind", [None, "causal", "padding", "random_bool", "float"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, (*s[0], *s[1:]))))
def test_matches_torch_sdpa(shape, mask_kind, dtype, device):
    batch, Lq, Lk, d_k, d_v = shape
    q, k, v = make_qkv(*shape, dtype, device)
    mask = make_mask(mask_kind, batch, Lq, Lk, device)
    if mask is not None and mask.is_floating_point():
        mask = mask.to(dtype)

    out, weights = scaled_dot_product_attention(q, k, v, mask)

    assert out.shape == (*batch, Lq, d_v) and weights.shape == (*batch, Lq, Lk)
    assert out.dtype == dtype and weights.dtype == dtype
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOLERANCES[dtype])
    torch.testing.assert_close(weights, reference_weights(q, k, mask), **TOLERANCES[dtype])
    torch.testing.assert_close(
        weights.sum(-1), torch.ones(*batch, Lq, dtype=dtype, device=device), **TOLERANCES[dtype]
    )


def test_bool_mask_true_means_may_attend(device):
    q, k, v = make_qkv((1,), 2, 3, 4, 4, torch.float64, device)
    mask = torch.tensor([[True, False, False], [False, True, True]], device=device)
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    assert (weights[0][~mask] == 0).all()
    assert weights[0, 0, 0] == 1.0
    assert (weights[0][mask] > 0).all()


def test_scaling_is_one_over_sqrt_dk():
    """With d_k = 4 the scores are q·k / 2; a wrong scale would change the weights."""
    q = torch.tensor([[2.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    k = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    v = torch.eye(2, dtype=torch.float64)
    _, weights = scaled_dot_product_attention(q, k, v)
    expected = torch.softmax(torch.tensor([[1.0, 0.0]], dtype=torch.float64), dim=-1)
    torch.testing.assert_close(weights, expected)


def test_causal_future_tokens_do_not_leak(device):
    """Changing the last key and value must leave every earlier query's output unchanged."""
    L = 6
    q, k, v = make_qkv((2, 3), L, L, 8, 8, torch.float64, device)
    mask = causal_mask(L, device=device)
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    k2, v2 = k.clone(), v.clone()
    k2[..., -1, :] += 5.0
    v2[..., -1, :] -= 5.0
    out2, _ = scaled_dot_product_attention(q, k2, v2, mask)
    torch.testing.assert_close(out2[..., :-1, :], out[..., :-1, :], atol=0, rtol=0)
    assert not torch.allclose(out2[..., -1, :], out[..., -1, :])


@pytest.mark.parametrize("blocked", ["bool", "float"])
def test_fully_masked_row_gives_zeros_not_nan(blocked, device):
    q, k, v = make_qkv((2,), 3, 4, 5, 6, torch.float64, device)
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    keep = torch.ones(3, 4, dtype=torch.bool, device=device)
    keep[1] = False  # query 1 may attend to nothing
    mask = keep if blocked == "bool" else torch.zeros(3, 4, dtype=torch.float64, device=device).masked_fill(~keep, float("-inf"))

    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert (weights[:, 1] == 0).all() and (out[:, 1] == 0).all()
    torch.testing.assert_close(weights[:, [0, 2]].sum(-1), torch.ones(2, 2, dtype=torch.float64, device=device))

    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[:, 1] == 0).all()


def test_dropout_zeroes_weights_and_rescales():
    torch.manual_seed(1)
    q, k, v = make_qkv((4, 2), 16, 16, 8, 8, torch.float64, "cpu")
    _, plain = scaled_dot_product_attention(q, k, v)
    torch.manual_seed(2)
    out, dropped = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    zeroed = dropped == 0
    assert 0.4 < zeroed.double().mean() < 0.6
    torch.testing.assert_close(dropped[~zeroed], plain[~zeroed] * 2)
    torch.testing.assert_close(out, dropped @ v)  # the returned weights are the ones applied


def test_gradcheck():
    q, k, v = make_qkv((2,), 3, 4, 5, 2, torch.float64, "cpu")
    mask = torch.tensor([[True, True, False, False]] * 3)
    inputs = tuple(t.requires_grad_(True) for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda *x: scaled_dot_product_attention(*x, mask)[0], inputs)
    assert torch.autograd.gradgradcheck(lambda *x: scaled_dot_product_attention(*x, mask)[0], inputs)


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        (((2, 3, 4), (2, 5, 6), (2, 5, 4)), ValueError, ["last dimension d_k", "(2, 3, 4)", "(2, 5, 6)"]),
        (((2, 3, 4), (2, 5, 4), (2, 6, 4)), ValueError, ["same length Lk", "(2, 5, 4)", "(2, 6, 4)"]),
        (((4,), (5, 4), (5, 4)), ValueError, ["at least 2 dimensions", "(4,)"]),
    ],
)
def test_shape_errors_name_the_shapes(args, error, words):
    tensors = [torch.randn(*s) for s in args]
    with pytest.raises(error) as info:
        scaled_dot_product_attention(*tensors)
    for word in words:
        assert word in str(info.value)


def test_mask_errors():
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match=r"mask of shape \(5, 3\) does not broadcast .* \(2, 3, 5\)"):
        scaled_dot_product_attention(q, k, v, torch.ones(5, 3, dtype=torch.bool))
    # (B, 1, 1, Lk) against 3-D scores would silently grow them to 4-D: refused.
    with pytest.raises(ValueError, match="does not broadcast"):
        scaled_dot_product_attention(q, k, v, padding_mask([5, 3]))
    with pytest.raises(TypeError, match=r"torch.int64.*mask.bool\(\)"):
        scaled_dot_product_attention(q, k, v, torch.ones(3, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="dropout_p"):
        scaled_dot_product_attention(q, k, v, dropout_p=1.0)


# --- learned attention sinks: one more logit per row, for no key ---------------------------------


@pytest.mark.parametrize("mask_kind", [None, "causal", "random_bool", "float"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_a_sink_equals_one_more_key_with_the_sinks_score_and_a_zero_value(mask_kind, dtype, device):
    """gpt-oss's sinks: softmax over [scores, sink], the sink's column dropped. The same as PyTorch's
    kernel over the keys plus one: a zero key (score 0) whose float mask entry is the sink, a zero value."""
    B, H, Lq, Lk, d_k = 2, 3, 5, 6, 4
    q, k, v = make_qkv((B, H), Lq, Lk, d_k, d_k, dtype, device)
    mask = make_mask(mask_kind, (B, H), Lq, Lk, device)
    sinks = randn(H, 1, 1, device=device, dtype=dtype) * 2  # one logit per head
    out, weights = scaled_dot_product_attention(q, k, v, mask, sinks=sinks)
    additive = torch.zeros(B, H, Lq, Lk, dtype=dtype, device=device)
    if mask is not None:
        additive = additive.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else additive + mask
    extra = torch.cat([additive, sinks.expand(B, H, Lq, 1)], dim=-1)  # (B, H, Lq, Lk + 1)
    zero = torch.zeros(B, H, 1, d_k, dtype=dtype, device=device)
    k1, v1 = torch.cat([k, zero], dim=-2), torch.cat([v, zero], dim=-2)
    expected = F.scaled_dot_product_attention(q, k1, v1, attn_mask=extra)
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])
    torch.testing.assert_close(weights, reference_weights(q, k1, extra)[..., :-1], **TOLERANCES[dtype])
    plain_out, plain_weights = scaled_dot_product_attention(q, k, v, mask)
    share = 1 - weights.sum(-1)  # what the sink took: exp(sink) / (exp(sink) + Σ exp(scores))
    assert (share > 0).all() and (share < 1).all()
    torch.testing.assert_close(weights, plain_weights * (1 - share[..., None]), **TOLERANCES[dtype])
    assert not torch.allclose(out, plain_out)


def test_sinks_by_the_formula_and_their_limits():
    q, k, v = make_qkv((3,), 4, 5, 8, 8, torch.float64, "cpu")
    scores = q @ k.transpose(-2, -1) / 8 ** 0.5  # (3, 4, 5)
    sinks = torch.tensor([0.0, 1.5, -2.0], dtype=torch.float64)[:, None, None]  # 0: Miller's "softmax plus one"
    _, weights = scaled_dot_product_attention(q, k, v, sinks=sinks)
    expected = scores.exp() / (sinks.exp() + scores.exp().sum(-1, keepdim=True))
    torch.testing.assert_close(weights, expected)
    never = torch.full((3, 1, 1), float("-inf"), dtype=torch.float64)  # a sink at -inf takes nothing
    for a, b in zip(scaled_dot_product_attention(q, k, v, sinks=never), scaled_dot_product_attention(q, k, v)):
        torch.testing.assert_close(a, b)
    everything = torch.full((3, 1, 1), 1e4, dtype=torch.float64)  # a huge sink takes every row's weight
    out, weights = scaled_dot_product_attention(q, k, v, sinks=everything)
    assert weights.abs().max() < 1e-100 and out.abs().max() < 1e-100


def test_a_sink_on_a_fully_masked_row_and_its_gradient():
    q, k, v = make_qkv((2,), 3, 4, 5, 6, torch.float64, "cpu")
    sinks = torch.tensor([0.5, -1.0], dtype=torch.float64)[:, None, None].requires_grad_(True)
    keep = torch.ones(3, 4, dtype=torch.bool)
    keep[1] = False  # query 1 may attend to nothing: the sink takes all of its weight
    out, weights = scaled_dot_product_attention(q, k, v, keep, sinks=sinks)
    assert (weights[:, 1] == 0).all() and (out[:, 1] == 0).all()
    assert (weights[:, [0, 2]].sum(-1) < 1).all()
    out.sum().backward()
    assert torch.isfinite(sinks.grad).all() and (sinks.grad != 0).all()  # a sink learns
    assert torch.autograd.gradcheck(
        lambda s: scaled_dot_product_attention(q, k, v, keep, sinks=s)[0], (sinks.detach().requires_grad_(True),))


@pytest.mark.parametrize(("sinks", "error", "words"), [
    ([0.0], TypeError, "sinks must be a torch.Tensor"),
    (torch.zeros(3, 1, 1, dtype=torch.long), TypeError, "floating-point"),
    (torch.zeros(3, 1, 1, dtype=torch.float32), TypeError, "dtype torch.float32"),
    (torch.zeros(3, 1, 1, dtype=torch.float64, device="meta"), ValueError, "on meta"),
    (torch.zeros(3, 1, 2, dtype=torch.float64), ValueError, r"one logit per row"),
    (torch.zeros(4, 1, 1, dtype=torch.float64), ValueError, r"does not broadcast"),
    (torch.zeros(5, 3, 1, 1, dtype=torch.float64), ValueError, r"does not broadcast"),
])
def test_bad_sinks_are_refused(sinks, error, words):
    q, k, v = make_qkv((2, 3), 4, 5, 8, 8, torch.float64, "cpu")
    with pytest.raises(error, match=words):
        scaled_dot_product_attention(q, k, v, sinks=sinks)
