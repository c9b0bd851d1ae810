"""The checks of chapters 01-05's last exercises (issue 34, "the curve"): 1.5 a scale measured for variance 1,
2.3 how sharp a head must be, 3.5 which positions a split reads, 4.4 a left-padded causal mask without empty
rows, 5.4 a tolerance per dtype and a gradient test. Each passes the solution and two other right answers,
and fails each named wrong answer with the hint that names it."""

from __future__ import annotations

import functools
import math
import warnings

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

from conftest import expect_fail, expect_pass
from mha_lib import causal_mask, checks, padding_mask

# ------------------------------------------------------------------ 1.5 a scale measured for variance 1


def scale_std(q, k):
    return (q @ k.transpose(-2, -1)).std().item()


def scale_rms(q, k):  # biased, no mean subtracted: within rounding of the std on these zero-mean inputs
    return float(torch.einsum("...qd,...kd->...qk", q, k).pow(2).mean().sqrt())


def scale_broadcast(q, k):  # a 0-d tensor, from products broadcast by hand
    return (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1).flatten().var(unbiased=False).sqrt()


@pytest.mark.parametrize("fn", [scale_std, scale_rms, scale_broadcast])
def test_unit_variance_scale_passes_right_answers(fn):
    expect_pass(checks.check_unit_variance_scale(fn))


_cache: dict = {}


def scale_cached_on_shape(q, k):
    return _cache.setdefault(tuple(q.shape) + tuple(k.shape), scale_std(q, k))


@pytest.mark.parametrize(("fn", "words"), [
    (lambda q, k: math.sqrt(q.size(-1)), ["√d_k, the chapter's rule", "variance 1"]),
    (lambda q, k: (q @ k.mT).var().item(), ["the variance of the scores, not their standard deviation"]),
    (lambda q, k: float(q.std() * k.std()) * math.sqrt(q.size(-1)), ["query.std() · key.std() · √d_k"]),
    (lambda q, k: (q @ k.mT / math.sqrt(q.size(-1))).std(), ["already divided by √d_k"]),
    (lambda q, k: (q @ k.mT).abs().mean(), ["mean absolute score"]),
    (lambda q, k: 1 / (q @ k.mT).std(), ["factor to multiply by"]),
    (lambda q, k: (q @ k.mT).std(dim=-1).mean(), ["each query's row", ".std() with no dim"]),
    (lambda q, k: q @ k.mT, ["returned the scores", "expected one number"]),
    (scale_cached_on_shape, ["gave for the previous inputs", "cached"]),
])
def test_unit_variance_scale_names_each_mistake(fn, words):
    _cache.clear()
    expect_fail(checks.check_unit_variance_scale(fn), *words)


def test_unit_variance_scale_names_a_tensor_made_on_the_cpu():
    def on_cpu(q, k):
        return ((q @ k.mT) / torch.ones((), device="cpu").expand(1, 1)).std().item()

    expect_fail(checks.check_unit_variance_scale(on_cpu), "device 'meta'", "where the inputs are", status="error")


# ------------------------------------------------------------------ 2.3 how sharp a head must be


def _refuse(fn):
    @functools.wraps(fn)
    def guarded(seq_len, weight):
        if seq_len < 2:
            raise ValueError(f"seq_len={seq_len} must be at least 2")
        if not 0 < weight < 1:
            raise ValueError(f"weight={weight} must lie strictly between 0 and 1")
        return fn(seq_len, weight)

    return guarded


@_refuse
def gap_log(L, w):
    return math.log(w * (L - 1) / (1 - w))


@_refuse
def gap_logit(L, w):
    return torch.logit(torch.tensor(w, dtype=torch.float64)) + math.log(L - 1)  # a 0-d tensor


@_refuse
def gap_bisection(L, w):
    lo, hi = -60.0, 60.0
    for _ in range(200):
        mid = (lo + hi) / 2
        share = torch.softmax(torch.tensor([mid] + [0.0] * (L - 1), dtype=torch.float64), 0)[0]
        lo, hi = (mid, hi) if share < w else (lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize("fn", [gap_log, gap_logit, gap_bisection])
def test_sharpness_passes_right_answers(fn):
    expect_pass(checks.check_sharpness_needed(fn))


@_refuse
def gap_grid(L, w):
    s = -20.0
    while math.exp(s) / (math.exp(s) + L - 1) < w:
        s += 0.001
    return s


_by_weight: dict = {}


@_refuse
def gap_cached_on_weight(L, w):
    return _by_weight.setdefault(w, gap_log(L, w))


@pytest.mark.parametrize(("fn", "words"), [
    (_refuse(lambda L, w: math.log(w / (1 - w))), ["the gap for two keys", "L - 1 others"]),
    (_refuse(lambda L, w: math.log(w * L / (1 - w))), ["L in place of L - 1"]),
    (_refuse(lambda L, w: math.log(w * (L - 1))), ["key's own e^s was left out"]),
    (_refuse(lambda L, w: w * (L - 1) / (1 - w)), ["without the log"]),
    (_refuse(lambda L, w: math.log10(w * (L - 1) / (1 - w))), ["log in base 10"]),
    (_refuse(lambda L, w: math.log2(w * (L - 1) / (1 - w))), ["log in base 2"]),
    (_refuse(lambda L, w: math.log(w * (L - 1) / (1 - w)) / math.sqrt(L)), ["divided by √L"]),
    (gap_grid, ["close but not exact", "search"]),
    (lambda L, w: math.log(w * (L - 1) / (1 - w)), ["raised ZeroDivisionError", "not ValueError"]),
    (lambda L, w: math.log(w * (L - 1) / (1 - w)) if 0 < w < 1 and L > 1 else float("inf"),
     ["returned inf instead of raising ValueError"]),
    (gap_cached_on_weight, ["previous arguments", "cached"]),
])
def test_sharpness_names_each_mistake(fn, words):
    expect_fail(checks.check_sharpness_needed(fn), *words)


# ------------------------------------------------------------------ 3.5 which positions a split reads


def reads_tagged(split, seq_len, d_model, num_heads):
    x = torch.arange(seq_len, dtype=torch.float64)[None, :, None].expand(1, seq_len, d_model)
    out = split(x, num_heads)[0]
    return (out[..., None] == torch.arange(seq_len, dtype=torch.float64)).any(dim=-2)


def reads_unique_ids(split, L, D, H):
    out = split(torch.arange(L * D).reshape(1, L, D), H)[0] // D  # each entry's own id, then its position
    reads = torch.zeros(H, L, L, dtype=torch.bool)
    for h in range(H):
        for i in range(L):
            reads[h, i, out[h, i]] = True
    return reads


def reads_one_hot(split, L, D, H):
    columns = []
    for j in range(L):  # light up one position at a time
        x = torch.zeros(1, L, D)
        x[0, j] = 1.0
        columns.append((split(x, H)[0] != 0).any(-1))
    return torch.stack(columns, dim=-1)


@pytest.mark.parametrize("fn", [reads_tagged, reads_unique_ids, reads_one_hot])
def test_positions_read_passes_right_answers(fn):
    expect_pass(checks.check_positions_read(fn))


def _tag_features(s, L, D, H):
    out = s(torch.arange(D, dtype=torch.float64)[None, None, :].expand(1, L, D), H)[0]
    return (out[..., None] == torch.arange(L, dtype=torch.float64)).any(-2)


def _first_feature(s, L, D, H):
    out = s(torch.arange(L, dtype=torch.float64)[None, :, None].expand(1, L, D), H)[0][..., :1]
    return (out[..., None] == torch.arange(L, dtype=torch.float64)).any(-2)


@pytest.mark.parametrize(("fn", "words", "status"), [
    (lambda s, L, D, H: reads_tagged(s, L, D, H).transpose(-2, -1), ["reads[h, j, i]", "swapped"], "failed"),
    (lambda s, L, D, H: torch.eye(L, dtype=torch.bool).expand(H, L, L), ["ignores the split", "probe"], "failed"),
    (_tag_features, ["feature's index, not its position"], "failed"),
    (_first_feature, ["only the first feature", ".any()"], "failed"),
    (lambda s, L, D, H: reads_tagged(s, L, D, H).int(), ["0s and 1s", ".bool()"], "failed"),
    (lambda s, L, D, H: reads_tagged(s, L, D, H).permute(1, 0, 2), ["has shape", "(num_heads, seq_len, seq_len)"],
     "failed"),
    (lambda s, L, D, H: s(torch.arange(L)[:, None].expand(L, D), H), ["split takes x of shape (b, l, d_model)"],
     "error"),
])
def test_positions_read_names_each_mistake(fn, words, status):
    expect_fail(checks.check_positions_read(fn), *words, status=status)


# ------------------------------------------------------------------ 4.4 a left-padded causal mask


def left_itself(lengths, seq_len):
    lengths = torch.as_tensor(lengths)
    pos = torch.arange(seq_len, device=lengths.device)
    real = pos[None, :] >= seq_len - lengths[:, None]
    return (((pos[None, :] <= pos[:, None]) & real[:, None, :]) | (pos[None, :] == pos[:, None]))[:, None]


def left_padding_rows_causal(lengths, L):  # a padding query sees the padding before it, itself included
    keep = padding_mask([int(n) for n in lengths], max_len=L).flip(-1)  # (B, 1, 1, L)
    return causal_mask(L) & (keep | ~keep.transpose(-1, -2))


def left_loops(lengths, L):  # padding rows see everything
    mask = torch.zeros(len(lengths), 1, L, L, dtype=torch.bool)
    for b, n in enumerate(int(n) for n in lengths):
        for i in range(L):
            if i < L - n:
                mask[b, 0, i, :] = True
            else:
                mask[b, 0, i, L - n:i + 1] = True
    return mask


@pytest.mark.parametrize("fn", [left_itself, left_padding_rows_causal, left_loops])
def test_left_padded_mask_passes_right_answers(fn):
    expect_pass(checks.check_left_padded_causal_mask(fn))


def _keep(lengths, L):
    return padding_mask([int(n) for n in lengths], max_len=L)


def _eye(L):
    return torch.eye(L, dtype=torch.bool)


@pytest.mark.parametrize(("fn", "words"), [
    (lambda l, L: causal_mask(L) & _keep(l, L).flip(-1), ["no key at all", "0/0", "torch.eye"]),
    (lambda l, L: (causal_mask(L) & _keep(l, L)) | _eye(L), ["right padding", "last lengths[b] positions"]),
    (lambda l, L: causal_mask(L).expand(len(l), 1, L, L).clone(), ["padding keys are not blocked"]),
    (lambda l, L: _keep(l, L).flip(-1).expand(len(l), 1, L, L) | _eye(L), ["the causal part is missing"]),
    (lambda l, L: (causal_mask(L) & ~_keep(l, L).flip(-1)) | _eye(L), ["padding part is inverted"]),
    (lambda l, L: (causal_mask(L).T & _keep(l, L).flip(-1)) | _eye(L), ["causal triangle flipped"]),
    (lambda l, L: (causal_mask(L) & _keep([min(int(n) + 1, L) for n in l], L).flip(-1)) | _eye(L),
     ["off by one", "last padding position is allowed"]),
    (lambda l, L: (causal_mask(L) & _keep([max(int(n) - 1, 0) for n in l], L).flip(-1)) | _eye(L),
     ["off by one", "first real token is blocked"]),
    (lambda l, L: left_itself(l, L)[:, 0], ["has shape", "axis of size 1 for the heads"]),
])
def test_left_padded_mask_names_each_mistake(fn, words):
    expect_fail(checks.check_left_padded_causal_mask(fn), *words)


def test_left_padded_mask_names_a_mask_made_on_the_cpu():
    def on_cpu(lengths, L):
        lengths = torch.as_tensor(lengths)
        real = torch.arange(L)[None, :] >= L - lengths[:, None]  # arange on the CPU, lengths elsewhere
        return ((causal_mask(L) & real[:, None, :]) | _eye(L))[:, None]

    expect_fail(checks.check_left_padded_causal_mask(on_cpu), "device 'meta'", "lengths.device", status="error")


# ------------------------------------------------------------------ 5.4 a tolerance per dtype, a gradient test

TOLERANCES = {torch.float64: (1e-12, 1e-12), torch.float32: (1e-5, 1e-5), torch.bfloat16: (3e-2, 3e-2)}


def _inputs(*shapes, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=g, dtype=dtype).requires_grad_() for s in shapes]


def grads_causal(attention):
    q, k, v = _inputs((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4))
    return torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, causal_mask(3))[0], (q, k, v),
                                    raise_exception=False)


def grads_both_outputs(attention):  # output and weights, 3-D, a bottom-right causal mask
    q, k, v = _inputs((1, 3, 4), (1, 5, 4), (1, 5, 2))
    mask = torch.ones(3, 5, dtype=torch.bool).tril(2)
    return torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, mask), (q, k, v), raise_exception=False)


def grads_try(attention):  # gradcheck raising, caught
    q, k, v = _inputs((2, 4, 3), (2, 4, 3), (2, 4, 3))
    try:
        return torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, causal_mask(4))[0], (q, k, v))
    except GradcheckError:
        return False


def tolerance_eps(dtype):
    eps = torch.finfo(dtype).eps
    return {torch.float64: (1e3 * eps, 1e3 * eps), torch.float32: (50 * eps, 50 * eps)}.get(dtype, (4 * eps, 4 * eps))


@pytest.mark.parametrize(("tolerance", "gradients"), [
    (TOLERANCES.get, grads_causal),
    (tolerance_eps, grads_both_outputs),
    (lambda d: dict(zip(("rtol", "atol"), TOLERANCES[d])), grads_try),
], ids=["table", "epsilons", "dict+try"])
def test_tolerances_and_gradients_pass_right_answers(tolerance, gradients):
    expect_pass(checks.check_tolerances_and_gradients(tolerance, gradients))


def grads_query_only(attention):
    q, k, v = _inputs((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4))
    k, v = k.detach(), v.detach()
    return torch.autograd.gradcheck(lambda q: attention(q, k, v, causal_mask(3))[0], (q,), raise_exception=False)


def grads_no_mask(attention):
    q, k, v = _inputs((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4))
    return torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v)[0], (q, k, v), raise_exception=False)


def grads_float32(attention):
    q, k, v = _inputs((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4), dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, causal_mask(3))[0], (q, k, v),
                                        raise_exception=False)


def grads_raising(attention):
    q, k, v = _inputs((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4))
    return torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, causal_mask(3))[0], (q, k, v))


@pytest.mark.parametrize(("tolerance", "gradients", "words"), [
    (TOLERANCES.get, grads_query_only, ["wrong for key", "covers query only", "all three"]),
    (TOLERANCES.get, grads_no_mask, ["forgets the mask", "without a mask"]),
    (TOLERANCES.get, grads_float32, ["are wrong; they are right", "float64"]),
    (TOLERANCES.get, grads_raising, ["raised GradcheckError", "raise_exception=False"]),
    (lambda d: {**TOLERANCES, torch.float64: (1.3e-6, 1e-5)}[d],
     grads_causal, ["float64 tolerance", "computed in float32", "default for float32"]),
    (lambda d: (3e-2, 3e-2), grads_causal, ["one tolerance for every dtype"]),
    (lambda d: {**TOLERANCES, torch.float32: (3e-2, 3e-2)}[d], grads_causal,
     ["float32 tolerance", "computed in float16", "too loose"]),
    (lambda d: {**TOLERANCES, torch.bfloat16: (1.6e-2, 1e-5)}[d], grads_causal,
     ["rejects a correct result", "bfloat16 defaults"]),
    (lambda d: {**TOLERANCES, torch.bfloat16: (5e-2, 0.0)}[d], grads_causal, ["atol=0"]),
    (lambda d: {**TOLERANCES, torch.bfloat16: (0.2, 0.2)}[d], grads_causal, ["accepts a wrong attention", "√d_v"]),
    (lambda d: {**TOLERANCES, torch.float32: (1e-6, 1e-7)}[d], grads_causal, ["rejects a correct result",
                                                                              "too tight"]),
    (lambda d: 1e-5, grads_causal, ["expected a pair (rtol, atol)"]),
    (TOLERANCES.get, None, ["only the tolerance was given"]),
])
def test_tolerances_and_gradients_name_each_mistake(tolerance, gradients, words):
    expect_fail(checks.check_tolerances_and_gradients(tolerance, gradients), *words)
