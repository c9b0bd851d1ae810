"""Check for chapter 11: multi-head latent attention's absorption, ``W_uk`` folded into the queries
and ``W_uv`` into ``W_o`` (what :meth:`mha_lib.MultiHeadLatentAttention.absorbed_weights` returns).

The learner's function gets a fresh ``MultiHeadLatentAttention`` with known float64 weights and
returns ``(W_uk, W_ov)``, ``(H, d_k, d_latent)`` and ``(d_model, H, d_latent)``. The layers' sizes
keep ``H``, ``d_k`` and ``d_latent`` apart (``d_latent`` above ``d_k`` in some, below in others), so
that a missing transpose, a head axis split in the wrong order or a matrix left unabsorbed never
has the right shape, or the right numbers, by chance; each wrong answer is compared with the
mistakes that reproduce it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..latent import MultiHeadLatentAttention
from ._circuits import call_leaving_model_alone
from ._core import ERROR, CheckResult, Mistake, Verdict, close, diagnose, expect_tensor, fail, gen, run_check, sqrt, unpack_pair
from .reference import set_weights

LAYERS = ("W_q", "W_dkv", "W_uk", "W_uv", "W_o")
# (d_model, H, d_latent, bias, seed): d_k = d_model // H is never d_latent or H, and d_model is never H · d_latent.
CASES = [(12, 3, 7, True, 81), (16, 2, 5, False, 82), (24, 4, 10, True, 83), (20, 4, 3, False, 84)]

W_UK_DEFINITION = ("W_uk.weight is (out_features, in_features) = (H·d_k, d_latent), its rows head by head (rows "
                   "h·d_k .. (h+1)·d_k build head h's key, k_h = W_uk[h] c): W_uk.weight.view(H, d_k, d_latent).")
W_OV_DEFINITION = ("W_ov[:, h] = W_o[:, h] @ W_uv[h]: W_o[:, h] is the (d_model, d_k) block of W_o.weight "
                   "(d_model, H·d_k) that reads head h, W_o.weight.view(d_model, H, d_k)[:, h], and W_uv[h] = "
                   "W_uv.weight.view(H, d_k, d_latent)[h]; torch.einsum('mhk,hkc->mhc', ...) does every head.")


def _shape(value: Any) -> tuple[int, ...] | None:
    return tuple(value.shape) if isinstance(value, Tensor) else None


def _as(value: Tensor, shape: tuple[int, ...]) -> Tensor | None:
    """``value`` with its axes permuted into ``shape`` when a permutation of them has it (first found)."""
    if value.dim() != len(shape) or sorted(value.shape) != sorted(shape):
        return None
    for order in itertools.permutations(range(value.dim())):
        if tuple(value.shape[i] for i in order) == shape:
            return value.permute(order)
    return None


def _per_head(weight: Tensor, H: int, d_k: int, d_latent: int) -> dict[str, Tensor]:
    """An up-projection's weight ``(H·d_k, d_latent)`` cut per head, rightly and in the usual wrong ways."""
    return {"right": weight.view(H, d_k, d_latent),
            "interleaved": weight.view(d_k, H, d_latent).transpose(0, 1),
            "transposed first": weight.T.reshape(H, d_k, d_latent),
            "blocks transposed": weight.reshape(H, d_latent, d_k).transpose(1, 2)}


def _fold(W_o: Tensor, W_uv: Tensor) -> Tensor:
    """``W_o`` cut per head ``(d_model, H, d_k)`` times ``W_uv`` per head ``(H, d_k, d_latent)``."""
    return torch.einsum("mhk,hkc->mhc", W_o, W_uv)


def _scales(d_k: int, d_latent: int) -> dict[str, float]:
    """The scores' scales a learner may fold into a matrix, by name."""
    return {"√(d_latent / d_k)": sqrt(d_latent) / sqrt(d_k), "√(d_k / d_latent)": sqrt(d_k) / sqrt(d_latent),
            "1/√d_k": 1 / sqrt(d_k), "√d_k": sqrt(d_k), "1/√d_latent": 1 / sqrt(d_latent)}


def _other_matrix(W_uk: Tensor, w: dict[str, Tensor], H: int, d_k: int, d_latent: int, where: str) -> None:
    """Fail if ``W_uk`` holds another matrix's numbers: ``W_dkv`` (in any layout), or ``W_q`` with ``W_uk``
    folded in, ``(H, d_model, d_latent)`` (the fold the paper does in advance)."""
    got, shape, flat = tuple(W_uk.shape), (H, d_k, d_latent), W_uk.detach().reshape(-1)
    for name, dkv in (("W_dkv.weight", w["W_dkv"]), ("W_dkv.weight.T", w["W_dkv"].T)):
        if flat.numel() == dkv.numel() and close(flat, dkv.reshape(-1)):
            used = name if got == tuple(dkv.shape) else f"{name} reshaped"
            raise fail(f"W_uk {where} is {used}: that is W_dkv, the down-projection that makes the latent "
                       "(c = W_dkv x)", "W_uk is the keys' up-projection, mla.W_uk.weight, from the latent back to "
                       "the keys (k = W_uk c): " + W_UK_DEFINITION)
    D = H * d_k
    permuted = _as(W_uk.detach(), (H, D, d_latent))
    if permuted is None:
        return
    q_uk = torch.einsum("hkm,hkc->hmc", w["W_q"].view(H, d_k, D), w["W_uk"].view(H, d_k, d_latent))
    for name, s in {"": 1.0, **_scales(d_k, d_latent)}.items():
        if close(permuted, q_uk * s):
            scaled = f", with the scale {name} folded in too" if name else ""
            raise fail(f"W_uk has shape {got} {where}, expected {shape} (H, d_k, d_latent): it is W_q·W_uk, the fold "
                       f"done in advance{scaled} (valid in itself, as the paper phrases it, \"W^UK absorbed into "
                       "W^Q\")", "But this exercise asks for W_uk itself, per head: W_uk.weight.view(H, d_k, "
                       "d_latent); the fold into the query happens at inference (q_h @ W_uk[h]).")


def _check_w_uk(W_uk: Any, w: dict[str, Tensor], H: int, d_k: int, d_latent: int, expected: Tensor,
                where: str) -> None:
    shape = (H, d_k, d_latent)
    uk, uv = _per_head(w["W_uk"], H, d_k, d_latent), _per_head(w["W_uv"], H, d_k, d_latent)
    got = _shape(W_uk)
    if isinstance(W_uk, Tensor) and W_uk.is_floating_point():
        _other_matrix(W_uk, w, H, d_k, d_latent, where)
    if got == (H, d_latent, d_k):
        raise fail(f"W_uk has shape {got} {where}, expected {shape} (H, d_k, d_latent): each head's block is "
                   "transposed", "k_h = W_uk[h] c, so W_uk[h] is (d_k, d_latent): " + W_UK_DEFINITION)
    if got in ((H * d_k, d_latent), (d_latent, H * d_k)):
        raise fail(f"W_uk has shape {got} {where}, expected {shape} (H, d_k, d_latent): the heads were not split "
                   "apart", W_UK_DEFINITION)
    W_uk = expect_tensor(W_uk, f"W_uk {where}", shape, dtype=torch.float64, explain=" (H, d_k, d_latent)")
    if close(W_uk, expected):
        return
    mistakes: list[Mistake] = [
        ("the weight was transposed before being cut per head (W_uk.weight.T.reshape(H, d_k, d_latent))",
         lambda: [uk["transposed first"], w["W_uk"].T.reshape(H, d_latent, d_k).transpose(1, 2)],
         "No transpose is needed. " + W_UK_DEFINITION),
        ("each head's block was cut as (d_latent, d_k) and then transposed (view(H, d_latent, d_k).transpose(1, 2))",
         lambda: uk["blocks transposed"], W_UK_DEFINITION),
        ("the heads were split in the wrong order: head h got rows h, h + H, h + 2H, ... (view(d_k, H, d_latent) "
         "and a transpose), not the block of rows h·d_k .. (h+1)·d_k",
         lambda: uk["interleaved"], "Split the head axis first, as split_heads does: " + W_UK_DEFINITION),
        ("W_uv (the values' up-projection) was used instead of W_uk", lambda: uv["right"],
         "The keys' up-projection W_uk folds into the queries; W_uv, the values', folds into W_o."),
        *((f"the scale {name} was folded into W_uk", lambda s=s: uk["right"] * s,
           "Return W_uk itself: the scores' scale (1/√d_k, or √(d_latent / d_k) on the folded queries for an "
           "attention function that divides by √d_latent) belongs to the attention step, not to the matrix.")
          for name, s in _scales(d_k, d_latent).items()),
    ]
    raise diagnose(W_uk, mistakes, f"W_uk is wrong {where}", W_UK_DEFINITION, expected=expected, dim=0, axis="head")


def _check_w_ov(W_ov: Any, w: dict[str, Tensor], D: int, H: int, d_k: int, d_latent: int, expected: Tensor,
                where: str) -> None:
    shape = (D, H, d_latent)
    uk, uv = _per_head(w["W_uk"], H, d_k, d_latent), _per_head(w["W_uv"], H, d_k, d_latent)
    W_o = w["W_o"].view(D, H, d_k)
    got = _shape(W_ov)
    if got == (D, H, d_k) and close(W_ov.detach(), W_o):
        raise fail(f"W_ov has shape {got} {where}, expected {shape} (d_model, H, d_latent): it is W_o cut per "
                   "head, with W_uv not folded in", "Fold the values' up-projection into W_o: " + W_OV_DEFINITION)
    if got == (D, H * d_k) or got == (H * d_k, D):
        raise fail(f"W_ov has shape {got} {where}, expected {shape} (d_model, H, d_latent): it looks like W_o "
                   "itself, with W_uv not folded in", "Fold the values' up-projection into W_o: " + W_OV_DEFINITION)
    if got == (H, d_k, d_latent):
        raise fail(f"W_ov has shape {got} {where}, expected {shape} (d_model, H, d_latent): it looks like W_uv "
                   "cut per head, without W_o", W_OV_DEFINITION)
    if got in ((D, d_latent), (d_latent, D)):
        raise fail(f"W_ov has shape {got} {where}, expected {shape} (d_model, H, d_latent): the heads were summed "
                   "(W_o.weight @ W_uv.weight adds up W_o[:, h] @ W_uv[h] over the heads)",
                   "Each head blends the latents with its own weights, so each keeps its own block: "
                   + W_OV_DEFINITION)
    if got == (D, H * d_latent) and close(W_ov.detach(), expected.reshape(D, H * d_latent)):
        raise fail(f"W_ov has shape {got} {where}, expected {shape} (d_model, H, d_latent): the numbers are right, "
                   "but the head axis is merged with the latent one",
                   "Keep one block per head: .view(d_model, H, d_latent).")
    if isinstance(W_ov, Tensor) and got != shape:
        permuted = _as(W_ov.detach(), shape)
        if permuted is not None and close(permuted, expected):
            raise fail(f"W_ov has shape {got} {where}, expected {shape} (d_model, H, d_latent): the numbers are "
                       "right, but the axes are in another order",
                       "absorbed_weights() lays W_ov out as (d_model, H, d_latent), W_ov[:, h] being head h's "
                       "block: .permute(...) the axes into that order (or write the einsum's output as 'mhc').")
    W_ov = expect_tensor(W_ov, f"W_ov {where}", shape, dtype=torch.float64, explain=" (d_model, H, d_latent)")
    if close(W_ov, expected):
        return
    mistakes: list[Mistake] = [
        ("W_uk (the keys' up-projection) was folded into W_o instead of W_uv", lambda: _fold(W_o, uk["right"]),
         "The values' up-projection W_uv folds into W_o; W_uk, the keys', into the queries."),
        ("W_o was cut per head without its transpose (W_o.weight.reshape(H, d_k, d_model) reads head h's block from "
         "the wrong entries)",
         lambda: torch.einsum("hkm,hkc->mhc", w["W_o"].reshape(H, d_k, D), uv["right"]),
         "W_o.weight is (d_model, H·d_k), its columns head by head: W_o.weight.view(d_model, H, d_k) (or "
         "W_o.weight.T.reshape(H, d_k, d_model), transposed first)."),
        ("W_o's heads were split in the wrong order: head h got the columns h, h + H, ... (view(d_model, d_k, H)), "
         "not the block h·d_k .. (h+1)·d_k",
         lambda: _fold(w["W_o"].view(D, d_k, H).transpose(1, 2), uv["right"]),
         "W_o reads the heads as combine_heads lays them out, one block of d_k columns after another: "
         "W_o.weight.view(d_model, H, d_k)."),
        ("W_uv's heads were split in the wrong order: head h got rows h, h + H, ... (view(d_k, H, d_latent) and a "
         "transpose)", lambda: _fold(W_o, uv["interleaved"]),
         "Split the head axis first: W_uv.weight.view(H, d_k, d_latent), head h's rows h·d_k .. (h+1)·d_k."),
        ("W_uv was transposed before being cut per head (W_uv.weight.T.reshape(H, d_k, d_latent))",
         lambda: _fold(W_o, uv["transposed first"]),
         "No transpose: W_uv.weight is (H·d_k, d_latent), v_h = W_uv[h] c, so W_uv.weight.view(H, d_k, d_latent)."),
        ("each head's block of W_uv was cut as (d_latent, d_k) and then transposed",
         lambda: _fold(W_o, uv["blocks transposed"]),
         "W_uv.weight.view(H, d_k, d_latent): v_h = W_uv[h] c."),
        ("W_uv was multiplied on the wrong side: W_uv[h]ᵀ @ W_o[:, h]ᵀ is the (d_latent, d_model) transpose of "
         "the block, and reshaping it to (d_model, ...) does not transpose it",
         lambda: torch.einsum("hkc,mhk->hcm", uv["right"], W_o).reshape(D, H, d_latent),
         "Multiply in the order the output is computed, W_o[:, h] @ W_uv[h]: (d_model, d_k) @ (d_k, d_latent) is "
         "head h's (d_model, d_latent) block, and torch.einsum('mhk,hkc->mhc', ...) does every head."),
        ("every head's block was multiplied with head 0's W_uv", lambda: _fold(W_o, uv["right"][:1].expand(H, -1, -1)),
         "Use each head's own W_uv[h]: " + W_OV_DEFINITION),
        *((f"the right numbers laid out by reshape instead of permute/transpose: a ({layout}) result "
           "reshaped to (d_model, H, d_latent), which mixes up the heads' entries",
           lambda order=order: expected.permute(order).reshape(D, H, d_latent),
           f"reshape keeps the numbers in memory order and only relabels the axes: use .permute"
           f"{tuple(order.index(a) for a in range(3))} (or write the einsum's output as 'mhc'), not reshape, to "
           "move the head axis.")
          for order in itertools.permutations(range(3)) if order != (0, 1, 2)
          for layout in [", ".join(("d_model", "H", "d_latent")[a] for a in order)]),
        *((f"the scale {name} was folded into W_ov", lambda s=s: expected * s,
           "Return W_o[:, h] @ W_uv[h] itself: the scores' scale (1/√d_k, or √(d_latent / d_k) on the folded "
           "queries) belongs to the attention step; on W_ov it scales the layer's output instead.")
          for name, s in _scales(d_k, d_latent).items()),
    ]
    sources = [next((j for j in range(H) if close(W_ov[:, h], expected[:, j])), None) for h in range(H)]
    if None not in sources and sorted(sources) == list(range(H)):  # every block right, at the wrong index
        blocks = ", ".join(f"head {j}'s" for j in sources)
        raise fail(f"W_ov is wrong {where}: it holds the blocks of the right heads in the wrong order, its heads "
                   f"0 .. {H - 1} being {blocks}", "Head h's block W_ov[:, h] = W_o[:, h] @ W_uv[h] must stay at "
                   "index h: keep the head axis where it is through the view and the product (einsum "
                   "'mhk,hkc->mhc').")
    raise diagnose(W_ov, mistakes, f"W_ov is wrong {where}", W_OV_DEFINITION, expected=expected, dim=1, axis="head")


SIZE_ERROR = re.compile(r"shape '\[([-\d, ]+)\]' is invalid for input of size (\d+)|view size is not compatible|"
                        r"size of tensor a \((\d+)\) must match")


def _sized_from_elsewhere(fn: Callable[..., Any], mla: MultiHeadLatentAttention, passed: list[tuple[int, int, int]],
                          where: str, verdict: Verdict) -> Verdict:
    """The verdict for an error on a module of new sizes after right answers on others: sizes written as numbers
    (the example's, the first module's) instead of read from the module, when the error says sizes don't fit."""
    if verdict.status != ERROR:
        return verdict
    try:
        fn(mla)
        return verdict
    except Exception as raised:  # noqa: BLE001 - the learner's code, run again to read its error
        error: BaseException = raised
    match = SIZE_ERROR.search(str(error))
    if not isinstance(error, RuntimeError) or match is None:
        return verdict
    H, d_k, d_latent = mla.num_heads, mla.d_k, mla.d_latent
    shown = f" (your shape [{match.group(1)}])" if match.group(1) else ""
    if not passed:  # the first module: sizes typed in show as numbers that are none of this module's
        own = {H, d_k, d_latent, mla.d_model, H * d_k, -1}
        typed = [int(v) for v in (match.group(1) or "").replace(" ", "").split(",") if v]
        if not typed or all(v in own for v in typed):
            return verdict
        return fail(f"{verdict.message}{shown}: it looks like sizes written as numbers ({', '.join(map(str, typed))}) "
                    f"instead of read from the module (here H={H}, d_k={d_k}, d_latent={d_latent})",
                    "Read every size from the module you are given: H, d_k, d_latent = mla.num_heads, mla.d_k, "
                    "mla.d_latent (or -1 for one of them in .view): the check hands over modules of other sizes than "
                    "the example's. .contiguous() or .reshape() would not help: the numbers are wrong.")
    earlier = " or ".join(f"(H, d_k, d_latent) = {p}" for p in passed)
    return fail(f"{verdict.message}: your function was right for {earlier} but fails here{shown}: it looks like "
                f"sizes written as numbers, taken from the example, not from the module (here H={H}, d_k={d_k}, "
                f"d_latent={d_latent})",
                "Read every size from the module you are given: H, d_k, d_latent = mla.num_heads, mla.d_k, "
                "mla.d_latent (or -1 for one of them in .view), never the example's 3, 4, 7: the check hands over "
                "modules of other sizes. .contiguous() or .reshape() would not help: the numbers are wrong.")


def check_absorb_up_projections(fn: Callable[[MultiHeadLatentAttention], Any]) -> CheckResult:
    """Check ``fn(mla) -> (W_uk, W_ov)`` for a ``MultiHeadLatentAttention``: ``W_uk`` per head
    ``(H, d_k, d_latent)`` and ``W_o`` with ``W_uv`` folded in, ``(d_model, H, d_latent)``, as
    ``mla.absorbed_weights()`` returns them; in the module's dtype; the modules are handed over in training
    mode with gradients on (one with a hook of its own) and must come back as they were, and the first one
    is handed over again after its weights change."""

    def body() -> str:
        passed: list[tuple[int, int, int]] = []
        first: MultiHeadLatentAttention | None = None
        witness = None
        runs = [*CASES, (*CASES[0][:4], CASES[0][4] + 100)]  # the first module again, with new weights
        try:
            for number, (D, H, d_latent, bias, seed) in enumerate(runs):
                again = number == len(CASES)
                if again and first is not None:
                    mla = first
                else:
                    torch.manual_seed(seed)
                    mla = MultiHeadLatentAttention(D, H, d_latent, bias=bias).double().train(number % 2 == 0)
                    if first is None:
                        first = mla
                        witness = mla.register_forward_pre_hook(lambda module, args: None)  # a hook of its own
                layers: dict[str, nn.Linear] = {name: getattr(mla, name) for name in LAYERS}
                w = {name: wb[0] for name, wb in set_weights(layers, gen(seed)).items()}
                d_k = D // H
                where = (f"for MultiHeadLatentAttention(d_model={D}, num_heads={H}, d_latent={d_latent}"
                         f"{'' if bias else ', bias=False'}) (d_k={d_k})" + (", the first module again after its "
                                                                            "weights changed" if again else ""))
                try:
                    result = call_leaving_model_alone(fn, mla, what=f"your function ({where})",
                                                      forbidden=[MultiHeadLatentAttention.absorbed_weights])
                except Verdict as verdict:
                    if verdict.message == "your function changed the model's parameters":
                        raise fail(f"your function changed the weights of the module it was given ({where})",
                                   "Compute new tensors from the weights (.view, @, torch.einsum); don't write into "
                                   "them (no .copy_(), .mul_() or assignments to .data).") from None
                    raise _sized_from_elsewhere(fn, mla, passed, where, verdict) from None
                W_uk, W_ov = unpack_pair(result, "your function", "W_uk", "W_ov")
                if isinstance(W_uk, Tensor) and _shape(W_uk) != (H, d_k, d_latent) and any(
                        _shape(W_uk) == (h, k, c) for h, k, c in passed):
                    raise fail(f"W_uk {where} has shape {_shape(W_uk)}, the shape of an earlier call's (for another "
                               f"module), expected {(H, d_k, d_latent)}: it looks like a result kept from an earlier "
                               "call (a cache keyed on something that another module can share, such as id(mla))",
                               "Compute from the module you are given, every call: keep no result between calls.")
                with torch.no_grad():
                    expected_uk, expected_ov = (t.detach().clone() for t in mla.absorbed_weights())
                if _shape(W_uk) == (D, H, d_latent) and _shape(W_ov) == (H, d_k, d_latent):
                    raise fail(f"your function returned (W_ov, W_uk) {where}: shapes {_shape(W_uk)} and "
                               f"{_shape(W_ov)}", "End with: return W_uk, W_ov (W_uk per head first, then the folded W_o).")
                if again and isinstance(W_uk, Tensor) and isinstance(W_ov, Tensor) and (
                        not close(W_uk, expected_uk) or not close(W_ov, expected_ov)):
                    raise fail(f"wrong (W_uk, W_ov) {where}, although they were right for this module before: your "
                               "function returns what it computed on an earlier call (cached) instead of reading "
                               "the module's current weights",
                               "Compute from mla's weights on every call: keep no result between calls.")
                _check_w_uk(W_uk, w, H, d_k, d_latent, expected_uk, where)
                _check_w_ov(W_ov, w, D, H, d_k, d_latent, expected_ov, where)
                passed.append((H, d_k, d_latent))
        finally:
            if witness is not None:
                witness.remove()
        sizes = ", ".join(f"({H}, {D // H}, {d_latent})" for D, H, d_latent, _, _ in CASES)
        return (f"(W_uk, W_ov) equal absorbed_weights() on {len(runs)} calls: {len(CASES)} layers, (H, d_k, "
                f"d_latent) = {sizes}, with and without biases, and the first again after its weights changed; "
                "the modules are left as they were")

    return run_check("absorbed up-projections", body)
