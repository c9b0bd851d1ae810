"""Checks for chapter 11: the sliding-window mask and shared key/value heads (``repeat_kv``),
the two ways attention at inference reads less. Decoding with a cache: :mod:`.kv_cache`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .. import inference as _inference
from .. import masks as _masks
from ._core import CheckResult, call, check_unchanged, cloned, close, diagnose, expect_tensor, fail, gen, randn, run_check

WINDOW_DEFINITION = ("Query i may attend to key j exactly when 0 <= i - j < window: itself and the window - 1 "
                     "keys before it, nothing after it.")


def window(L: int, w: int, *, low: int = 0, high: int | None = None, causal: bool = True) -> Tensor:
    """True where ``low <= i - j < high`` (``high`` defaults to ``w``); ``|i - j| < w`` if not causal."""
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    if not causal:
        return (i - j).abs() < w
    return (i - j >= low) & (i - j < (w if high is None else high))


def _keys(row: Tensor) -> str:
    keys = row.nonzero().flatten().tolist()
    return "no key" if not keys else "key" + ("s " if len(keys) > 1 else " ") + ", ".join(map(str, keys))


def _first_wrong_row(mask: Tensor, expected: Tensor) -> str:
    """``"query 3 may attend to keys 0, 1, 2, 3, expected keys 1, 2, 3"``: the first row that differs."""
    rows = (mask != expected).any(-1).nonzero().flatten().tolist()
    if not rows:
        return ""
    i = rows[0]
    more = f" ({len(rows)} queries differ)" if len(rows) > 1 else ""
    return f"query {i} may attend to {_keys(mask[i])}, expected {_keys(expected[i])}{more}"


def check_sliding_window_mask(fn: Callable[[int, int], Any]) -> CheckResult:
    """Check ``fn(seq_len, window) -> mask``: bool ``(L, L)``, True exactly where ``0 <= i - j < window``."""

    def body() -> str:
        cases = [(7, 3), (6, 2), (5, 1), (4, 4), (4, 6)]
        for L, w in cases:
            mask = call(fn, L, w, what=f"your function (seq_len={L}, window={w})",
                        forbidden=[_masks.sliding_window_mask])
            mask = expect_tensor(mask, f"the mask for seq_len={L}, window={w}", (L, L), dtype="bool").cpu()
            expected = window(L, w)
            if torch.equal(mask, expected):
                continue
            mistakes = [
                ("it is off by one: each query sees window + 1 keys (i - j <= window)", window(L, w, high=w + 1),
                 f"A window of {w} holds {w} keys, the query's own included: 0 <= i - j < window (strictly less)."),
                ("it is off by one: each query sees window - 1 keys", window(L, w, high=w - 1),
                 f"A window of {w} holds {w} keys, the query's own included: 0 <= i - j < window."),
                ("it hides each token from itself (0 < i - j < window)", window(L, w, low=1),
                 "The window includes the query's own position (i - j = 0): 0 <= i - j < window, not 0 < i - j."),
                ("it hides each token from itself and sees the window keys before it (0 < i - j <= window)",
                 window(L, w, low=1, high=w + 1),
                 "The window includes the query's own position (i - j = 0): 0 <= i - j < window."),
                ("it is not causal: it also lets queries see the next keys (|i - j| < window)", window(L, w, causal=False),
                 "A decoder may never look ahead: require i - j >= 0 as well as i - j < window."),
                ("the lower bound i - j >= 0 is missing: every query may see all the keys after it (only "
                 "i - j < window was required)", window(L, w, low=-L),
                 "A decoder may never look ahead: combine both comparisons, (i - j >= 0) & (i - j < window)."),
                ("it lets tokens see the future instead of the past (j - i)", window(L, w).T,
                 "Rows are queries, columns are keys: query i sees keys i - window + 1 .. i."),
                ("it is inverted (True where attention is blocked)", ~window(L, w), "True means *may attend*."),
                ("it is the plain causal mask: the window is ignored", torch.ones(L, L, dtype=torch.bool).tril(),
                 "Also block the keys that are window or more positions back: i - j < window."),
            ]
            for name, wrong, hint in mistakes:
                if torch.equal(mask, wrong):
                    raise fail(f"wrong mask for seq_len={L}, window={w}: {name}", hint)
            raise fail(f"wrong mask for seq_len={L}, window={w}: {_first_wrong_row(mask, expected)}", WINDOW_DEFINITION)
        return "correct for (seq_len, window) = " + ", ".join(f"({L}, {w})" for L, w in cases)

    return run_check("sliding_window_mask", body)


def _head_sources(out: Tensor, x: Tensor, n_rep: int) -> str:
    """``"its heads are x's heads 0, 1, 0, 1 (expected 0, 0, 1, 1)"``, "?" for a head that is none of x's."""
    sources = []
    for h in range(out.size(1)):
        match = [j for j in range(x.size(1)) if close(out[:, h], x[:, j])]
        sources.append(str(match[0]) if match else "?")
    expected = ", ".join(str(h // n_rep) for h in range(out.size(1)))
    if all(s == "?" for s in sources):
        return f"none of its heads is a head of x (head h must be x's head h // n_rep: {expected})"
    return f"its heads are x's heads {', '.join(sources)} (? = none of x's), expected {expected}"


def check_repeat_kv(fn: Callable[[Tensor, int], Any]) -> CheckResult:
    """Check ``fn(x, n_rep)``: ``(B, H_kv, L, d_k) -> (B, H_kv·n_rep, L, d_k)``, head ``h`` of the
    result being head ``h // n_rep`` of ``x`` (each key/value head serves a block of query heads)."""

    def body() -> str:
        g = gen(91)
        cases = [((2, 2, 3, 4), 3), ((1, 4, 2, 2), 2), ((2, 1, 3, 2), 4), ((1, 3, 2, 2), 1)]
        for (B, H_kv, L, d_k), n_rep in cases:
            x = randn(g, B, H_kv, L, d_k)
            where = f"for x {tuple(x.shape)} and n_rep={n_rep}"
            (arg,) = cloned(x)
            out = call(fn, arg, n_rep, what=f"your function ({where})", forbidden=[_inference.repeat_kv])
            check_unchanged(["x"], [x], [arg], "your function")
            H = H_kv * n_rep
            if isinstance(out, Tensor) and tuple(out.shape) == (B, H_kv, n_rep, L, d_k):
                raise fail(f"the result {where} has shape {tuple(out.shape)}, expected {(B, H, L, d_k)}",
                           "Merge the two head axes: .reshape(B, H_kv * n_rep, L, d_k).")
            if isinstance(out, Tensor) and tuple(out.shape) in ((B, H_kv, L * n_rep, d_k), (B * n_rep, H_kv, L, d_k)) \
                    and n_rep > 1:
                raise fail(f"the result {where} has shape {tuple(out.shape)}: it was repeated along the wrong axis",
                           "Repeat along the head axis, dim=1: the result is (B, H_kv * n_rep, L, d_k).")
            out = expect_tensor(out, f"the result {where}", (B, H, L, d_k), dtype=x.dtype,
                                explain=" (B, H_kv * n_rep, L, d_k)")
            expected = x[:, torch.arange(H) // n_rep]
            if not close(out, expected):
                verdict = diagnose(out, [
                    ("the heads were tiled (0, 1, 0, 1, ...) instead of grouped (0, 0, 1, 1, ...)",
                     lambda: x.repeat(1, n_rep, 1, 1),
                     "x.repeat(1, n_rep, 1, 1) tiles the heads. Query heads 0 .. n_rep-1 share key/value head 0, the "
                     "next n_rep share head 1: torch.repeat_interleave(x, n_rep, dim=1), as F.scaled_dot_product_"
                     "attention(enable_gqa=True) and Hugging Face's repeat_kv do."),
                ], f"the result is wrong {where}", "Result head h is head h // n_rep of x.")
                if verdict.message.endswith(where):  # no mistake named: say which head came from where
                    verdict.message += ": " + _head_sources(out, x, n_rep)
                raise verdict
        return f"correct on {len(cases)} cases (n_rep = 1, 2, 3, 4)"

    return run_check("repeat_kv", body)
