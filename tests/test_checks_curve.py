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
