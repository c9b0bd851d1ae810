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
from mha_lib.checks import _reference

from test_checks import MHA, MHAWithLibrary, expect_fail, expect_pass, halves_right, sdpa, sdpa_safe_where


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
        ours, theirs = _reference.attend(q, k, v, m), mha_lib.scaled_dot_product_attention(q, k, v, m)
        assert all(torch.allclose(a, b) for a, b in zip(ours, theirs))
    mha = mha_lib.MultiHeadAttention(8, 2).double()
    w = _reference.projections(mha, g)
    x, src = torch.randn(2, 5, 8, generator=g, dtype=torch.float64), torch.randn(2, 3, 8, generator=g, dtype=torch.float64)
    for key, m in ((x, mha_lib.causal_mask(5)), (src, mha_lib.padding_mask([3, 2]))):
        ours = _reference.multi_head(w, x, key, key, m, 2)
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
