"""mha_lib.validation: every bad input gets an error that names it, and nothing right is refused.

The "meta" device stands in for a second device, so that the device checks run on any machine.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mha_lib.attention
import mha_lib.multi_head
from mha_lib import (
    AttentionHead,
    EfficientMultiHeadAttention,
    EncoderLayer,
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from mha_lib import validation
from mha_lib.sentiment import SentimentClassifier

B, H, L, D = 3, 2, 5, 8  # B != H != L, so that every misread shape is told apart


def modules():
    """The three attention modules, each called as ``f(x, mask)``, with ``mask`` on their scores."""
    mha = MultiHeadAttention(D, H).eval()
    fused = EfficientMultiHeadAttention.from_module(mha)
    head = AttentionHead(D, 4)
    return {
        "MultiHeadAttention": lambda x, mask=None: mha(x, x, x, mask=mask),
        "Efficient": lambda x, mask=None: fused(x, x, x, mask=mask),
        "Efficient, weights": lambda x, mask=None: fused(x, x, x, mask=mask, return_weights=True)[0],
        "AttentionHead": lambda x, mask=None: head(x, x, x, mask=mask),
    }


MULTI_HEAD = ["MultiHeadAttention", "Efficient", "Efficient, weights"]


# --- one module, used by all -------------------------------------------------------------


def test_the_checks_live_in_one_place():
    """Every check is defined in mha_lib.validation; the modules import them, never re-export them."""
    import inspect

    for module in (mha_lib.attention, mha_lib.multi_head, mha_lib.efficient, mha_lib.inference, mha_lib.heads,
                   mha_lib.positions, mha_lib.masks):
        public = set(getattr(module, "__all__", []))
        assert not {name for name in public if name.startswith("check_")}, module.__name__
        for name, value in vars(module).items():
            if name.startswith("check_") and callable(value):
                assert inspect.getmodule(value).__name__.startswith("mha_lib.validation"), (module.__name__, name)


# --- the configuration -------------------------------------------------------------------


@pytest.mark.parametrize("cls", [MultiHeadAttention, EfficientMultiHeadAttention])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((8, 2.0), r"num_heads must be a positive int, got 2\.0 \(a float\); write 2, without the decimal point"),
        ((8, True), r"num_heads must be a positive int, got True \(a bool\); a size is a number"),
        (("8", 2), r"d_model must be a positive int, got '8' \(a str\); write 8, without the quotes"),
        ((8.5, 2), r"d_model must be a positive int, got 8\.5 \(a float\)$"),
        ((8, 0), r"d_model and num_heads must be positive, got d_model=8, num_heads=0"),
        ((2, 4), r"num_heads=4 is more than d_model=2: each head would get d_k = d_model // num_heads = 0"),
        ((10, 4), r"d_model=10 is not divisible by num_heads=4"),
        ((8, 2, True), r"dropout must be in \[0, 1\), got True \(a bool\).*bias=False"),
        ((8, 2, "0.1"), r"dropout must be in \[0, 1\), got '0\.1' \(a str\)"),
        ((8, 2, float("nan")), r"dropout must be in \[0, 1\), got nan"),
        ((8, 2, -0.1), r"dropout must be in \[0, 1\), got -0\.1"),
        ((8, 2, 1), r"dropout must be in \[0, 1\), got 1"),
    ],
)
def test_a_bad_configuration_fails_at_construction(cls, args, message):
    with pytest.raises(ValueError, match=message):
        cls(*args)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((8, 4.0), r"d_k must be a positive int, got 4\.0 \(a float\); write 4"),
        (("8", 4), r"d_model must be a positive int, got '8' \(a str\)"),
        ((8, 4, False), r"d_v must be a positive int, got False \(a bool\)"),
        ((8, 0), r"d_k must be a positive int, got 0"),
    ],
)
def test_attention_head_configuration(args, message):
    with pytest.raises(ValueError, match=message):
        AttentionHead(*args)


def test_numpy_and_plain_ints_are_accepted_alike():
    x = torch.randn(B, L, D)
    for build in (
        lambda n: MultiHeadAttention(n(D), n(H), dropout=n(0)),
        lambda n: EfficientMultiHeadAttention(n(D), n(H)),
        lambda n: AttentionHead(n(D), n(4), n(4)),
        lambda n: EncoderLayer(n(D), n(H), n(16)),
    ):
        torch.manual_seed(0)
        plain = build(int)
        torch.manual_seed(0)
        numpy = build(np.int64)
        for name in ("d_model", "num_heads", "d_k", "d_v"):
            if hasattr(plain, name):
                assert type(getattr(numpy, name)) is int and getattr(numpy, name) == getattr(plain, name)
        assert repr(numpy) == repr(plain)
        args = (x,) if isinstance(plain, EncoderLayer) else (x, x, x)
        assert torch.equal(numpy(*args), plain(*args))
    assert torch.equal(causal_mask(np.int64(4)), causal_mask(4))
    assert torch.equal(padding_mask([2, 3], np.int64(5)), padding_mask([2, 3], 5))
    assert torch.equal(padding_mask([2, 3], torch.tensor(5)), padding_mask([2, 3], 5))  # e.g. lengths.max()
    assert MultiHeadAttention(8, 2, 0).dropout == 0.0  # an int 0 is a probability too


@pytest.mark.parametrize(("max_len", "kind"), [(True, "bool"), (5.0, "float"), ("5", "str")])
def test_padding_mask_max_len_must_be_an_int(max_len, kind):
    with pytest.raises(ValueError, match=rf"max_len must be .*, got .* \(a {kind}\)"):
        padding_mask([2, 3], max_len)


# --- the inputs ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(modules()))
def test_inputs_of_another_dtype_name_both_dtypes(name):
    f = modules()[name]
    with pytest.raises(TypeError, match=r"query has dtype torch\.float64 but the module's weights are torch\.float32; "
                       r"convert one to the other: query\.to\(torch\.float32\) or module\.to\(torch\.float64\)"):
        f(torch.randn(B, L, D, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"query has dtype torch\.int64 .* embed them first, e\.g\. with nn\.Embedding"):
        f(torch.ones(B, L, D, dtype=torch.long))


def test_inputs_of_another_dtype_or_device_the_encoder_layer():
    layer = EncoderLayer(D, H, 16)
    with pytest.raises(TypeError, match=r"x has dtype torch\.float64 but the module's weights are torch\.float32"):
        layer(torch.randn(B, L, D, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"x is on meta but the module's weights are on cpu; move one to the other"):
        layer(torch.randn(B, L, D, device="meta"))


def test_inputs_on_another_device_name_both_devices():
    mha = MultiHeadAttention(D, H)
    x = torch.randn(B, L, D)
    with pytest.raises(ValueError, match=r"key is on meta but the module's weights are on cpu; move one to the "
                       r"other, e\.g\. key\.to\('cpu'\) or module\.to\('meta'\)"):
        mha(x, x.to("meta"), x)


def test_mixed_dtypes_are_accepted_under_autocast():
    """torch.autocast mixes dtypes on purpose: the checks must let it."""
    mha = MultiHeadAttention(D, H)
    fused = EfficientMultiHeadAttention.from_module(mha)
    x = torch.randn(B, L, D).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert mha(x, x, x).dtype == fused(x, x, x).dtype == torch.bfloat16
        q = torch.randn(B, L, 4)
        assert scaled_dot_product_attention(q, q.bfloat16(), q)[0].dtype == torch.bfloat16


def test_function_input_errors():
    q = torch.randn(2, 3, 4)
    with pytest.raises(TypeError, match=r"query must be a torch\.Tensor, got list"):
        scaled_dot_product_attention([[1.0]], q, q)
    with pytest.raises(TypeError, match=r"query has dtype torch\.float32 but key has torch\.float64; convert them "
                       r"to one dtype, e\.g\. key\.to\(torch\.float32\)"):
        scaled_dot_product_attention(q, q.double(), q)
    with pytest.raises(TypeError, match=r"value has dtype torch\.int64; attention needs floating-point vectors"):
        scaled_dot_product_attention(q, q, q.long())
    with pytest.raises(ValueError, match=r"query is on cpu but key is on meta; move them to one device"):
        scaled_dot_product_attention(q, q.to("meta"), q)
    with pytest.raises(TypeError, match=r"query has dtype torch\.float32 but value has torch\.float64"):
        scaled_dot_product_attention(q.to("meta"), q.to("meta"), q.to("meta", torch.float64))  # autocast can't tell
    with pytest.raises(ValueError, match=r"d_k = 0 features, got \(2, 3, 0\): the scores would be 0 / sqrt\(0\) = NaN"):
        scaled_dot_product_attention(torch.randn(2, 3, 0), torch.randn(2, 3, 0), q)
    with pytest.raises(ValueError, match=r"leading \(batch, head\) dimensions of query \(2, 3, 4\), key \(3, 3, 4\) "
                       r"and value \(3, 3, 4\) don't broadcast"):
        scaled_dot_product_attention(q, torch.randn(3, 3, 4), torch.randn(3, 3, 4))
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\), got True \(a bool\)"):
        scaled_dot_product_attention(q, q, q, dropout_p=True)


def test_function_leading_dimensions_that_broadcast_are_accepted():
    q = torch.randn(2, 3, 4, 8)  # (B, H, Lq, d_k)
    k, v = torch.randn(2, 1, 5, 8), torch.randn(2, 1, 5, 8)  # one key/value head shared by the 3 query heads
    out, weights = scaled_dot_product_attention(q, k, v, causal_mask(5)[:4])
    expected = F.scaled_dot_product_attention(q, k.expand(2, 3, 5, 8), v.expand(2, 3, 5, 8),
                                              attn_mask=causal_mask(5)[:4])
    assert torch.allclose(out, expected, atol=1e-6) and weights.shape == (2, 3, 4, 5)


# --- float masks -----------------------------------------------------------------------------

ZERO_ONE = r"mask is a torch\.float32 tensor of 0s and 1s, but a float mask is \*added\* to the scores, " \
           r"so this one blocks nothing\. For keep \(1\) / block \(0\) use mask\.bool\(\).*0 = may attend and -inf"


@pytest.mark.parametrize("name", list(modules()))
@pytest.mark.parametrize("mask", [torch.tril(torch.ones(L, L)), torch.ones(L, L)], ids=["tril", "ones"])
def test_a_float_mask_of_zeros_and_ones_is_refused(name, mask):
    with pytest.raises(ValueError, match=ZERO_ONE):
        modules()[name](torch.randn(B, L, D), mask)


def test_a_float_mask_of_zeros_and_ones_is_refused_by_the_function():
    q = torch.randn(2, L, 4)
    with pytest.raises(ValueError, match=ZERO_ONE):
        scaled_dot_product_attention(q, q, q, torch.tril(torch.ones(L, L)))
    with pytest.raises(ValueError, match=r"mask contains NaN"):
        scaled_dot_product_attention(q, q, q, torch.full((L, L), float("nan")))


@pytest.mark.parametrize("name", list(modules()))
def test_float_masks_that_mean_something_are_accepted(name):
    """0/-inf equals the bool mask, all-zero equals no mask, and any other bias is added."""
    f, x = modules()[name], torch.randn(B, L, D)
    causal = causal_mask(L)
    additive = torch.zeros(L, L).masked_fill(~causal, float("-inf"))
    assert torch.allclose(f(x, additive), f(x, causal), atol=1e-6)
    assert torch.allclose(f(x, torch.zeros(L, L)), f(x), atol=1e-6)  # "no bias": accepted on purpose
    alibi = -(torch.arange(L)[None, :] - torch.arange(L)[:, None]).abs().float()  # (L, L), ALiBi-like
    assert not torch.allclose(f(x, alibi), f(x), atol=1e-3)  # it is applied
    bias = alibi.clone().requires_grad_()  # a learned bias
    f(x, bias).sum().backward()
    assert bias.grad is not None and bias.grad.abs().sum() > 0


def test_a_zero_one_float_mask_would_indeed_block_nothing():
    """Why it is refused: added to the scores, 0/1 gives the unmasked weights (softmax ignores a shift)."""
    q, k, v = torch.randn(1, L, 4), torch.randn(1, L, 4), torch.randn(1, L, 4)
    scores = q @ k.transpose(-2, -1) / 2
    added = torch.softmax(scores + torch.tril(torch.ones(L, L)), -1)
    blocked = torch.softmax(scores.masked_fill(~causal_mask(L), float("-inf")), -1)
    future = ~causal_mask(L)
    assert (added[0][future] > 0).all() and (blocked[0][future] == 0).all()


# --- masks on another device ------------------------------------------------------------------


@pytest.mark.parametrize("name", list(modules()))
def test_a_mask_on_another_device_is_named(name):
    with pytest.raises(ValueError, match=r"mask is on meta but the attention runs on cpu; put it on the inputs' "
                       r"device: mask\.to\(x\.device\)"):
        modules()[name](torch.randn(B, L, D), causal_mask(L, device="meta"))


def test_a_mask_on_another_device_is_named_by_the_function_and_the_classifier():
    q = torch.randn(2, L, 4)
    with pytest.raises(ValueError, match=r"mask is on meta but the attention runs on cpu"):
        scaled_dot_product_attention(q, q, q, causal_mask(L, device="meta"))
    model = SentimentClassifier(10, d_model=8, num_heads=H, max_len=L)
    tokens = torch.full((B, L), 2)  # <cls> = 2, then more of it
    with pytest.raises(ValueError, match=r"mask is on meta but the attention runs on cpu"):
        model(tokens, mask=causal_mask(L, device="meta"))
    with pytest.raises(ValueError, match=r"tokens are on meta but the model is on cpu; move them with "
                       r"tokens\.to\(next\(model\.parameters\(\)\)\.device\)"):
        model(tokens.to("meta"))


@pytest.mark.parametrize("shape", [(B, L), (L,)])
def test_float_tokens_name_the_dtype(shape):
    model = SentimentClassifier(10, d_model=8, num_heads=H, max_len=L)
    with pytest.raises(ValueError, match=rf"integer token ids \(torch\.long\), got dtype torch\.float32 "
                       rf"\(shape {re_shape(shape)}\); batch_examples makes them, or use tokens\.long\(\)"):
        model(torch.full(shape, 2.0))


def re_shape(shape: tuple[int, ...]) -> str:
    return str(tuple(shape)).replace("(", r"\(").replace(")", r"\)")


# --- mask shapes ------------------------------------------------------------------------------

# Every shape the multi-head modules accept on scores (B, H, L, L), and what it means.
ACCEPTED = [(L,), (1, L), (L, L), (H, L, L), (1, L, L), (1, H, L, L), (B, 1, 1, L), (B, 1, L, L), (B, H, L, L),
            (1, 1, L, L), (H, 1, L)]


@pytest.mark.parametrize("name", MULTI_HEAD)
@pytest.mark.parametrize("shape", ACCEPTED, ids=str)
def test_every_documented_mask_shape_is_accepted_and_read_by_broadcasting(name, shape):
    """A mask means what it means expanded to (B, H, Lq, Lk), aligned from the right."""
    torch.manual_seed(1)
    mask = torch.rand(shape) > 0.3
    f, x = modules()[name], torch.randn(B, L, D)
    assert torch.allclose(f(x, mask), f(x, mask.expand(B, H, L, L)), atol=1e-6)


def test_a_3d_mask_is_per_head_also_when_the_batch_has_as_many_sequences_as_heads():
    """B == H: (H, L, L) can't be told from (B, L, L) and is read per head (chapter 06's use)."""
    mha = MultiHeadAttention(D, 2)
    x = torch.randn(2, L, D)
    per_head = torch.stack([causal_mask(L), causal_mask(L).T])  # (H, L, L)
    _, weights = mha(x, x, x, mask=per_head, return_weights=True)  # (B, H, L, L)
    for b in range(2):
        for h in range(2):
            assert (weights[b, h][~per_head[h]] == 0).all()


def test_a_2d_mask_is_queries_by_keys_also_when_the_batch_has_as_many_sequences_as_queries():
    """B == Lq: a 2-D mask is read as (Lq, Lk), so causal_mask(L) keeps working."""
    mha = MultiHeadAttention(D, H)
    x = torch.randn(L, L, D)  # B == L
    _, weights = mha(x, x, x, mask=causal_mask(L), return_weights=True)
    assert (weights[..., ~causal_mask(L)] == 0).all()


@pytest.mark.parametrize("name", MULTI_HEAD)
@pytest.mark.parametrize(
    ("shape", "message", "fix"),
    [
        ((B, L), r"a 2-D mask is read as \(Lq, Lk\), one row per query, but this one has B=3 rows, like a "
                 r"key-padding mask \(B, Lk\): pass it as \(B, 1, 1, Lk\): padding_mask\(lengths\), or "
                 r"mask\[:, None, None, :\]", lambda m: m[:, None, None, :]),
        ((B, L, L), r"a 3-D mask is read as \(H, Lq, Lk\), one pattern per head, but its first size is B=3, not "
                    r"H=2: for one pattern per sequence, shared by the heads, add a head axis: mask\[:, None\], "
                    r"\(3, 1, 5, 5\)", lambda m: m[:, None]),
        ((B, 1, L), r"a 3-D mask is read as \(H, Lq, Lk\).*mask\[:, None\], \(3, 1, 1, 5\)", lambda m: m[:, None]),
        ((H, 1, L, L), r"the first axis of a 4-D mask is the batch \(B=3\), but this one has H=2 entries there, "
                       r"like an \(H, 1, Lq, Lk\) per-head mask: pass it as \(H, Lq, Lk\), i\.e\. mask\[:, 0\]",
         lambda m: m[:, 0]),
        ((L, 4), r"its last size must be Lk=5 \(one entry per key\) or 1", None),
        ((1, B, H, L, L), r"the mask has 5 dimensions, the scores only 4", None),
    ],
    ids=["(B, Lk)", "(B, Lq, Lk)", "(B, 1, Lk)", "(H, 1, Lq, Lk)", "wrong Lk", "5-D"],
)
def test_a_misread_mask_shape_is_refused_with_the_shape_to_use(name, shape, message, fix):
    f, x = modules()[name], torch.randn(B, L, D)
    mask = torch.rand(shape) > 0.3
    with pytest.raises(ValueError, match=rf"mask of shape {re_shape(shape)} does not broadcast to the attention "
                       rf"scores' shape \(3, 2, 5, 5\) \(B, H, Lq, Lk\); {message}"):
        f(x, mask)
    if fix is not None:
        assert f(x, fix(mask)).shape == (B, L, D)  # the suggested fix is accepted


def test_a_transposed_cross_attention_mask_is_named():
    mha = MultiHeadAttention(D, H)
    target, source = torch.randn(B, 4, D), torch.randn(B, 6, D)
    mask = torch.rand(6, 4) > 0.3  # (Lk, Lq): rows and columns swapped
    with pytest.raises(ValueError, match=r"is it transposed\? Rows are queries, columns are keys"):
        mha(target, source, source, mask=mask)
    assert mha(target, source, source, mask=mask.T).shape == (B, 4, D)


def test_one_heads_key_padding_mask_hints():
    head, x = AttentionHead(D, 4), torch.randn(B, L, D)
    mask = torch.rand(B, L) > 0.3
    with pytest.raises(ValueError, match=r"scores' shape \(3, 5, 5\) \(B, Lq, Lk\); a 2-D mask is read as \(Lq, Lk\)"
                       r".*pass it as \(B, 1, Lk\): padding_mask\(lengths\)\[:, 0\], or mask\[:, None, :\]"):
        head(x, x, x, mask=mask)
    assert head(x, x, x, mask=mask[:, None, :]).shape == (B, L, 4)
    q = torch.randn(B, L, 4)
    with pytest.raises(ValueError, match=r"for padding_mask\(lengths\), which is \(B, 1, 1, Lk\), on \(B, Lq, Lk\) "
                       r"scores pass padding_mask\(lengths\)\[:, 0\], \(B, 1, Lk\)"):
        scaled_dot_product_attention(q, q, q, padding_mask([5, 3, 1]))
    assert scaled_dot_product_attention(q, q, q, padding_mask([5, 3, 1])[:, 0])[0].shape == (B, L, 4)


def test_the_padding_mask_keeps_the_padding_out_in_the_documented_shapes():
    """padding_mask's (B, 1, 1, Lk) for the modules, [:, 0] for one head: padding gets zero weight."""
    lengths = [5, 3, 1]
    x = torch.randn(B, L, D)
    _, weights = MultiHeadAttention(D, H)(x, x, x, mask=padding_mask(lengths), return_weights=True)
    _, one = AttentionHead(D, 4)(x, x, x, mask=padding_mask(lengths)[:, 0], return_weights=True)
    for b, n in enumerate(lengths):
        assert (weights[b, :, :, n:] == 0).all() and (weights[b, :, :, :n] > 0).all()
        assert (one[b, :, n:] == 0).all() and (one[b, :, :n] > 0).all()


def test_broadcast_shapes_agrees_with_pytorch():
    """mha_lib's plain-Python broadcast_shapes (PyTorch's own imports SymPy on first use, about a
    second per notebook) gives PyTorch's answer, and fails where PyTorch fails, on random shapes."""
    rng = np.random.default_rng(0)
    failures = 0
    for _ in range(2000):
        shapes = [tuple(int(s) for s in rng.choice([0, 1, 1, 2, 3], size=rng.integers(0, 5)))
                  for _ in range(rng.integers(1, 4))]
        try:
            expected = torch.broadcast_shapes(*shapes)
        except RuntimeError:
            failures += 1
            with pytest.raises(RuntimeError, match="do not broadcast"):
                validation.broadcast_shapes(*shapes)
            continue
        got = validation.broadcast_shapes(*shapes)
        assert got == expected and isinstance(got, torch.Size), (shapes, got, expected)
    assert 100 < failures < 1900  # both branches were exercised
