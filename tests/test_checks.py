"""The exercise checks: they pass right answers, fail each common mistake with its hint,
and never crash on broken code.

Each wrong implementation below is a mistake learners make; the test asserts that the
check fails *and* that its message or hint names that mistake.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mha_lib
from mha_lib import checks
from conftest import MHA, MHAWithLibrary, expect_fail, expect_pass, halves_right, sdpa, sdpa_safe_where
from mha_lib.checks import CheckResult


# ------------------------------------------------------------------ attention


def sdpa_einsum(query, key, value, mask=None):
    scores = torch.einsum("...qd,...kd->...qk", query, key) * query.shape[-1] ** -0.5
    if mask is not None:
        scores = torch.where(mask, scores, torch.tensor(-1e9, dtype=scores.dtype))
    weights = F.softmax(scores, dim=-1)
    return torch.einsum("...qk,...kv->...qv", weights, value), weights


def sdpa_safe(q, k, v, mask=None):
    out, weights = sdpa(q, k, v, mask)
    weights = torch.nan_to_num(weights, nan=0.0)
    return weights @ v, weights


@pytest.mark.parametrize("fn", [sdpa, sdpa_einsum, sdpa_safe_where], ids=["matmul", "einsum+where", "guarded"])
def test_sdpa_check_passes_right_answers(fn):
    expect_pass(checks.check_scaled_dot_product_attention(fn))


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(scale=lambda q, k, v: 1.0), ["not scaled", "math.sqrt(d_k)"]),
        (dict(scale=lambda q, k, v: q.size(-1)), ["divided by d_k instead of √d_k"]),
        (dict(scale=lambda q, k, v: math.sqrt(v.size(-1))), ["√d_v"]),
        (dict(scale=lambda q, k, v: math.sqrt(k.size(-2))), ["√lk", "not by a sequence length"]),
        (dict(scale=lambda q, k, v: 1 / math.sqrt(q.size(-1))), ["multiplied by √d_k"]),
        (dict(dim=-2), ["softmax ran over the queries", "dim=-1"]),
        (dict(invert=True), ["mask is inverted", "~mask"]),
        (dict(mask_after=True), ["mask was applied after the softmax"]),
        (dict(values=False), ["multiplied with the keys", "weights @ value"]),
    ],
)
def test_sdpa_check_names_each_mistake(kwargs, words):
    expect_fail(checks.check_scaled_dot_product_attention(lambda q, k, v, mask=None: sdpa(q, k, v, mask, **kwargs)), *words)


def test_sdpa_check_catches_an_ignored_mask():
    expect_fail(checks.check_scaled_dot_product_attention(lambda q, k, v, mask=None: sdpa(q, k, v)), "mask was ignored")


def test_sdpa_check_catches_values_never_multiplied_in():
    def returns_weights(q, k, v, mask=None):
        _, w = sdpa(q, k, v, mask)
        return w, w

    expect_fail(checks.check_scaled_dot_product_attention(returns_weights), "values were never multiplied in")


def test_sdpa_check_stubs_read_not_implemented():
    def raises(q, k, v, mask=None):
        raise NotImplementedError

    def returns_none(q, k, v, mask=None):
        pass

    for fn in (raises, returns_none):
        expect_fail(checks.check_scaled_dot_product_attention(fn), "not implemented yet", status="not implemented")


def test_sdpa_check_reports_exceptions_with_a_hint():
    def uses_dot_t(q, k, v, mask=None):
        scores = q @ k.T  # wrong for batched tensors
        return scores, scores

    with pytest.warns(UserWarning):
        result = checks.check_scaled_dot_product_attention(uses_dot_t)
    expect_fail(result, "raised RuntimeError", ".transpose(-2, -1)", status="error")
    assert "line" in result.message and "scores = q @ k.T" in result.message  # points at the learner's line


def test_self_attention_check_names_a_needless_transpose_of_a_matrix():
    """2.1 gives W_q as (d_model, d_k): x @ W_q.T is the mistake, not .T on a tensor of many axes."""
    def transposes(x, W_q, W_k, W_v):
        q, k, v = x @ W_q.T, x @ W_k.T, x @ W_v.T
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.size(-1)), dim=-1)
        return weights @ v, weights

    def right(x, W_q, W_k, W_v):
        q, k, v = x @ W_q, x @ W_k, x @ W_v
        weights = torch.softmax(q @ k.mT / math.sqrt(W_q.shape[1]), dim=-1)
        return weights @ v, weights

    result = checks.check_self_attention(transposes)
    expect_fail(result, "raised RuntimeError", "W_q is a matrix (6, 4)", "the transpose is the mistake",
                "drop the .T", status="error")
    assert "more than two axes" not in result.hint
    expect_pass(checks.check_self_attention(right))


def test_sdpa_check_names_wrong_types_and_shapes():
    expect_fail(checks.check_scaled_dot_product_attention(lambda q, k, v, mask=None: sdpa(q, k, v, mask)[0]),
                "returned one tensor", "return output, weights")
    expect_fail(checks.check_scaled_dot_product_attention(
        lambda q, k, v, mask=None: tuple(t.numpy() for t in sdpa(q, k, v, mask))), "numpy array")

    class EqualsEverything:
        shape = None

        def __eq__(self, other):
            return True

    expect_fail(checks.check_scaled_dot_product_attention(lambda q, k, v, mask=None: (EqualsEverything(),) * 2),
                "equalseverything, not a torch.tensor")
    expect_fail(checks.check_scaled_dot_product_attention(
        lambda q, k, v, mask=None: (sdpa(q, k, v, mask)[0][..., 0], sdpa(q, k, v, mask)[1])),
        "the output has shape (2, 3, 4), expected (2, 3, 4, 5)")


def test_sdpa_check_reports_inplace_changes():
    def scales_in_place(q, k, v, mask=None):
        q /= math.sqrt(q.size(-1))
        scores = q @ k.transpose(-2, -1)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = scores.softmax(-1)
        return w @ v, w

    expect_fail(checks.check_scaled_dot_product_attention(scales_in_place), "changed its input `query` in place")


def test_sdpa_check_refuses_the_course_answer():
    expect_fail(checks.check_scaled_dot_product_attention(mha_lib.scaled_dot_product_attention),
                "calls mha_lib.scaled_dot_product_attention")


def test_check_restores_the_random_state():
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    checks.check_scaled_dot_product_attention(sdpa)
    assert torch.equal(torch.rand(3), expected)


def test_results_display_in_text_and_html():
    ok = checks.check_scaled_dot_product_attention(sdpa)
    bad = checks.check_scaled_dot_product_attention(lambda q, k, v, mask=None: sdpa(q, k, v, mask, dim=-2))
    assert repr(ok).startswith("✅ scaled dot-product attention: correct")
    assert "\n   Hint: " in repr(bad) and "Hint:" in bad._repr_html_() and "#cf222e" in bad._repr_html_()
    assert bool(ok) is True and bool(bad) is False


def test_masked_attention_check():
    expect_pass(checks.check_masked_attention(sdpa_safe))
    expect_pass(checks.check_masked_attention(sdpa_safe_where))
    expect_fail(checks.check_masked_attention(sdpa), "nan", "every key blocked")
    expect_fail(checks.check_masked_attention(sdpa_einsum), "-1e9", "uniformly")

    def additive_then_nan_to_num(q, k, v, mask=None):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            scores = scores + torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))
        weights = torch.nan_to_num(torch.softmax(scores, dim=-1))
        return weights @ v, weights

    expect_fail(checks.check_masked_attention(additive_then_nan_to_num), "gradients of query, key contain nan")

    def detached(q, k, v, mask=None):
        out, weights = sdpa_safe_where(q, k, v, mask)
        return out.detach(), weights.detach()

    expect_fail(checks.check_masked_attention(detached), "doesn't depend on query, key and value")


def test_attention_scores_check():
    expect_pass(checks.check_attention_scores(lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))))
    expect_pass(checks.check_attention_scores(lambda q, k: torch.einsum("...id,...jd->...ij", q / q.size(-1) ** 0.5, k)))
    expect_fail(checks.check_attention_scores(lambda q, k: q @ k.transpose(-2, -1)), "not scaled")
    expect_fail(checks.check_attention_scores(lambda q, k: q @ k.transpose(-2, -1) / q.size(-1)), "divided by d_k")
    expect_fail(checks.check_attention_scores(lambda q, k: k @ q.transpose(-2, -1) / math.sqrt(q.size(-1))),
                "rows are queries")


# ------------------------------------------------------------------ masks


@pytest.mark.parametrize("fn", [
    lambda L: torch.ones(L, L, dtype=torch.bool).tril(),
    lambda L: torch.arange(L)[:, None] >= torch.arange(L)[None, :],
], ids=["tril", "arange"])
def test_causal_mask_check_passes(fn):
    expect_pass(checks.check_causal_mask(fn))


@pytest.mark.parametrize(
    ("fn", "words"),
    [
        (lambda L: torch.ones(L, L, dtype=torch.bool).triu(1), ["inverted"]),
        (lambda L: torch.ones(L, L, dtype=torch.bool).tril(-1), ["hides each token from itself"]),
        (lambda L: torch.ones(L, L, dtype=torch.bool).triu(), ["see the future"]),
        (lambda L: torch.ones(L, L).tril(), ["dtype torch.float32", ".bool()"]),
        (lambda L: torch.ones(L, L, dtype=torch.bool), ["nothing is blocked"]),
        (lambda L: torch.ones(L, L, dtype=torch.bool).tril()[None], ["shape (1, 4, 4), expected (4, 4)"]),
        (lambda L: np.tril(np.ones((L, L), dtype=bool)), ["numpy array"]),
    ],
)
def test_causal_mask_check_names_each_mistake(fn, words):
    expect_fail(checks.check_causal_mask(fn), *words)


def test_padding_mask_check():
    def right(lengths, max_len=None):
        max_len = max(lengths) if max_len is None else max_len
        return (torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]

    def right_loop(lengths, max_len=None):
        mask = torch.zeros(len(lengths), 1, 1, max_len or max(lengths), dtype=torch.bool)
        for b, n in enumerate(lengths):
            mask[b, ..., :n] = True
        return mask

    expect_pass(checks.check_padding_mask(right))
    expect_pass(checks.check_padding_mask(right_loop))
    expect_fail(checks.check_padding_mask(lambda l, m=None: ~right(l, m)), "inverted")
    expect_fail(checks.check_padding_mask(lambda l, m=None: right(l, m)[:, 0, 0]), "add axes")
    expect_fail(checks.check_padding_mask(
        lambda l, m=None: (torch.arange(m or max(l))[None, :] <= torch.tensor(l)[:, None])[:, None, None, :]),
        "off by one")


def test_causal_padding_mask_check():
    def right(lengths, L):
        return mha_lib.causal_mask(L) & mha_lib.padding_mask(lengths, L)[:, :, 0:1].expand(-1, 1, L, L)

    def right_broadcast(lengths, L):
        causal = torch.ones(L, L, dtype=torch.bool).tril()
        keep = torch.arange(L) < torch.tensor(lengths)[:, None]  # (B, L)
        return causal[None, None] & keep[:, None, None, :]

    expect_pass(checks.check_causal_padding_mask(right))
    expect_pass(checks.check_causal_padding_mask(right_broadcast))
    expect_fail(checks.check_causal_padding_mask(
        lambda l, L: mha_lib.causal_mask(L).expand(len(l), 1, L, L)), "only the causal part")
    expect_fail(checks.check_causal_padding_mask(
        lambda l, L: mha_lib.causal_mask(L) | mha_lib.padding_mask(l, L)), "| (or)")
    expect_fail(checks.check_causal_padding_mask(lambda l, L: right_broadcast(l, L)[:, 0]), "axis of size 1 for the heads")


# ------------------------------------------------------------------ heads


def split_view(x, num_heads):
    B, L, D = x.shape
    return x.view(B, L, num_heads, D // num_heads).transpose(1, 2)


def split_unflatten(x, num_heads):
    return x.unflatten(-1, (num_heads, -1)).permute(0, 2, 1, 3)


def combine_reshape(x):
    B, H, L, d = x.shape
    return x.transpose(1, 2).reshape(B, L, H * d)


def combine_cat(x):
    return torch.cat(x.unbind(1), dim=-1)


@pytest.mark.parametrize("fn", [split_view, split_unflatten])
def test_split_check_passes(fn):
    expect_pass(checks.check_split_heads(fn))


@pytest.mark.parametrize("fn", [combine_reshape, combine_cat])
def test_combine_check_passes(fn):
    expect_pass(checks.check_combine_heads(fn))


def test_split_check_names_each_mistake():
    expect_fail(checks.check_split_heads(
        lambda x, h: x.reshape(x.size(0), h, x.size(1), -1)), "without the transpose", ".transpose(1, 2)")
    expect_fail(checks.check_split_heads(
        lambda x, h: x.view(x.size(0), x.size(1), h, -1)), "stopped after the view")
    expect_fail(checks.check_split_heads(
        lambda x, h: x.view(x.size(0), x.size(1), -1, h).permute(0, 3, 1, 2)), "every h-th feature")


def test_combine_check_names_each_mistake():
    expect_fail(checks.check_combine_heads(
        lambda x: x.reshape(x.size(0), x.size(2), -1)), "reshape without the transpose")
    expect_fail(checks.check_combine_heads(
        lambda x: x.transpose(1, 2).view(x.size(0), x.size(2), -1)), "view() needs a contiguous tensor", status="error")


def test_mha_check_passes_right_answers():
    expect_pass(checks.check_multi_head_attention(MHA))
    expect_pass(checks.check_multi_head_attention(MHAWithLibrary))


@pytest.mark.parametrize(
    ("kwargs", "words", "status"),
    [
        (dict(out_proj=False), ["output projection w_o is missing"], "failed"),
        (dict(scale="d_model"), ["√d_model instead of √d_k"], "failed"),
        (dict(transpose=False), ["split without the transpose"], "failed"),
        (dict(book_bug=True), ["attributeerror", "self.d_v, which it never defines"], "error"),
    ],
)
def test_mha_check_names_each_mistake(kwargs, words, status):
    cls = lambda d, h: MHA(d, h, **kwargs)  # noqa: E731
    expect_fail(checks.check_multi_head_attention(cls), *words, status=status)


def test_mha_check_catches_combine_without_transpose_and_missing_attributes():
    class CombineNoTranspose(MHA):
        def forward(self, query, key, value, mask=None):
            B = query.size(0)
            q, k, v = (split_view(f(x), self.h) for f, x in ((self.W_q, query), (self.W_k, key), (self.W_v, value)))
            heads, _ = sdpa(q, k, v, mask)
            return self.W_o(heads.reshape(B, -1, self.h * self.d_k))

    class NoViewContiguous(MHA):
        def forward(self, query, key, value, mask=None):
            B = query.size(0)
            q, k, v = (split_view(f(x), self.h) for f, x in ((self.W_q, query), (self.W_k, key), (self.W_v, value)))
            heads, _ = sdpa(q, k, v, mask)
            return self.W_o(heads.transpose(1, 2).view(B, -1, self.h * self.d_k))

    class Renamed(nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.q_proj = nn.Linear(d, d)

    expect_fail(checks.check_multi_head_attention(CombineNoTranspose), "combined without the transpose")
    expect_fail(checks.check_multi_head_attention(NoViewContiguous), ".contiguous()", status="error")
    expect_fail(checks.check_multi_head_attention(Renamed), "no attribute w_q")
    expect_fail(checks.check_multi_head_attention(mha_lib.MultiHeadAttention), "the course's own answer")


def test_mha_check_survives_a_broken_constructor():
    class Broken(nn.Module):
        def __init__(self, d_model, num_heads):
            raise ValueError("oops")

    expect_fail(checks.check_multi_head_attention(Broken), "raised valueerror: oops", status="error")


def test_attention_head_check():
    class Head(nn.Module):
        def __init__(self, d_model, d_k, d_v, scale_by_model=False):
            super().__init__()
            self.W_q, self.W_k, self.W_v = nn.Linear(d_model, d_k), nn.Linear(d_model, d_k), nn.Linear(d_model, d_v)
            self.scale = math.sqrt(d_model if scale_by_model else d_k)

        def forward(self, query, key, value, mask=None):
            scores = self.W_q(query) @ self.W_k(key).transpose(-2, -1) / self.scale
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            w = scores.softmax(-1)
            return w @ self.W_v(value), w

    class HeadInOneLine(nn.Module):  # another right answer: default layers, a different body
        def __init__(self, d_model, d_k, d_v):
            super().__init__()
            self.W_q, self.W_k = nn.Linear(d_model, d_k, bias=True), nn.Linear(d_model, d_k)
            self.W_v = nn.Linear(d_model, d_v)

        def forward(self, query, key, value, mask=None):
            return mha_lib.scaled_dot_product_attention(self.W_q(query), self.W_k(key), self.W_v(value), mask)[0]

    def no_bias(d_model, d_k, d_v):
        head = Head(d_model, d_k, d_v)
        head.W_q, head.W_k = nn.Linear(d_model, d_k, bias=False), nn.Linear(d_model, d_k, bias=False)
        return head

    expect_pass(checks.check_attention_head(Head))
    expect_pass(checks.check_attention_head(HeadInOneLine))
    expect_fail(checks.check_attention_head(lambda a, b, c: Head(a, b, c, scale_by_model=True)), "√d_model")
    expect_fail(checks.check_attention_head(no_bias), "w_q, w_k were built with bias=false", "default layers",
                "without bias=false")


def test_self_attention_check():
    def right(x, W_q, W_k, W_v):
        q, k, v = x @ W_q, x @ W_k, x @ W_v
        w = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(W_k.shape[1]), dim=-1)
        return w @ v, w

    def right_einsum(x, W_q, W_k, W_v):
        scores = torch.einsum("bid,de,bje,->bij", x, W_q, x @ W_k) if False else torch.einsum(
            "bie,bje->bij", x @ W_q, x @ W_k) / W_q.shape[-1] ** 0.5
        w = scores.softmax(-1)
        return torch.einsum("bij,bjv->biv", w, x @ W_v), w

    def by_d_model(x, W_q, W_k, W_v):
        q, k, v = x @ W_q, x @ W_k, x @ W_v
        w = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(x.shape[-1]), dim=-1)
        return w @ v, w

    expect_pass(checks.check_self_attention(right))
    expect_pass(checks.check_self_attention(right_einsum))
    expect_fail(checks.check_self_attention(by_d_model), "√d_model instead of √d_k")


def test_parameter_count_check():
    expect_pass(checks.check_parameter_count(lambda d, h, bias=True: 4 * d * d + (4 * d if bias else 0)))
    expect_pass(checks.check_parameter_count(
        lambda d, h, bias=True: sum(p.numel() for p in mha_lib.MultiHeadAttention(d, h, bias=bias).parameters())))
    expect_fail(checks.check_parameter_count(lambda d, h, bias=True: 4 * d * d), "biases were left out")
    expect_fail(checks.check_parameter_count(lambda d, h, bias=True: h * (4 * d * d + 4 * d * bias)), "once per head")
    expect_fail(checks.check_parameter_count(lambda d, h, bias=True: 3 * d * d + 3 * d * bias), "w_o is missing")
    expect_fail(checks.check_parameter_count(lambda d, h, bias=True: None), "returned none")


def test_cross_attention_check():
    def right(mha, target, source, lengths):
        return mha(target, source, source, mask=mha_lib.padding_mask(lengths, max_len=source.size(1)).to(source.device))

    def right_bool_loop(mha, target, source, lengths):
        keep = torch.zeros(len(lengths), 1, 1, source.size(1), dtype=torch.bool, device=source.device)
        for b, n in enumerate(lengths):
            keep[b, ..., :n] = True
        return mha(target, source, source, mask=keep)

    expect_pass(checks.check_cross_attention(right))
    expect_pass(checks.check_cross_attention(right_bool_loop))
    expect_fail(checks.check_cross_attention(  # 4.3 asks for the output alone
        lambda m, t, s, l: m(t, s, s, mask=mha_lib.padding_mask(l, max_len=s.size(1)).to(s.device), return_weights=True)),
        "returned (output, weights)", "without return_weights=true")
    result = checks.check_cross_attention(lambda m, t, s, l: m(t, s, s, mask=mha_lib.padding_mask(l, max_len=s.size(1))))
    expect_fail(result, "device", status="error")  # the stand-in device's verdict gives the real fix
    assert "mask.to(x.device)" in result.message and "to('meta')" not in result.message + result.hint
    expect_fail(checks.check_cross_attention(lambda m, t, s, l: m(t, s, s)), "padding was not masked")
    expect_fail(checks.check_cross_attention(lambda m, t, s, l: m(s, t, t)), "source's shape")


# ------------------------------------------------------------------ chapter 05


def copy_weights(mha, *, device_dtype=True):
    weight = mha.W_q.weight
    where = dict(device=weight.device, dtype=weight.dtype) if device_dtype else {}
    theirs = nn.MultiheadAttention(mha.d_model, mha.num_heads, batch_first=True, **where)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([mha.W_q.weight, mha.W_k.weight, mha.W_v.weight]))
        theirs.in_proj_bias.copy_(torch.cat([mha.W_q.bias, mha.W_k.bias, mha.W_v.bias]))
        theirs.out_proj.weight.copy_(mha.W_o.weight)
        theirs.out_proj.bias.copy_(mha.W_o.bias)
    return theirs


def copy_weights_load_state_dict(mha):
    theirs = nn.MultiheadAttention(mha.d_model, mha.num_heads, batch_first=True).to(mha.W_q.weight)
    state = {
        "in_proj_weight": torch.cat([mha.W_q.weight, mha.W_k.weight, mha.W_v.weight]),
        "in_proj_bias": torch.cat([mha.W_q.bias, mha.W_k.bias, mha.W_v.bias]),
        "out_proj.weight": mha.W_o.weight, "out_proj.bias": mha.W_o.bias,
    }
    theirs.load_state_dict({k: v.detach().clone() for k, v in state.items()})
    return theirs


def test_copy_to_torch_check():
    expect_pass(checks.check_copy_to_torch(copy_weights))
    expect_pass(checks.check_copy_to_torch(copy_weights_load_state_dict))

    def wrong_order(mha):
        theirs = copy_weights(mha)
        with torch.no_grad():
            theirs.in_proj_weight.copy_(torch.cat([mha.W_k.weight, mha.W_q.weight, mha.W_v.weight]))
        return theirs

    def transposed(mha):
        theirs = copy_weights(mha)
        with torch.no_grad():
            theirs.in_proj_weight.copy_(torch.cat([mha.W_q.weight.T, mha.W_k.weight.T, mha.W_v.weight.T]))
        return theirs

    def no_bias(mha):
        theirs = copy_weights(mha)
        with torch.no_grad():
            theirs.in_proj_bias.zero_()
        return theirs

    def not_batch_first(mha):
        return copy_weights(mha).__class__(mha.d_model, mha.num_heads)

    expect_fail(checks.check_copy_to_torch(wrong_order), "wrong order")
    expect_fail(checks.check_copy_to_torch(transposed), "transposed")
    expect_fail(checks.check_copy_to_torch(no_bias), "biases")
    expect_fail(checks.check_copy_to_torch(not_batch_first), "batch_first=true")


def test_copy_to_torch_check_names_a_module_built_without_device_or_dtype():
    """Issue 34: a copy built without device=/dtype= crashes on a float64 or CUDA module."""
    def float64_on_the_cpu(mha):
        theirs = nn.MultiheadAttention(mha.d_model, mha.num_heads, batch_first=True, dtype=torch.float64)
        with torch.no_grad():
            theirs.in_proj_weight.copy_(torch.cat([mha.W_q.weight, mha.W_k.weight, mha.W_v.weight]))
            theirs.in_proj_bias.copy_(torch.cat([mha.W_q.bias, mha.W_k.bias, mha.W_v.bias]))
            theirs.out_proj.load_state_dict(mha.W_o.state_dict())
        return theirs

    expect_fail(checks.check_copy_to_torch(lambda mha: copy_weights(mha, device_dtype=False)),
                "float32 weights", "without dtype=", "dtype=weight.dtype")
    expect_fail(checks.check_copy_to_torch(float64_on_the_cpu), "another device", "without device=",
                "device=weight.device")


def test_mask_conversion_checks():
    expect_pass(checks.check_attn_mask_for_torch(lambda m: ~m))
    expect_pass(checks.check_attn_mask_for_torch(
        lambda m: torch.zeros(m.shape).masked_fill(~m, float("-inf"))))  # a float mask works too
    expect_fail(checks.check_attn_mask_for_torch(lambda m: m), "unchanged", "true = *blocked*")
    expect_fail(checks.check_attn_mask_for_torch(lambda m: m.float()), "0s and 1s")

    expect_pass(checks.check_key_padding_mask_for_torch(lambda keep: ~keep[:, 0, 0]))
    expect_pass(checks.check_key_padding_mask_for_torch(lambda keep: keep.squeeze(1).squeeze(1).logical_not()))
    expect_fail(checks.check_key_padding_mask_for_torch(lambda keep: keep[:, 0, 0]), "not inverted")
    expect_fail(checks.check_key_padding_mask_for_torch(lambda keep: ~keep), "drop the two middle axes")
    # a float mask of 0 and -inf is also right (PyTorch adds it to the scores), also with no padding at all
    expect_pass(checks.check_key_padding_mask_for_torch(
        lambda keep: torch.zeros(keep[:, 0, 0].shape).masked_fill(~keep[:, 0, 0], float("-inf"))))
    expect_fail(checks.check_key_padding_mask_for_torch(lambda keep: (~keep[:, 0, 0]).float()), "0s and 1s")
    expect_fail(checks.check_key_padding_mask_for_torch(lambda keep: (~keep[:, 0, 0]).long()), "dtype torch.int64")
    expect_fail(checks.check_attn_mask_for_torch(lambda m: ~m.T), "inverted and transposed", "don't transpose")


# ------------------------------------------------------------------ every check on the basics


ALL_CHECKS = [getattr(checks, name) for name in checks.__all__ if name.startswith("check_")]


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
def test_every_check_reads_a_stub_as_not_implemented(check):
    def stub(*args, **kwargs):
        raise NotImplementedError

    result = check(stub)
    assert not result and result.status == "not implemented", result
    assert "not implemented yet" in str(result)


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
def test_every_check_survives_garbage(check):
    for garbage in (lambda *a, **k: "nonsense", lambda *a, **k: 1 / 0, 42):
        result = check(garbage)
        assert isinstance(result, CheckResult) and not result, result
        assert result.status in ("failed", "error") and "bug in mha_lib.checks" not in str(result), result


# ------------------------------------------------------------------ chapter 12


def halves_arange(L):
    first = torch.arange(L) < L // 2
    return torch.stack([first, ~first]).unsqueeze(1).repeat(1, L, 1)


def halves_split_at(split):
    def fn(L):
        s = split(L)
        mask = torch.zeros(2, L, L, dtype=torch.bool)
        mask[0, :, :s] = True
        mask[1, :, s:] = True
        return mask

    return fn


def test_halves_mask_check():
    expect_pass(checks.check_halves_mask(halves_right))
    expect_pass(checks.check_halves_mask(halves_arange))
    expect_fail(checks.check_halves_mask(lambda L: halves_right(L)[[1, 0]]), "heads are swapped")
    expect_fail(checks.check_halves_mask(lambda L: halves_right(L).transpose(1, 2)), "queries are restricted instead of the keys")
    expect_fail(checks.check_halves_mask(halves_split_at(lambda L: L // 2 + 1)), "off by one")
    expect_fail(checks.check_halves_mask(halves_split_at(lambda L: L // 2 - 1)), "off by one")
    expect_fail(checks.check_halves_mask(halves_split_at(lambda L: (L + 1) // 2)), "odd lengths", "seq_len=5")
    expect_fail(checks.check_halves_mask(lambda L: halves_right(L)[0]), "expected (2, 4, 4)")
    expect_fail(checks.check_halves_mask(lambda L: halves_right(L).float()), "torch.bool")


def test_restricted_attention_check():
    def attend(mha, x, mask=None):
        return mha(x, x, x, mask=None if mask is None else mask.to(x.device), return_weights=True)

    expect_pass(checks.check_restricted_attention(lambda mha, x: attend(mha, x, halves_right(x.size(1)))))
    expect_pass(checks.check_restricted_attention(lambda mha, x: attend(mha, x, halves_arange(x.size(1))[None])))
    expect_fail(checks.check_restricted_attention(lambda mha, x: attend(mha, x)), "unrestricted")
    expect_fail(checks.check_restricted_attention(
        lambda mha, x: attend(mha, x, halves_right(x.size(1))[[1, 0]])), "heads are swapped")
    expect_fail(checks.check_restricted_attention(
        lambda mha, x: attend(mha, x, halves_right(x.size(1)).transpose(1, 2))), "queries were restricted")
    expect_fail(checks.check_restricted_attention(
        lambda mha, x: attend(mha, x, halves_right(x.size(1))[:, None])), "per sequence instead of per head")


# ------------------------------------------------------------------ chapters 07 and 10


class Encoder(nn.Module):
    """A learner-style pre-norm layer, with switches for the classic mistakes."""

    def __init__(self, d_model, num_heads, d_ff, *, mistake=None):
        super().__init__()
        self.self_attn = mha_lib.MultiHeadAttention(d_model, num_heads)
        self.feed_forward = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.mistake = mistake

    def forward(self, x, mask=None):
        if self.mistake == "post_norm":
            x = self.norm1(x + self.self_attn(x, x, x, mask=mask))
            return self.norm2(x + self.feed_forward(x))
        h = self.norm1(x)
        attended = self.self_attn(h, h, h, mask=None if self.mistake == "no_mask" else mask)
        x = attended if self.mistake == "no_residual" else x + attended
        norm = self.norm1 if self.mistake == "one_norm" else self.norm2
        return x + self.feed_forward(norm(x))


def test_encoder_layer_check():
    expect_pass(checks.check_encoder_layer(Encoder))
    expect_pass(checks.check_encoder_layer(mha_lib.EncoderLayer))  # written differently, with dropout and weights
    for mistake, words in [("post_norm", "post-norm"), ("no_residual", "no residual"), ("one_norm", "norm1 was used for both"),
                           ("no_mask", "mask was not passed")]:
        expect_fail(checks.check_encoder_layer(lambda d, h, f, m=mistake: Encoder(d, h, f, mistake=m)), words)

    class Renamed(nn.Module):
        def __init__(self, d, h, f):
            super().__init__()
            self.attention = mha_lib.MultiHeadAttention(d, h)

    expect_fail(checks.check_encoder_layer(Renamed), "no module attribute self_attn")


def ablate_by_hand(mha, x, head):
    q, k, v = (mha_lib.split_heads(f(x), mha.num_heads) for f in (mha.W_q, mha.W_k, mha.W_v))
    heads, _ = mha_lib.scaled_dot_product_attention(q, k, v)
    keep = torch.ones(mha.num_heads, 1, 1, dtype=heads.dtype, device=heads.device)
    keep[head] = 0
    return mha.W_o(mha_lib.combine_heads(heads * keep))


def ablate_with_hook(mha, x, head):
    def zero(module, args):
        concat = args[0].clone()
        concat[..., head * mha.d_k : (head + 1) * mha.d_k] = 0
        return (concat,)

    handle = mha.W_o.register_forward_pre_hook(zero)
    try:
        return mha(x, x, x)
    finally:
        handle.remove()


def test_head_ablation_check():
    expect_pass(checks.check_head_ablation(ablate_by_hand))
    expect_pass(checks.check_head_ablation(ablate_with_hook))

    def after_w_o(mha, x, head):
        y = mha(x, x, x).clone()
        y[..., head * mha.d_k : (head + 1) * mha.d_k] = 0
        return y

    def uses_the_course(mha, x, head):
        from mha_lib.sentiment import silence_heads

        with silence_heads(mha, [head]):
            return mha(x, x, x)

    def zeroes_weights(mha, x, head):
        with torch.no_grad():
            mha.W_v.weight[head * mha.d_k : (head + 1) * mha.d_k] = 0
        return mha(x, x, x)

    expect_fail(checks.check_head_ablation(after_w_o), "zeroed after w_o")
    expect_fail(checks.check_head_ablation(lambda m, x, h: ablate_by_hand(m, x, (h + 1) % 3)), "another head")
    expect_fail(checks.check_head_ablation(lambda m, x, h: m(x, x, x)), "nothing was silenced")
    expect_fail(checks.check_head_ablation(uses_the_course), "silence_heads, the course's own answer")
    expect_fail(checks.check_head_ablation(zeroes_weights), "changed the module's weights")


def fuse(mha, order=("W_q", "W_k", "W_v"), bias=True):
    w = mha.W_q.weight
    layer = nn.Linear(mha.d_model, 3 * mha.d_model, bias=bias, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.cat([getattr(mha, n).weight for n in order]))
        if bias:
            layer.bias.copy_(torch.cat([getattr(mha, n).bias for n in order]))
    return layer


def fuse_by_state_dict(mha):
    parts = (mha.W_q, mha.W_k, mha.W_v)
    layer = nn.Linear(mha.d_model, 3 * mha.d_model).to(mha.W_q.weight)  # the module's device and dtype
    layer.load_state_dict({"weight": torch.cat([p.weight for p in parts]).detach(),
                           "bias": torch.cat([p.bias for p in parts]).detach()})
    return layer


def test_fused_projection_check():
    expect_pass(checks.check_fused_projection(fuse))
    expect_pass(checks.check_fused_projection(fuse_by_state_dict))
    expect_fail(checks.check_fused_projection(lambda m: fuse(m, ("W_k", "W_q", "W_v"))), "wrong order")
    expect_fail(checks.check_fused_projection(lambda m: fuse(m, bias=False)), "biases")
    expect_fail(checks.check_fused_projection(lambda m: torch.cat([m.W_q.weight, m.W_k.weight, m.W_v.weight])),
                "returned a tensor")
    expect_fail(checks.check_fused_projection(lambda m: nn.Linear(3 * m.d_model, m.d_model)), "expected nn.linear(8, 24)")


def online_attention(q, k, v, block_size, *, rescale=True, normalize=True, device=None):
    device = q.device if device is None else device  # another device: the mistake of making them on the CPU
    m = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype, device=device)
    total = torch.zeros_like(m)
    out = torch.zeros(*q.shape[:-1], v.size(-1), dtype=q.dtype, device=device)
    for start in range(0, k.size(-2), block_size):
        scores = q @ k[..., start : start + block_size, :].mT / math.sqrt(q.size(-1))
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - m_new)
        factor = torch.exp(m - m_new) if rescale else 1.0
        total = total * factor + p.sum(-1, keepdim=True)
        out = out * factor + p @ v[..., start : start + block_size, :]
        m = m_new
    return out / total if normalize else out


def blocks_by_logsumexp(q, k, v, block_size):
    """Right, written differently: keep the log of the running sum instead of the maximum."""
    lse, out = None, None
    for start in range(0, k.size(-2), block_size):
        s = q @ k[..., start : start + block_size, :].transpose(-2, -1) / q.size(-1) ** 0.5
        block_lse = torch.logsumexp(s, -1, keepdim=True)
        block_out = torch.softmax(s, -1) @ v[..., start : start + block_size, :]
        if lse is None:
            lse, out = block_lse, block_out
        else:
            new = torch.logaddexp(lse, block_lse)
            out = out * torch.exp(lse - new) + block_out * torch.exp(block_lse - new)
            lse = new
    return out


def test_blockwise_attention_check():
    expect_pass(checks.check_blockwise_attention(online_attention))
    expect_pass(checks.check_blockwise_attention(blocks_by_logsumexp))
    expect_fail(checks.check_blockwise_attention(lambda *a: online_attention(*a, rescale=False)), "not rescaled")
    expect_fail(checks.check_blockwise_attention(lambda *a: online_attention(*a, normalize=False)), "never divided")


def test_results_are_logged_as_json_lines_when_asked(tmp_path, monkeypatch):
    import json

    from mha_lib.checks import check_causal_mask

    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv("MHA_CHECK_LOG", str(log))

    def stub(seq_len):
        raise NotImplementedError

    check_causal_mask(lambda L: torch.ones(L, L, dtype=torch.bool).tril())
    check_causal_mask(stub)
    check_causal_mask(lambda L: torch.ones(L, L, dtype=torch.bool))
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["status"] for r in records] == ["passed", "not implemented", "failed"]
    assert all(r["check"] == records[0]["check"] and r["message"] for r in records)
    monkeypatch.delenv("MHA_CHECK_LOG")
    check_causal_mask(stub)
    assert len(log.read_text().splitlines()) == 3  # nothing is written without the variable


def test_checks_name_a_tensor_made_on_the_cpu():
    """Right on the CPU, a crash on a GPU: head ablation and blockwise attention run once more on the meta device."""
    def ablate_careless(mha, x, head):
        q, k, v = (mha_lib.split_heads(f(x), mha.num_heads) for f in (mha.W_q, mha.W_k, mha.W_v))
        heads, _ = mha_lib.scaled_dot_product_attention(q, k, v)
        keep = torch.ones(mha.num_heads, 1, 1, dtype=heads.dtype)  # on the CPU, whatever x's device
        keep[head] = 0
        return mha.W_o(mha_lib.combine_heads(heads * keep))

    expect_fail(checks.check_head_ablation(ablate_careless), "device 'meta'", "device=x.device", status="error")
    expect_fail(checks.check_blockwise_attention(lambda q, k, v, b: online_attention(q, k, v, b, device="cpu")),
                "device 'meta'", "device=query.device", status="error")


def test_cross_attention_check_names_a_mask_left_on_the_cpu():
    def cpu_mask(mha, target, source, lengths):
        return mha(target, source, source, mask=mha_lib.padding_mask(lengths, max_len=source.size(1)))

    expect_fail(checks.check_cross_attention(cpu_mask), "device 'meta'", "mask is on cpu", ".to(source.device)",
                status="error")


def test_multi_head_check_names_values_projected_from_the_key():
    class ValueFromKey(nn.Module):
        def __init__(self, d_model, num_heads, dropout=0.0):
            super().__init__()
            self.num_heads = num_heads
            self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))

        def forward(self, query, key, value, mask=None):
            q, k, v = (mha_lib.split_heads(f(x), self.num_heads)
                       for f, x in ((self.W_q, query), (self.W_k, key), (self.W_v, key)))  # value forgotten
            heads, _ = mha_lib.scaled_dot_product_attention(q, k, v, mask)
            return self.W_o(mha_lib.combine_heads(heads))

    expect_fail(checks.check_multi_head_attention(ValueFromKey), "values were projected from the key")
