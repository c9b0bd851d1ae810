"""Checks for chapter 05: moving between mha_lib and torch.nn.MultiheadAttention."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..masks import causal_mask, padding_mask
from ..multi_head import MultiHeadAttention
from ._core import CheckResult, call, close, expect_tensor, fail, gen, on_meta, randn, run_check
from .reference import multi_head, projections

DEVICE_DTYPE_HINT = ("Build it where the module you copy lives: weight = mha.W_q.weight, then "
                     "nn.MultiheadAttention(d_model, num_heads, batch_first=True, device=weight.device, "
                     "dtype=weight.dtype) (or .to(weight) after building it).")
CONVENTION_HINT = ("nn.MultiheadAttention's masks mean True = *blocked*, the opposite of mha_lib and "
                   "F.scaled_dot_product_attention: invert with ~mask.")


def _twin(D: int, H: int, seed: int) -> tuple[MultiHeadAttention, dict[str, tuple[Tensor, Tensor]]]:
    mha = MultiHeadAttention(D, H).double().eval()
    w = projections(mha, gen(seed))
    return mha, w


def _same(a: Tensor | None, b: Tensor) -> bool:
    return a is not None and a.shape == b.shape and close(a.detach(), b)


def check_copy_to_torch(fn: Callable[[MultiHeadAttention], Any]) -> CheckResult:
    """Check ``fn(mha) -> nn.MultiheadAttention`` (``batch_first=True``) holding the same
    weights as the ``mha_lib.MultiHeadAttention`` it is given, so both give the same output."""

    def body() -> str:
        for D, H, seed in [(8, 2, 11), (12, 3, 12)]:
            mha, w = _twin(D, H, seed)
            before = {n: p.detach().clone() for n, p in mha.named_parameters()}
            theirs = call(fn, mha, what="your function")
            if any(not torch.equal(p, before[n]) for n, p in mha.named_parameters()):
                raise fail("your function changed the weights of the module it was given",
                           "Copy from it into the new module; don't modify the original.")
            if theirs is None:
                raise fail("your function returned None", "End with: return torch_mha")
            if not isinstance(theirs, nn.MultiheadAttention):
                raise fail(f"your function returned a {type(theirs).__name__}, expected an nn.MultiheadAttention")
            if (theirs.embed_dim, theirs.num_heads) != (D, H):
                raise fail(f"it has embed_dim={theirs.embed_dim}, num_heads={theirs.num_heads}; expected {D} and {H}")
            if not theirs.batch_first:
                raise fail("it was created without batch_first=True",
                           "mha_lib works with (B, L, D); nn.MultiheadAttention expects (L, B, D) unless batch_first=True.")
            if theirs.in_proj_weight is None:
                raise fail("it has separate q/k/v projection weights (kdim or vdim set)",
                           "Create it as nn.MultiheadAttention(d_model, num_heads, batch_first=True).")
            blocks = dict(zip("qkv", theirs.in_proj_weight.detach().double().chunk(3)))
            ours = {"q": w["W_q"][0], "k": w["W_k"][0], "v": w["W_v"][0]}
            if not all(_same(blocks[n], ours[n]) for n in "qkv"):
                if all(_same(blocks[n], ours[n].T) for n in "qkv"):
                    raise fail("the projection weights are transposed",
                               "nn.Linear.weight is already (out_features, in_features), as in_proj_weight expects; "
                               "copy it without .T.")
                found = {m for n in "qkv" for m in "qkv" if _same(blocks[n], ours[m])}
                if found == set("qkv"):
                    raise fail("in_proj_weight holds the right matrices in the wrong order",
                               "Stack them as torch.cat([W_q.weight, W_k.weight, W_v.weight]): queries, keys, values.")
                raise fail("in_proj_weight doesn't hold W_q, W_k and W_v",
                           "Copy torch.cat([W_q.weight, W_k.weight, W_v.weight]) into in_proj_weight under torch.no_grad().")
            if theirs.in_proj_weight.dtype != mha.W_q.weight.dtype:
                raise fail(f"it holds {theirs.in_proj_weight.dtype} weights, but the module it copies is "
                           f"{mha.W_q.weight.dtype} (a float64 module, as the check hands over): it was built "
                           "without dtype=, so copy_ rounded the weights to PyTorch's default dtype",
                           DEVICE_DTYPE_HINT)
            expected_bias = torch.cat([w["W_q"][1], w["W_k"][1], w["W_v"][1]])
            if theirs.in_proj_bias is None or not _same(theirs.in_proj_bias.double(), expected_bias):
                raise fail("in_proj_bias doesn't hold the biases of W_q, W_k and W_v",
                           "Copy the biases too: torch.cat([W_q.bias, W_k.bias, W_v.bias]) into in_proj_bias.")
            if not _same(theirs.out_proj.weight.double(), w["W_o"][0]) or theirs.out_proj.bias is None or \
                    not _same(theirs.out_proj.bias.double(), w["W_o"][1]):
                raise fail("out_proj doesn't hold W_o", "Copy W_o.weight and W_o.bias into out_proj.weight and out_proj.bias.")
            g = gen(seed + 100)
            x, src = randn(g, 2, 5, D), randn(g, 2, 7, D)
            model = theirs.double().eval()
            with torch.no_grad():
                for q, kv in ((x, x), (x, src)):
                    out = model(q, kv, kv, need_weights=False)[0]
                    if not close(out, multi_head(w, q, kv, kv, None, H)[0]):
                        raise fail("the weights look right but the outputs differ",
                                   "Check dropout (use the same value) and that the module is in eval mode.")
        _check_device(fn)
        return "the copied module gives the same outputs (self- and cross-attention, 2 configurations)"

    return run_check("copy to nn.MultiheadAttention", body)


def _check_device(fn: Callable[[MultiHeadAttention], Any]) -> None:
    """The copy of a module on another device (meta, the checks' stand-in for a GPU) must be there too."""
    mha = on_meta(_twin(8, 2, 13)[0])
    where = ("a module on another device (the check uses 'meta', which holds shapes but no numbers, "
             "in place of a GPU)")
    try:
        theirs = fn(mha)
    except Exception as error:  # noqa: BLE001 - the learner's code: a verdict, never a crash
        if "meta" in str(error):
            raise fail(f"your function fails on {where}: {type(error).__name__}: {str(error).splitlines()[0]} "
                       "(right on the CPU: it built its module on the CPU, without device=)",
                       DEVICE_DTYPE_HINT) from None
        return  # anything else the meta device can't do is not a device mistake
    weight = getattr(theirs, "in_proj_weight", None)
    if isinstance(weight, Tensor) and weight.device != mha.W_q.weight.device:
        raise fail(f"given {where}, your function returned a module on {weight.device}: it was built without "
                   "device=", DEVICE_DTYPE_HINT)


def _torch_out(model: nn.MultiheadAttention, x: Tensor, **masks: Any) -> Tensor:
    with torch.no_grad():
        return model(x, x, x, need_weights=False, **masks)[0]


def check_attn_mask_for_torch(fn: Callable[[Tensor], Any]) -> CheckResult:
    """Check ``fn(allowed) -> attn_mask``: turn a bool ``(L, L)`` mask with True = may attend
    into an ``attn_mask`` that ``nn.MultiheadAttention`` applies the same way."""

    def body() -> str:
        D, H, L = 8, 2, 5
        mha, w = _twin(D, H, 21)
        model = nn.MultiheadAttention(D, H, batch_first=True, dtype=torch.float64).eval()
        with torch.no_grad():
            model.in_proj_weight.copy_(torch.cat([w[n][0] for n in ("W_q", "W_k", "W_v")]))
            model.in_proj_bias.copy_(torch.cat([w[n][1] for n in ("W_q", "W_k", "W_v")]))
            model.out_proj.weight.copy_(w["W_o"][0])
            model.out_proj.bias.copy_(w["W_o"][1])
        g = gen(22)
        x = randn(g, 2, L, D)
        random = torch.rand(L, L, generator=g) > 0.5
        random |= torch.eye(L, dtype=torch.bool)
        for label, allowed in [("a causal mask", causal_mask(L)), ("a random mask", random)]:
            converted = call(fn, allowed.clone(), what=f"your function ({label})")
            converted = expect_tensor(converted, f"the converted {label}", (L, L), dtype="any")
            if converted.dtype == torch.bool and torch.equal(converted, allowed):
                raise fail(f"{label} came back unchanged", CONVENTION_HINT)
            if converted.is_floating_point() and set(converted.unique().tolist()) <= {0.0, 1.0}:
                raise fail(f"{label} came back as 0s and 1s in floating point",
                           "A float attn_mask is *added* to the scores: return a bool mask (True = blocked), "
                           "or 0 and -inf.")
            if converted.dtype == torch.bool and torch.equal(converted, ~allowed.T) and \
                    not torch.equal(converted, ~allowed):
                raise fail(f"{label} came back inverted and transposed",
                           "Rows are queries and columns are keys in both libraries: invert, don't transpose.")
            if converted.is_floating_point():
                converted = converted.double()
            if not close(_torch_out(model, x, attn_mask=converted), multi_head(w, x, x, x, allowed, H)[0]):
                raise fail(f"nn.MultiheadAttention with your conversion of {label} gives different outputs",
                           CONVENTION_HINT)
        return "nn.MultiheadAttention applies your masks like mha_lib (causal and random)"

    return run_check("attn_mask for nn.MultiheadAttention", body)


def check_key_padding_mask_for_torch(fn: Callable[[Tensor], Any]) -> CheckResult:
    """Check ``fn(keep) -> key_padding_mask``: turn ``padding_mask``'s bool ``(B, 1, 1, Lk)``
    (True = real token) into ``nn.MultiheadAttention``'s ``(B, Lk)`` (True = padding)."""

    def body() -> str:
        cases = [[5, 2, 4], [3, 3], [1]]
        for lengths in cases:
            keep = padding_mask(lengths)
            B, Lk = len(lengths), max(lengths)
            got = call(fn, keep.clone(), what=f"your function (lengths={lengths})")
            if isinstance(got, Tensor) and got.shape == keep.shape:
                raise fail(f"the result has shape {tuple(got.shape)}, expected {(B, Lk)}",
                           "key_padding_mask is (B, Lk): drop the two middle axes with keep[:, 0, 0].")
            got = expect_tensor(got, f"the result for lengths={lengths}", (B, Lk), dtype="any")
            if got.is_floating_point():  # PyTorch adds a float key_padding_mask to the scores: 0 or -inf
                values = set(got.unique().tolist())
                if 1.0 in values and values <= {0.0, 1.0}:
                    raise fail(f"the mask for lengths={lengths} came back as 0s and 1s in floating point",
                               "A float key_padding_mask is *added* to the scores: return a bool mask "
                               "(True = padding), or 0 for real tokens and -inf for padding.")
                if not values <= {0.0, float("-inf")}:
                    raise fail(f"the mask for lengths={lengths} holds {sorted(values)[:4]}",
                               "A key_padding_mask is bool (True = padding), or 0 for real tokens and -inf for padding.")
                got = torch.isneginf(got)
            elif got.dtype != torch.bool:
                raise fail(f"the mask for lengths={lengths} has dtype {got.dtype}",
                           "nn.MultiheadAttention's key_padding_mask is bool, True = padding (or float: 0 and -inf).")
            expected = ~keep[:, 0, 0]
            if not torch.equal(got, expected):
                if torch.equal(got, ~expected):
                    raise fail(f"the mask for lengths={lengths} is not inverted", CONVENTION_HINT)
                raise fail(f"wrong mask for lengths={lengths}", "key_padding_mask[b, j] is True where j >= lengths[b].")
        return f"correct on {len(cases)} batches"

    return run_check("key_padding_mask for nn.MultiheadAttention", body)
