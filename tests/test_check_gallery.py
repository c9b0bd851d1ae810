"""The gallery of wrong answers that once passed a check, or got a misleading hint, and of
right answers written in unusual ways that must keep passing.

Each wrong answer is one a learner wrote (issue 12); the test asserts that the check
rejects it *and* that its message or hint names the mistake (and, where a hint used to
point the wrong way, that it no longer does).
"""

from __future__ import annotations

import cProfile
import math
import sys

import numpy as np
import pytest
import torch
from torch import nn

import mha_lib
from mha_lib import checks
from mha_lib.checks import reference

from conftest import MHA, MHAWithLibrary, expect_fail, expect_pass, halves_right, sdpa, sdpa_safe_where


# ------------------------------------------------------------------ 1.1 and 1.4: dtype, gradients


def sdpa_in_float64(q, k, v, mask=None):
    out, w = sdpa(q.double(), k.double(), v.double(), mask)
    return out, w  # float64 for float32 inputs


def sdpa_detached_weights(q, k, v, mask=None):
    _, w = sdpa(q, k, v, mask)
    return w.detach() @ v, w.detach()


def sdpa_no_grad(q, k, v, mask=None):
    with torch.no_grad():
        return sdpa(q, k, v, mask)


def sdpa_item_scale(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / torch.tensor(q.size(-1)).sqrt().item()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = scores.softmax(-1)
    return w @ v, w


def sdpa_upcast_and_back(q, k, v, mask=None):
    out, w = sdpa(q.double(), k.double(), v.double(), mask)
    return out.to(q.dtype), w.to(q.dtype)  # computes in float64, returns the inputs' dtype


def sdpa_list(q, k, v, mask=None):
    return list(sdpa(q, k, v, mask))


@pytest.mark.parametrize("fn", [sdpa_item_scale, sdpa_upcast_and_back, sdpa_list])
def test_unusual_attention_passes(fn):
    expect_pass(checks.check_scaled_dot_product_attention(fn))


def test_changed_dtype_is_rejected():
    expect_fail(checks.check_scaled_dot_product_attention(sdpa_in_float64),
                "dtype torch.float64 for inputs of dtype torch.float32", ".double()")
    expect_fail(checks.check_attention_scores(lambda q, k: q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.size(-1))),
                "dtype torch.float64 for inputs of dtype torch.float32")


def test_cut_gradients_are_rejected():
    expect_fail(checks.check_scaled_dot_product_attention(sdpa_detached_weights),
                "no gradient reaches query, key", ".detach()")
    expect_fail(checks.check_scaled_dot_product_attention(sdpa_no_grad),
                "doesn't depend on query, key and value through autograd", "torch.no_grad()")
    def masked_detached(q, k, v, mask=None):
        _, w = sdpa_safe_where(q, k, v, mask)
        return w.detach() @ v, w.detach()

    expect_fail(checks.check_masked_attention(masked_detached), "no gradient reaches query, key")


def test_missing_mask_argument_is_named():
    expect_fail(checks.check_scaled_dot_product_attention(lambda q, k, v: sdpa(q, k, v)),
                "doesn't accept the argument mask=", "mask=None")


# ------------------------------------------------------------------ 1.2 and 1.3: masks


def test_all_true_causal_mask_says_it_sees_the_future():
    expect_fail(checks.check_causal_mask(lambda L: torch.ones(L, L, dtype=torch.bool)), "see the future")


def test_padding_mask_arguments_match_the_library():
    def needs_max_len(lengths, max_len):
        return (torch.arange(max_len) < torch.tensor(lengths)[:, None])[:, None, None]

    def ignores_max_len(lengths, max_len=None):
        return mha_lib.padding_mask(lengths).clone()

    def ignores_max_len_by_hand(lengths, max_len=None):
        return (torch.arange(max(lengths)) < torch.tensor(lengths)[:, None])[:, None, None]

    def right(lengths, max_len=None):
        positions = torch.arange(max(lengths) if max_len is None else max_len)
        return (positions[None, :] < torch.as_tensor(lengths)[:, None])[:, None, None, :]

    expect_pass(checks.check_padding_mask(right))
    expect_fail(checks.check_padding_mask(needs_max_len), "max_len must be optional", "max_len=none")
    expect_fail(checks.check_padding_mask(ignores_max_len), "calls mha_lib.padding_mask")
    expect_fail(checks.check_padding_mask(ignores_max_len_by_hand), "max_len was ignored")


# ------------------------------------------------------------------ 3.1: the parameter count


def test_float_parameter_count_is_rejected():
    result = checks.check_parameter_count(lambda d, h, bias=True: 4 * (d * d + (d if bias else 0)) / 1)
    expect_fail(result, "1050624.0", "whole number", "//")
    expect_pass(checks.check_parameter_count(lambda d, h, bias=True: np.int64(4 * d * d + 4 * d * bias)))
    expect_pass(checks.check_parameter_count(lambda d, h, bias=True: torch.tensor(4 * d * (d + bias))))


# ------------------------------------------------------------------ 3.4: the module


class NoCheck(MHA):
    def __init__(self, d_model, num_heads):
        nn.Module.__init__(self)
        self.h, self.d_k = num_heads, d_model // num_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))
        self.scale, self.transpose, self.out_proj, self.book_bug = "d_k", True, True, False


class Asserts(NoCheck):
    def __init__(self, d_model, num_heads):
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"
        super().__init__(d_model, num_heads)


class RaisesTypeError(NoCheck):
    def __init__(self, d_model, num_heads):
        if d_model % num_heads:
            raise TypeError("d_model must be divisible by num_heads")
        super().__init__(d_model, num_heads)


@pytest.mark.parametrize(("cls", "words"), [
    (NoCheck, ["was built although 10 features can't be split", "raise valueerror"]),
    (Asserts, ["raised assertionerror", "asks for a valueerror"]),
    (RaisesTypeError, ["raised typeerror", "asks for a valueerror", "raise valueerror"]),
])
def test_mha_without_value_error_is_rejected(cls, words):
    expect_fail(checks.check_multi_head_attention(cls), *words)


class Returns(nn.Module):
    """Right output; the second value is what ``what`` says."""

    def __init__(self, d_model, num_heads, what="weights", mask_fill=float("-inf")):
        super().__init__()
        if d_model % num_heads:
            raise ValueError("d_model % num_heads != 0")
        self.h, self.d_k, self.what, self.fill = num_heads, d_model // num_heads, what, mask_fill
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, query, key, value, mask=None):
        q, k, v = (mha_lib.split_heads(f(x), self.h) for f, x in ((self.W_q, query), (self.W_k, key), (self.W_v, value)))
        raw = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        scores = raw if mask is None else raw.masked_fill(~mask, self.fill)
        weights = scores.softmax(-1)
        out = self.W_o(mha_lib.combine_heads(weights @ v))
        second = {"weights": weights, "scores": scores, "mean": weights.mean(1), "unmasked": raw.softmax(-1),
                  "unscaled": (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf")).softmax(-1)
                  if mask is not None else (q @ k.transpose(-2, -1)).softmax(-1)}[self.what]
        return out, second


@pytest.mark.parametrize(("what", "words"), [
    ("scores", ["scores before the softmax"]),
    ("mean", ["averaged over the heads", "(b, h, lq, lk)"]),
    ("unmasked", ["before the mask was applied"]),
    ("unscaled", ["unscaled scores"]),
])
def test_mha_wrong_weights_are_rejected(what, words):
    expect_fail(checks.check_multi_head_attention(lambda d, h: Returns(d, h, what)), *words)


def test_mha_right_weights_pass():
    expect_pass(checks.check_multi_head_attention(Returns))
    expect_pass(checks.check_multi_head_attention(lambda d, h: Returns(d, h, mask_fill=-1e9)))
    expect_pass(checks.check_multi_head_attention(MHAWithLibrary))
    expect_pass(checks.check_multi_head_attention(lambda d, h: OutputAndNone(d, h)))


class OutputAndNone(Returns):
    def forward(self, query, key, value, mask=None):
        return super().forward(query, key, value, mask)[0], None  # (output, None): the output alone


class InvertedMask(Returns):
    def forward(self, query, key, value, mask=None):
        return super().forward(query, key, value, None if mask is None else ~mask)


class Unscaled(MHA):
    def forward(self, query, key, value, mask=None):
        q, k, v = (mha_lib.split_heads(f(x), self.h) for f, x in ((self.W_q, query), (self.W_k, key), (self.W_v, value)))
        scores = q @ k.transpose(-2, -1) / self.scale_by
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return self.W_o(mha_lib.combine_heads(scores.softmax(-1) @ v))


def test_mha_misleading_hints_are_fixed():
    expect_fail(checks.check_multi_head_attention(InvertedMask), "mask is inverted", "~mask")

    class NoScale(Unscaled):
        scale_by = 1.0

    class ByDk(Unscaled):
        @property
        def scale_by(self):
            return self.d_k

    result = checks.check_multi_head_attention(NoScale)
    expect_fail(result, "not scaled", "d_model // num_heads")
    assert "d_k = query.size(-1)" not in str(result)  # inside forward that is d_model
    expect_fail(checks.check_multi_head_attention(ByDk), "divided by d_k instead of √d_k", "math.sqrt(d_k), not d_k")


# ------------------------------------------------------------------ 4.1 and 4.3: padding beyond the longest


def test_seq_len_and_max_len_ignored_are_rejected():
    expect_fail(checks.check_causal_padding_mask(
        lambda lengths, L: mha_lib.causal_mask(L) & mha_lib.padding_mask(lengths)),
        "seq_len was not used for the padding mask", "max_len=seq_len")
    expect_fail(checks.check_causal_padding_mask(
        lambda lengths, L: mha_lib.causal_mask(max(lengths)) & mha_lib.padding_mask(lengths)),
        "seq_len was ignored", "max_len=seq_len")
    expect_fail(checks.check_cross_attention(
        lambda mha, t, s, lengths: mha(t, s, s, mask=mha_lib.padding_mask(lengths))),
        "padded beyond its longest sentence", "max_len=source.size(1)")
    expect_pass(checks.check_causal_padding_mask(
        lambda lengths, L: mha_lib.causal_mask(L) & mha_lib.padding_mask(lengths, max_len=L)))


# ------------------------------------------------------------------ 8.2: (output, weights)


def test_restricted_attention_must_return_the_weights():
    expect_fail(checks.check_restricted_attention(lambda mha, x: mha(x, x, x, mask=halves_right(x.size(1)))),
                "returned only the output", "return (output, weights)", "return_weights=true")

    def averaged(mha, x):
        out, w = mha(x, x, x, mask=halves_right(x.size(1)), return_weights=True)
        return out, w.mean(1)

    def other_call(mha, x):
        out = mha(x, x, x, mask=halves_right(x.size(1)))
        return out, mha(x, x, x, return_weights=True)[1]

    expect_fail(checks.check_restricted_attention(averaged), "averaged over the heads")
    expect_fail(checks.check_restricted_attention(lambda mha, x: (averaged(mha, x)[0], None)),
                "returned (output, none)")
    expect_fail(checks.check_restricted_attention(other_call), "not the ones it was computed with")


# ------------------------------------------------------------------ errors: the learner's line, mha_lib's message


def test_an_error_raised_inside_mha_lib_shows_the_learners_line_and_the_library_message():
    def wrong_mask_shape(mha, x):
        mask = halves_right(x.size(1))[:, :, :2]
        return mha(x, x, x, mask=mask, return_weights=True)

    x = torch.randn(2, 4, 8)
    try:
        mha_lib.MultiHeadAttention(8, 2)(x, x, x, mask=halves_right(4)[:, :, :2])
    except Exception as error:  # the library's own message
        library_message = str(error).splitlines()[0]
    result = checks.check_restricted_attention(wrong_mask_shape)
    expect_fail(result, "in mha_lib", status="error")
    assert library_message in result.message
    assert "return mha(x, x, x, mask=mask, return_weights=True)" in result.message  # the learner's own line
    assert "raise " not in result.message and ".transpose(-2, -1)" not in result.hint


def test_shape_errors_get_the_dot_t_hint_only_when_the_line_uses_dot_t():
    def uses_matmul_wrongly(q, k, v, mask=None):
        scores = q @ k  # forgot the transpose
        return scores, scores

    result = checks.check_scaled_dot_product_attention(uses_matmul_wrongly)
    expect_fail(result, "scores = q @ k", "shapes don't fit", status="error")
    assert ".T" not in result.hint


# ------------------------------------------------------------------ wording


def test_messages_read_as_english_and_say_what_came_back():
    expect_fail(checks.check_attention_scores(lambda q, k: (q @ k.transpose(-2, -1)).numpy()),
                "the scores are a numpy array")
    expect_fail(checks.check_scaled_dot_product_attention(lambda q, k, v, mask=None: (*sdpa(q, k, v, mask), None)),
                "returned a tuple of 3 (tensor (2, 3, 4, 5), tensor (2, 3, 4, 6), none)")
    expect_fail(checks.check_scaled_dot_product_attention(lambda q, k, v, mask=None: sdpa(q, k, v, mask)[0]),
                "returned one tensor (2, 3, 4, 5)")


def test_check_labels_are_plain_words():
    names = {checks.check_scaled_dot_product_attention(sdpa).name, checks.check_causal_mask(lambda L: None).name,
             checks.check_split_heads(lambda x, h: None).name, checks.check_multi_head_attention(lambda d, h: None).name}
    assert names == {"scaled dot-product attention", "causal mask", "split into heads", "multi-head attention"}


# ------------------------------------------------------------------ one reference, equal to mha_lib


def test_the_reference_equals_mha_lib():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64) for _ in range(3))
    mask = mha_lib.padding_mask([4, 1])
    mask = mask & torch.tensor([True, False, True, True])  # query rows are not all blocked
    for m in (None, mask, torch.zeros(4, 4, dtype=torch.bool)):
        ours, theirs = reference.attend(q, k, v, m), mha_lib.scaled_dot_product_attention(q, k, v, m)
        assert all(torch.allclose(a, b) for a, b in zip(ours, theirs))
    mha = mha_lib.MultiHeadAttention(8, 2).double()
    w = reference.projections(mha, g)
    x, src = torch.randn(2, 5, 8, generator=g, dtype=torch.float64), torch.randn(2, 3, 8, generator=g, dtype=torch.float64)
    for key, m in ((x, mha_lib.causal_mask(5)), (src, mha_lib.padding_mask([3, 2]))):
        ours = reference.multi_head(w, x, key, key, m, 2)
        theirs = mha(x, key, key, mask=m, return_weights=True)
        assert all(torch.allclose(a, b) for a, b in zip(ours, theirs))


# ------------------------------------------------------------------ a learner's profiler


def test_a_python_profiler_keeps_running_through_a_check():
    seen = []

    def profiler(frame, event, arg):
        seen.append(frame.f_code.co_name)

    sys.setprofile(profiler)
    try:
        expect_fail(checks.check_causal_mask(mha_lib.causal_mask), "the course's own answer")  # watched
        assert sys.getprofile() is profiler
    finally:
        sys.setprofile(None)
    assert "causal_mask" in seen  # the learner's profiler saw the calls made during the check


def test_cprofile_is_left_alone():
    profile = cProfile.Profile()
    profile.enable()
    try:
        expect_pass(checks.check_causal_mask(lambda L: torch.ones(L, L, dtype=torch.bool).tril()))
        assert sys.getprofile() is profile
    finally:
        profile.disable()


def test_attention_head_weights_must_be_right_when_returned():
    class Head(nn.Module):
        def __init__(self, d_model, d_k, d_v, second="weights"):
            super().__init__()
            self.W_q, self.W_k, self.W_v = nn.Linear(d_model, d_k), nn.Linear(d_model, d_k), nn.Linear(d_model, d_v)
            self.second = second

        def forward(self, query, key, value, mask=None):
            scores = self.W_q(query) @ self.W_k(key).transpose(-2, -1) / math.sqrt(self.W_q.out_features)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            w = scores.softmax(-1)
            return w @ self.W_v(value), {"weights": w, "scores": scores}[self.second]

    expect_pass(checks.check_attention_head(Head))
    expect_fail(checks.check_attention_head(lambda a, b, c: Head(a, b, c, "scores")), "weights are wrong")


def test_an_error_raised_inside_the_standard_library_shows_the_learners_line():
    import copy
    import threading

    def deep_copies_a_lock(seq_len):
        return copy.deepcopy(threading.Lock())  # raises inside copy.py

    result = checks.check_causal_mask(deep_copies_a_lock)
    expect_fail(result, "raised TypeError", status="error")
    assert "return copy.deepcopy(threading.Lock())" in result.message


def test_testing_a_mask_for_truth_gets_a_hint_that_names_it():
    def if_mask(q, k, v, mask=None):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = scores.softmax(-1)
        return w @ v, w

    expect_fail(checks.check_scaled_dot_product_attention(if_mask), "if mask:", "if mask is not none", status="error")


# ------------------------------------------------------------------ issue 22: the later chapters' checks
# Each kind of wrong answer that once passed (or got a hint naming another cause) is rejected with a
# hint that names it; the right answers written in other ways keep passing.

import torch.nn.functional as F  # noqa: E402


def _rope(x, pos, dtype=None):
    """Half-split RoPE; ``dtype``: the dtype of the angles (float32 loses float64's precision)."""
    half = x.size(-1) // 2
    dtype = dtype or x.dtype
    angle = pos.to(x.device, dtype)[:, None] * 10000 ** (-2 * torch.arange(half, dtype=dtype, device=x.device) / x.size(-1))
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def _rope_hf(x, pos):
    """Hugging Face's way, in x's dtype: x * cos + rotate_half(x) * sin with every angle written twice."""
    d = x.size(-1)
    freqs = pos.to(x.device, x.dtype)[:, None] / 10000 ** (torch.arange(0, d, 2, device=x.device).to(x.dtype) / d)
    emb = torch.cat([freqs, freqs], dim=-1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


@pytest.mark.parametrize("fn", [
    lambda x, h: x.unflatten(-1, (h, -1)).transpose(1, 2),
    lambda x, h: torch.stack(x.chunk(h, dim=-1), dim=1),
])
def test_split_heads_written_otherwise_passes(fn):
    expect_pass(checks.check_split_heads(fn))


def test_split_heads_must_keep_the_dtype():
    expect_fail(checks.check_split_heads(lambda x, h: x.float().view(x.size(0), x.size(1), h, -1).transpose(1, 2)),
                "dtype torch.float32 for inputs of dtype torch.float64")


def _softmax_by_hand(q, k, v, mask=None):
    """exp(s) / sum(exp(s)) without the maximum: right for small scores, inf / inf for large ones."""
    e = torch.exp(q @ k.mT / math.sqrt(q.size(-1)))
    if mask is not None:
        e = e * mask
    total = e.sum(-1, keepdim=True)
    w = torch.where(total > 0, e / total.clamp_min(1e-30), torch.zeros_like(e))
    return w @ v, w


def test_attention_without_the_maximum_overflows_and_is_named():
    expect_fail(checks.check_masked_attention(_softmax_by_hand), "inf or nan", "without subtracting the maximum",
                "exp(100)")
    expect_fail(checks.check_scaled_dot_product_attention(_softmax_by_hand), "without subtracting the maximum")


def test_masked_attention_with_type_as_and_additive_masks_passes():
    def type_as(q, k, v, mask=None):
        out, w = sdpa_safe_where(q.double(), k.double(), v.double(), mask)
        return out.type_as(q), w.type_as(q)

    def additive(q, k, v, mask=None):
        s = q @ k.mT * q.size(-1) ** -0.5
        keep = torch.ones(1, dtype=torch.bool, device=q.device)
        if mask is not None:
            s = s + torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, -1e30)
            keep = mask.any(-1, keepdim=True)
        w = s.softmax(-1) * keep
        return w @ v, w

    expect_pass(checks.check_masked_attention(type_as))
    expect_pass(checks.check_masked_attention(additive))


def test_attention_checks_name_a_tensor_made_on_the_cpu():
    """Right on the CPU, a crash on a GPU: the attention checks run once more on the meta device."""
    def filled_on_cpu(q, k, v, mask=None):
        s = q @ k.mT * q.size(-1) ** -0.5
        if mask is not None:
            s = torch.where(mask, s, torch.full(s.shape, float("-inf"), dtype=s.dtype))  # the CPU, always
        w = s.softmax(-1)
        return w @ v, w

    def zeros_on_cpu(q, k, v, mask=None):
        scores = q @ k.mT / math.sqrt(q.shape[-1])
        scores = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
        empty = torch.isneginf(scores).all(-1, keepdim=True)
        weights = torch.where(empty, torch.zeros(scores.shape, dtype=q.dtype), scores.masked_fill(empty, 0.0).softmax(-1))
        return weights @ v, weights

    expect_fail(checks.check_scaled_dot_product_attention(filled_on_cpu), "device 'meta'",
                "it is the device that fails", status="error")
    expect_fail(checks.check_masked_attention(zeros_on_cpu), "device 'meta'", "it is the device that fails",
                status="error")


# 6.1: precision


def test_apply_rotary_precision_must_be_kept():
    expect_fail(checks.check_apply_rotary(lambda x, p: _rope(x.float(), p)), "dtype torch.float32")
    result = checks.check_apply_rotary(lambda x, p: _rope(x, p, dtype=torch.float32))  # cast back: still float32's digits
    expect_fail(result, "float32", "dtype=x.dtype")
    assert "half-split" not in str(result)  # the pairing is right: don't blame it


def test_apply_rotary_hf_style_and_cast_back_pass_when_precise():
    expect_pass(checks.check_apply_rotary(_rope_hf))
    expect_pass(checks.check_apply_rotary(lambda x, p: _rope(x.double(), p).to(x.dtype)))


def test_apply_rotary_off_by_one_positions_are_named():
    expect_fail(checks.check_apply_rotary(lambda x, p: _rope(x, p + 1)), "off by one")


# 6.2: masks that are neither none nor causal, scales, positions from the wrong axis


def _rotary(q, k, v, mask=None, *, positions_from=-2, mask_mode="before", scale=None, is_causal=False):
    pos = torch.arange(q.size(positions_from))
    q, k = _rope(q, pos), _rope(k, pos)
    if is_causal:
        return F.scaled_dot_product_attention(q, k, v, is_causal=mask is not None)
    s = q @ k.mT / (math.sqrt(q.size(-1)) if scale is None else scale)
    if mask is not None and mask_mode in ("before", "inverted"):
        s = s.masked_fill(mask if mask_mode == "inverted" else ~mask, float("-inf"))
    w = s.softmax(-1)
    if mask is not None and mask_mode == "after":
        w = w * mask
    return w @ v


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda q, k, v, mask=None: _rotary(q, k, v, mask, is_causal=True), ("causal mask was used instead of the mask given",)),
    (lambda q, k, v, mask=None: _rotary(q, k, v, mask, mask_mode="inverted"), ("mask is inverted",)),
    (lambda q, k, v, mask=None: _rotary(q, k, v, mask, mask_mode="after"), ("after the softmax",)),
    (lambda q, k, v, mask=None: _rotary(q, k, v, mask, scale=q.size(-1)), ("divided by d_k instead of √d_k",)),
    (lambda q, k, v, mask=None: _rotary(q, k, v, mask, positions_from=-1), ("head dimension", "query.size(-2)")),
    (lambda q, k, v, mask=None: _rotary(q.float(), k.float(), v.float(), mask), ("dtype torch.float32",)),
])
def test_rotary_attention_names_more_mistakes(wrong, words):
    expect_fail(checks.check_rotary_attention(wrong), *words)


def test_rotary_attention_written_otherwise_passes():
    def hf_and_additive(q, k, v, mask=None):
        pos = torch.arange(q.size(-2))
        add = None if mask is None else torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))
        return F.scaled_dot_product_attention(_rope_hf(q, pos), _rope_hf(k, pos), v, attn_mask=add)

    expect_pass(checks.check_rotary_attention(hf_and_additive))
    expect_pass(checks.check_rotary_attention(lambda q, k, v, mask=None: _rotary(q, k, v, mask)))


# 10.2: block by block, with a running maximum per query


def _blockwise(q, k, v, b, *, max_mode="running", keep_m=True, skip_last=False):
    scale = q.size(-1) ** -0.5
    m = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype, device=q.device)
    if max_mode == "first":  # one maximum over the whole score matrix, taken first
        m = (q @ k.mT * scale).amax(-1, keepdim=True)
    if max_mode == "two passes":
        for st in range(0, k.size(-2), b):
            m = torch.maximum(m, (q @ k[..., st:st + b, :].mT * scale).amax(-1, keepdim=True))
    l, o = torch.zeros_like(m), torch.zeros(*q.shape[:-1], v.size(-1), dtype=q.dtype, device=q.device)
    end = k.size(-2) // b * b if skip_last else k.size(-2)
    for st in range(0, end, b):
        s = q @ k[..., st:st + b, :].mT * scale
        if max_mode == "none":
            p = s.exp()
            l, o = l + p.sum(-1, keepdim=True), o + p @ v[..., st:st + b, :]
            continue
        if max_mode in ("first", "two passes"):
            p = (s - m).exp()
            l, o = l + p.sum(-1, keepdim=True), o + p @ v[..., st:st + b, :]
            continue
        m_new = torch.maximum(m, s.amax() if max_mode == "scalar" else s.amax(-1, keepdim=True))
        p, f = (s - m_new).exp(), (m - m_new).exp()
        l, o = l * f + p.sum(-1, keepdim=True), o * f + p @ v[..., st:st + b, :]
        if keep_m:
            m = m_new
    return o / l


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda q, k, v, b: torch.softmax(q @ k.mT / math.sqrt(q.size(-1)), -1) @ v, ("not blockwise", "(..., 5, 11)")),
    (lambda q, k, v, b: _blockwise(q, k, v, b, max_mode="first"), ("not blockwise",)),
    (lambda q, k, v, b: _blockwise(q, k, v, b, max_mode="two passes"), ("computed twice", "first pass")),
    (lambda q, k, v, b: _blockwise(q, k, v, b, max_mode="none"), ("without subtracting a running maximum", "overflow")),
    (lambda q, k, v, b: _blockwise(q, k, v, b, max_mode="scalar"), ("shared by all queries", "amax(dim=-1")),
    (lambda q, k, v, b: _blockwise(q, k, v, b, keep_m=False), ("m = m_new is missing",)),
    (lambda q, k, v, b: _blockwise(q, k, v, b, skip_last=True), ("last, shorter block", "was skipped")),
    (lambda q, k, v, b: _blockwise(q.float(), k.float(), v.float(), b), ("dtype torch.float32",)),
])
def test_blockwise_attention_names_more_mistakes(wrong, words):
    expect_fail(checks.check_blockwise_attention(wrong), *words)


def test_blockwise_attention_written_otherwise_passes():
    def split_einsum(q, k, v, b):
        m = l = o = None
        for kb, vb in zip(k.split(b, dim=-2), v.split(b, dim=-2)):
            s = torch.einsum("...qd,...kd->...qk", q, kb) / q.size(-1) ** 0.5
            if m is None:
                m = s.amax(-1, keepdim=True)
                p = (s - m).exp()
                l, o = p.sum(-1, keepdim=True), p @ vb
                continue
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p, f = (s - m_new).exp(), (m - m_new).exp()
            l, o, m = l * f + p.sum(-1, keepdim=True), o * f + p @ vb, m_new
        return o / l

    expect_pass(checks.check_blockwise_attention(split_einsum))
    expect_pass(checks.check_blockwise_attention(_blockwise))


# 11.1 and 11.2


def test_sliding_window_without_the_lower_bound_is_named():
    def upper_only(L, w):
        i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
        return i - j < w

    expect_fail(checks.check_sliding_window_mask(upper_only), "lower bound i - j >= 0 is missing")
    def with_a_sink(L, w):  # key 0 always visible: no known mistake explains it
        i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
        return (i - j >= 0) & ((i - j < w) | (j == 0))

    result = checks.check_sliding_window_mask(with_a_sink)
    expect_fail(result, "query 3 may attend to keys 0, 1, 2, 3, expected keys 1, 2, 3")
    expect_pass(checks.check_sliding_window_mask(lambda L, w: torch.ones(L, L, dtype=torch.bool).tril().triu(-(w - 1))))


def test_repeat_kv_keeps_the_dtype_and_says_which_heads_came_from_where():
    expect_fail(checks.check_repeat_kv(lambda x, n: torch.repeat_interleave(x.float(), n, dim=1)), "dtype torch.float32")
    result = checks.check_repeat_kv(lambda x, n: torch.repeat_interleave(x, n, dim=2).reshape(
        x.size(0), -1, x.size(2), x.size(3)))
    expect_fail(result, "none of its heads is a head of x")
    expect_pass(checks.check_repeat_kv(lambda x, n: x[:, torch.arange(x.size(1) * n) // n]))


# 11.3: state kept between calls, precision, and the cache's own mistakes


def _cached(q, k, v, kc, vc, *, start=None, q_start=None, rerotate=False, diagonal=None, twice=False, only_new=False,
            cast=None):
    T, n = kc.size(-2), q.size(-2)
    pos = torch.arange(n, device=q.device) + (T if start is None else start)
    q = mha_lib.apply_rotary(q, pos if q_start is None else torch.arange(q_start, q_start + n, device=q.device))
    k_rot = mha_lib.apply_rotary(k, pos)
    k_all = (mha_lib.apply_rotary(torch.cat([kc, k], -2), torch.arange(T + n, device=q.device)) if rerotate
             else torch.cat([kc, k_rot], -2))
    v_all = torch.cat([vc, v], -2)
    mask = torch.ones(n, T + n, dtype=torch.bool, device=q.device).tril(diagonal=T if diagonal is None else diagonal(T))
    out = mha_lib.scaled_dot_product_attention(q, k_all, v_all, mask)[0]
    if twice:
        k_all, v_all = torch.cat([k_all, k_rot], -2), torch.cat([v_all, v], -2)
    if only_new:
        k_all, v_all = k_rot, v
    if cast is not None:
        k_all, v_all = k_all.to(cast), v_all.to(cast)
    return out, k_all, v_all


class _GlobalCache:
    """Keeps its own cache (reset on an empty one) and ignores the caches it is given."""

    def __init__(self):
        self.k = self.v = None

    def __call__(self, q, k, v, kc, vc):
        if self.k is None or kc.size(-2) == 0:
            self.k, self.v = kc.clone(), vc.clone()
        T, n = self.k.size(-2), q.size(-2)
        pos = torch.arange(T, T + n)
        q, k = mha_lib.apply_rotary(q, pos), mha_lib.apply_rotary(k, pos)
        self.k, self.v = torch.cat([self.k, k], -2), torch.cat([self.v, v], -2)
        mask = torch.ones(n, T + n, dtype=torch.bool).tril(diagonal=T)
        return mha_lib.scaled_dot_product_attention(q, self.k, self.v, mask)[0], self.k, self.v


class _StepCounter:
    """Counts the positions itself, across calls."""

    def __init__(self):
        self.step = 0

    def __call__(self, q, k, v, kc, vc):
        n = q.size(-2)
        out = _cached(q, k, v, kc, vc, start=self.step)
        self.step += n
        return out


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda: _GlobalCache(), ("called twice with the same arguments", "keeps state between calls")),
    (lambda: _StepCounter(), ("called twice with the same arguments", "step counter")),
    (lambda: lambda *a: _cached(*a, cast=torch.float32), ("dtype torch.float32",)),
    (lambda: lambda *a: _cached(*a, rerotate=True), ("cached keys were rotated again",)),
    (lambda: lambda *a: _cached(*a, q_start=0), ("queries' positions restart at 0",)),
    (lambda: lambda *a: _cached(*a, diagonal=lambda T: T - 1), ("hides each new token from itself",)),
    (lambda: lambda q, k, v, kc, vc: _cached(q, k, v, kc, vc, start=kc.size(-2) + 1), ("positions start at 1",)),
    (lambda: lambda *a: _cached(*a, twice=True), ("appended twice",)),
    (lambda: lambda *a: _cached(*a, only_new=True), ("only the new chunk was returned",)),
])
def test_cached_attention_names_more_mistakes(wrong, words):
    expect_fail(checks.check_cached_attention(wrong()), *words)


def test_cached_attention_written_otherwise_passes():
    def hf_additive(q, k, v, kc, vc):
        T, n = kc.shape[-2], q.shape[-2]
        pos = torch.arange(T, T + n, device=q.device)
        q, k = _rope_hf(q, pos), _rope_hf(k, pos)
        kc, vc = torch.cat((kc, k), -2), torch.cat((vc, v), -2)
        later = torch.arange(T + n, device=q.device)[None] > pos[:, None]  # (n, T + n)
        add = torch.zeros(n, T + n, dtype=q.dtype, device=q.device).masked_fill(later, float("-inf"))
        return F.scaled_dot_product_attention(q, kc, vc, attn_mask=add), kc, vc

    expect_pass(checks.check_cached_attention(hf_additive))
    expect_pass(checks.check_cached_attention(_cached))


# 12.1 and 12.2: an inverted mask is the swapped one


def test_an_inverted_halves_mask_is_named_as_well_as_swapped_heads():
    expect_fail(checks.check_halves_mask(lambda L: ~halves_right(L)), "heads are swapped", "mask is inverted")
    expect_fail(checks.check_halves_mask(lambda L: halves_right(L) & halves_right(L).transpose(1, 2)),
                "both the queries and the keys")
    result = checks.check_halves_mask(lambda L: halves_right(L) | torch.eye(L, dtype=torch.bool))
    expect_fail(result, "query", "expected key")  # no known mistake: which row differs, and how


def test_restricted_attention_names_an_inverted_mask_and_weights_zeroed_after_the_softmax():
    def by_hand(mha, x, after=False, additive=False):
        B, L, D = x.shape
        q, k, v = (f(x).view(B, L, 2, D // 2).transpose(1, 2) for f in (mha.W_q, mha.W_k, mha.W_v))
        s = q @ k.mT / math.sqrt(D // 2)
        keep = halves_right(L).to(x.device)
        if additive:
            s = s + torch.zeros(2, L, L, dtype=x.dtype, device=x.device).masked_fill(~keep, float("-inf"))
            w = s.softmax(-1)
        elif after:
            w = s.softmax(-1) * keep
        else:
            w = s.masked_fill(~keep, float("-inf")).softmax(-1)
        return mha.W_o((w @ v).transpose(1, 2).reshape(B, L, D)), w

    expect_fail(checks.check_restricted_attention(
        lambda mha, x: mha(x, x, x, mask=~halves_right(x.size(1)), return_weights=True)),
        "heads are swapped", "mask is inverted")
    expect_fail(checks.check_restricted_attention(lambda mha, x: by_hand(mha, x, after=True)),
                "after the softmax", "without renormalising")
    expect_pass(checks.check_restricted_attention(by_hand))
    expect_pass(checks.check_restricted_attention(lambda mha, x: by_hand(mha, x, additive=True)))


def test_restricted_attention_needs_the_mask_on_the_inputs_device():
    """Right on the CPU, wrong on a GPU: the check runs the function once more on the meta device."""
    result = checks.check_restricted_attention(
        lambda mha, x: mha(x, x, x, mask=halves_right(x.size(1)), return_weights=True))
    expect_fail(result, "device 'meta'", "mask is on cpu", "it is the device that fails", "to(x.device)",
                status="error")
    expect_pass(checks.check_restricted_attention(
        lambda mha, x: mha(x, x, x, mask=halves_right(x.size(1)).to(x.device), return_weights=True)))


# every check: a stub of an earlier exercise is named, and the verdict comes within a second


def test_a_check_waiting_on_an_earlier_exercise_says_so():
    def halves_mask(seq_len):
        raise NotImplementedError

    def restricted_attention(mha, x):
        return mha(x, x, x, mask=halves_mask(x.size(1)), return_weights=True)

    result = checks.check_restricted_attention(restricted_attention)
    expect_fail(result, "it calls halves_mask, which still raises notimplementederror", status="not implemented")

    def stub(mha, x):
        raise NotImplementedError

    assert checks.check_restricted_attention(stub).message == "not implemented yet (it raises NotImplementedError)"


@pytest.mark.parametrize(("check", "fn"), [
    (checks.check_blockwise_attention, _blockwise),
    (checks.check_cached_attention, _cached),
    (checks.check_rotary_attention, lambda q, k, v, mask=None: _rotary(q, k, v, mask)),
    (checks.check_masked_attention, sdpa_safe_where),
])
def test_each_verdict_comes_within_a_second(check, fn):
    import time

    check(fn)  # warm up PyTorch's kernels
    start = time.perf_counter()
    expect_pass(check(fn))
    assert time.perf_counter() - start < 1.0


def test_blockwise_attention_with_the_first_blocks_maximum_only_fails():
    """A maximum taken from the first block and never updated: right until a later block scores higher."""
    def first_block_max(q, k, v, block_size):
        m = (q @ k[..., :block_size, :].mT / math.sqrt(q.size(-1))).amax(-1, keepdim=True)
        total = torch.zeros_like(m)
        out = torch.zeros(*q.shape[:-1], v.size(-1), dtype=q.dtype, device=q.device)
        for start in range(0, k.size(-2), block_size):
            p = (q @ k[..., start:start + block_size, :].mT / math.sqrt(q.size(-1)) - m).exp()
            total, out = total + p.sum(-1, keepdim=True), out + p @ v[..., start:start + block_size, :]
        return out / total

    expect_fail(checks.check_blockwise_attention(first_block_max), "inf or nan", "never raised", "running maximum")
