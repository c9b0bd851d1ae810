"""The check of exercise 11.4 (multi-head latent attention's absorbed up-projections): it passes the
library's answer, the solution's and other right ones, fails each wrong answer of the gallery with a
message and hint that name the mistake, reads a stub as "not implemented yet", and never crashes."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest
import torch

import mha_lib
from mha_lib import checks
from mha_lib.checks import CheckResult
from mha_lib.checks.latent import CASES

from conftest import expect_fail, expect_pass

ROOT = Path(__file__).resolve().parent.parent
check = checks.check_absorb_up_projections


def parts(mla):
    """``(H, d_k, d_latent, W_uk.weight, W_uv.weight, W_o.weight)`` of a layer."""
    return (mla.num_heads, mla.d_k, mla.d_latent, mla.W_uk.weight, mla.W_uv.weight, mla.W_o.weight)


def absorb(mla, *, uk="view", uv="view", w_o="view", fold="einsum", swap_uk_uv=False, scale=1.0):
    """A learner-style fold with switches for the classic mistakes; the defaults are right."""
    H, d_k, d_latent, Wuk, Wuv, Wo = parts(mla)
    if swap_uk_uv:
        Wuk, Wuv = Wuv, Wuk

    def per_head(weight, how):
        return {"view": lambda: weight.view(H, d_k, d_latent),
                "interleaved": lambda: weight.view(d_k, H, d_latent).transpose(0, 1),
                "transposed first": lambda: weight.T.reshape(H, d_k, d_latent),
                "blocks transposed": lambda: weight.reshape(H, d_latent, d_k).transpose(1, 2),
                "blocks (d_latent, d_k)": lambda: weight.reshape(H, d_latent, d_k)}[how]()

    W_uk, W_uv = per_head(Wuk, uk) * scale, per_head(Wuv, uv)
    if fold == "summed":
        return W_uk, Wo @ Wuv
    if fold == "unabsorbed":
        return W_uk, Wo.view(-1, H, d_k)
    if fold == "wrong side":
        W_o = Wo.view(-1, H, d_k)
        return W_uk, torch.einsum("hkc,mhk->hcm", W_uv, W_o).reshape(-1, H, d_latent)
    if fold == "heads first":
        return W_uk, torch.einsum("mhk,hkc->hmc", Wo.view(-1, H, d_k), W_uv)
    W_o = {"view": lambda: Wo.view(-1, H, d_k),
           "no transpose": lambda: Wo.reshape(H, d_k, -1).permute(2, 0, 1),
           "interleaved": lambda: Wo.view(-1, d_k, H).transpose(1, 2)}[w_o]()
    return W_uk, torch.einsum("mhk,hkc->mhc", W_o, W_uv)


def fold_into_queries(mla):
    """W_q·W_uk per head, (H, d_model, d_latent): the fold done in advance, where the exercise wants W_uk."""
    H, d_k, d_latent, Wuk, _, _ = parts(mla)
    return torch.einsum("hkm,hkc->hmc", mla.W_q.weight.view(H, d_k, -1), Wuk.view(H, d_k, d_latent))


def fold_by_reshape(mla):
    """The right (H, d_model, d_latent) blocks, laid out by reshape instead of permute."""
    H, d_k, d_latent, _, Wuv, Wo = parts(mla)
    return (Wo.T.reshape(H, d_k, -1).transpose(1, 2) @ Wuv.view(H, d_k, d_latent)).reshape(-1, H, d_latent)


def absorb_by_loops(mla):
    """Right, written otherwise: slices and matrix products head by head, stacked, under no_grad."""
    H, d_k, d_latent, Wuk, Wuv, Wo = parts(mla)
    with torch.no_grad():
        W_uk = torch.stack([Wuk[h * d_k:(h + 1) * d_k] for h in range(H)])
        W_ov = torch.stack([Wo[:, h * d_k:(h + 1) * d_k] @ Wuv[h * d_k:(h + 1) * d_k] for h in range(H)], dim=1)
    return W_uk, W_ov


def absorb_transposed_twice(mla):
    """Right, written otherwise: W_o transposed and cut as (H, d_k, d_model), unflatten, a tuple as a list."""
    H, d_k, d_latent, Wuk, Wuv, Wo = parts(mla)
    W_o = Wo.T.reshape(H, d_k, -1)  # (H, d_k, d_model)
    W_uv = Wuv.unflatten(0, (H, d_k))
    return [Wuk.unflatten(0, (H, d_k)).clone(), (W_o.transpose(1, 2) @ W_uv).permute(1, 0, 2)]


def the_solution():
    """``absorb_up_projections`` as solutions/11_attention_at_inference.py writes it."""
    tree = ast.parse((ROOT / "solutions" / "11_attention_at_inference.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "absorb_up_projections")
    namespace = {"torch": torch}
    exec(compile(ast.Module([node], type_ignores=[]), "solutions/11_attention_at_inference.py", "exec"), namespace)
    return namespace["absorb_up_projections"]


def the_library_under_another_name():
    """``MultiHeadLatentAttention.absorbed_weights`` itself, with a code object the check doesn't refuse."""
    method = mha_lib.MultiHeadLatentAttention.absorbed_weights
    code = method.__code__.replace(co_name="library_answer")
    return types.FunctionType(code, method.__globals__, "library_answer")


def test_the_cases_keep_the_sizes_apart():
    for D, H, d_latent, _, _ in CASES:
        d_k = D // H
        assert len({H, d_k, d_latent}) == 3 and D != H * d_latent, (D, H, d_latent)
    assert {bias for *_, bias, _ in CASES} == {True, False}
    assert any(d_latent > D // H for D, H, d_latent, *_ in CASES)
    assert any(d_latent < D // H for D, H, d_latent, *_ in CASES)


@pytest.mark.parametrize("fn", [absorb, absorb_by_loops, absorb_transposed_twice, the_solution(),
                                the_library_under_another_name()],
                         ids=["learner", "loops", "transposed twice", "solution", "library"])
def test_right_answers_pass(fn):
    expect_pass(check(fn))


@pytest.mark.parametrize(("wrong", "words"), [
    # W_uk
    (lambda m: absorb(m, uk="transposed first"), ("W_uk is wrong", "transposed before being cut per head",
                                                   "no transpose is needed")),
    (lambda m: absorb(m, uk="interleaved"), ("W_uk is wrong", "heads were split in the wrong order",
                                              "rows h, h + H")),
    (lambda m: absorb(m, uk="blocks transposed"), ("W_uk is wrong", "cut as (d_latent, d_k) and then transposed")),
    (lambda m: absorb(m, uk="blocks (d_latent, d_k)"), ("W_uk has shape (3, 7, 4)", "each head's block is transposed")),
    (lambda m: (m.W_uk.weight, absorb(m)[1]), ("W_uk has shape (12, 7)", "heads were not split")),
    (lambda m: (m.W_uk.weight.T, absorb(m)[1]), ("W_uk has shape (7, 12)", "heads were not split")),
    (lambda m: absorb(m, scale=(m.d_latent / m.d_k) ** 0.5), ("scale √(d_latent / d_k) was folded into W_uk",
                                                               "belongs to the attention step")),
    (lambda m: absorb(m, scale=m.d_k ** -0.5), ("scale 1/√d_k was folded into W_uk",)),
    (lambda m: absorb(m, swap_uk_uv=True), ("W_uv (the values' up-projection) was used instead of W_uk",
                                             "W_uk folds into the queries")),
    (lambda m: (m.W_dkv.weight, absorb(m)[1]), ("W_uk", "is W_dkv.weight:", "the down-projection that makes "
                                                 "the latent", "keys' up-projection, mla.W_uk.weight")),
    (lambda m: (m.W_dkv.weight.T, absorb(m)[1]), ("is W_dkv.weight.T:", "the down-projection")),
    (lambda m: (m.W_dkv.weight.T.reshape(m.num_heads, m.d_k, m.d_latent), absorb(m)[1]),
     ("is W_dkv.weight.T reshaped", "the down-projection")),
    (lambda m: (fold_into_queries(m), absorb(m)[1]),
     ("W_uk has shape (3, 12, 7)", "W_q·W_uk, the fold done in advance", '"W^UK absorbed into W^Q"',
      "W_uk itself, per head", "q_h @ W_uk[h]")),
    (lambda m: (fold_into_queries(m) * m.d_k ** -0.5, absorb(m)[1]),
     ("W_q·W_uk", "with the scale 1/√d_k folded in too")),
    # W_ov
    (lambda m: absorb(m, fold="unabsorbed"), ("W_ov has shape (12, 3, 4)", "W_uv not folded in")),
    (lambda m: (absorb(m)[0], m.W_o.weight), ("W_ov has shape (12, 12)", "W_uv not folded in")),
    (lambda m: absorb(m, fold="summed"), ("W_ov has shape (12, 7)", "heads were summed", "own block")),
    (lambda m: (absorb(m)[0], m.W_uv.weight.view(m.num_heads, m.d_k, m.d_latent)),
     ("W_ov has shape (3, 4, 7)", "W_uv cut per head, without W_o")),
    (lambda m: absorb(m, fold="heads first"), ("W_ov has shape (3, 12, 7)", "axes are in another order", "permute")),
    (lambda m: (absorb(m)[0], absorb(m)[1].flatten(1)), ("W_ov has shape (12, 21)", "head axis is merged")),
    (lambda m: (absorb(m)[0], absorb(m)[1].reshape(-1, 3, 4)), ("has shape (21, 3, 4)",
                                                                  "expected (12, 3, 7)")),
    (lambda m: (absorb(m)[0], torch.einsum("mhk,hkc->mhc", m.W_o.weight.view(-1, m.num_heads, m.d_k),
                                           absorb(m)[0])),
     ("W_uk (the keys' up-projection) was folded into W_o instead of W_uv",)),
    (lambda m: absorb(m, w_o="no transpose"), ("W_o was cut per head without its transpose",)),
    (lambda m: absorb(m, w_o="interleaved"), ("W_o's heads were split in the wrong order",)),
    (lambda m: absorb(m, uv="interleaved"), ("W_uv's heads were split in the wrong order",)),
    (lambda m: absorb(m, uv="transposed first"), ("W_uv was transposed before being cut per head",)),
    (lambda m: absorb(m, uv="blocks transposed"), ("each head's block of W_uv was cut as (d_latent, d_k)",)),
    (lambda m: absorb(m, fold="wrong side"), ("W_uv was multiplied on the wrong side", "W_o[:, h] @ W_uv[h]")),
    (lambda m: (absorb(m)[0], fold_by_reshape(m)),
     ("W_ov is wrong", "laid out by reshape instead of permute/transpose", "(H, d_model, d_latent) result",
      ".permute(1, 0, 2)", "not reshape")),
    (lambda m: (absorb(m)[0], absorb(m)[1] * (m.d_latent / m.d_k) ** 0.5),
     ("W_ov is wrong", "scale √(d_latent / d_k) was folded into W_ov", "belongs to the attention step")),
    (lambda m: (absorb(m)[0], absorb(m)[1] * m.d_k ** -0.5), ("scale 1/√d_k was folded into W_ov",)),
    (lambda m: (absorb(m)[0], torch.einsum("mhk,kc->mhc", m.W_o.weight.view(-1, m.num_heads, m.d_k),
                                           m.W_uv.weight[:m.d_k])),
     ("every head's block was multiplied with head 0's W_uv",)),
    (lambda m: (absorb(m)[0], absorb(m)[1].flip(1)), ("W_ov is wrong", "blocks of the right heads in the wrong order",
                                                       "head 2's, head 1's, head 0's")),
    (lambda m: (absorb(m)[0], absorb(m)[1] * torch.tensor([1.0, 1.0, 0.5] + [1.0] * (m.num_heads - 3),
                                                          dtype=torch.float64)[:, None]),
     ("W_ov is wrong", "head 2 differs")),
    # the pair itself, dtypes, the module
    (lambda m: absorb(m)[::-1], ("returned (W_ov, W_uk)", "return W_uk, W_ov")),
    (lambda m: absorb(m)[0], ("returned one tensor (3, 4, 7)", "expected a pair (W_uk, W_ov)")),
    (lambda m: (*absorb(m), None), ("returned a tuple of 3",)),
    (lambda m: tuple(t.float() for t in absorb(m)), ("dtype torch.float32 for inputs of dtype torch.float64",)),
    (lambda m: tuple(t.detach().numpy() for t in absorb(m)), ("numpy array",)),
    (lambda m: m.absorbed_weights(), ("course's own answer",)),
    (lambda m: (m(*[torch.zeros(1, 1, m.d_model, dtype=torch.float64)] * 3, absorb=True), None),
     ("course's own answer",)),  # attend_absorbed calls absorbed_weights
])
def test_wrong_answers_are_named(wrong, words):
    expect_fail(check(wrong), *words)


def test_changing_the_modules_weights_is_named():
    def scales_in_place(mla):
        with torch.no_grad():
            mla.W_uk.weight.mul_(mla.d_latent ** 0.5)
        return absorb(mla)

    expect_fail(check(scales_in_place), "changed the weights of the module", "don't write into them")


def test_errors_show_the_learners_line_without_crashing_the_check():
    def forgets_the_bias_is_optional(mla):
        W_uk, W_ov = absorb(mla)
        return W_uk, W_ov + mla.W_o.bias.sum() * 0  # bias=False layers have no bias

    result = check(forgets_the_bias_is_optional)
    expect_fail(result, "raised AttributeError", "mla.W_o.bias.sum()", status="error")

    def matmul_the_wrong_way(mla):
        W_uk, W_uv = absorb(mla)[0], mla.W_uv.weight.unflatten(0, (mla.num_heads, mla.d_k))
        W_o = mla.W_o.weight.unflatten(1, (mla.num_heads, mla.d_k))
        return W_uk, W_o @ W_uv

    expect_fail(check(matmul_the_wrong_way), "raised RuntimeError", "shapes don't fit", status="error")


def test_a_stub_reads_not_implemented():
    def absorb_up_projections(mla):
        raise NotImplementedError

    result = check(absorb_up_projections)
    assert result.status == "not implemented" and str(result).startswith("⏳"), result
    expect_fail(check(lambda m: None), "not implemented yet", status="not implemented")
    expect_fail(check(lambda m: (None, None)), "not implemented yet", status="not implemented")


def test_garbage_never_crashes_the_check():
    for garbage in (lambda *a, **k: "nonsense", lambda *a, **k: 1 / 0, 42, lambda *a, **k: (torch.zeros(1),) * 3,
                    lambda *a, **k: torch.zeros(2, 2), lambda *a, **k: (torch.zeros(2, 2), "x"),
                    lambda *a, **k: ("x", torch.zeros(2, 2)), lambda *a, **k: (absorb(a[0])[0], [1, 2]),
                    lambda *a, **k: (torch.zeros(3, 4, 7, dtype=torch.bool), None),
                    lambda *a, **k: (absorb(a[0])[0], torch.full((12, 3, 7), float("nan"), dtype=torch.float64)),
                    lambda *a, **k: (absorb(a[0])[0], torch.zeros(0)), lambda m: (absorb(m)[0], absorb(m)[1][None])):
        result = check(garbage)
        assert isinstance(result, CheckResult) and not result, result
        assert "bug in mha_lib.checks" not in str(result), result


def test_the_check_leaves_the_random_state_alone():
    torch.manual_seed(5)
    before = torch.rand(1)
    torch.manual_seed(5)
    check(absorb)
    assert torch.equal(torch.rand(1), before)


def test_the_verdict_comes_within_a_second():
    import time

    check(absorb)  # warm up PyTorch's kernels
    start = time.perf_counter()
    expect_pass(check(absorb))
    assert time.perf_counter() - start < 1.0
