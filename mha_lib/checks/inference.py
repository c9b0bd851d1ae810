"""Checks for chapter 10: sliding windows, shared key/value heads, decoding with a cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .. import inference as _inference
from .. import masks as _masks
from ._core import CheckResult, call, check_unchanged, cloned, close, diagnose, expect_tensor, fail, gen, randn, run_check
from ._reference import attend as reference_attend
from .positions import rotate

WINDOW_DEFINITION = ("Query i may attend to key j exactly when 0 <= i - j < window: itself and the window - 1 "
                     "keys before it, nothing after it.")


def window(L: int, w: int, *, low: int = 0, high: int | None = None, causal: bool = True) -> Tensor:
    """True where ``low <= i - j < high`` (``high`` defaults to ``w``); ``|i - j| < w`` if not causal."""
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    if not causal:
        return (i - j).abs() < w
    return (i - j >= low) & (i - j < (w if high is None else high))


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
                ("it lets tokens see the future instead of the past (j - i)", window(L, w).T,
                 "Rows are queries, columns are keys: query i sees keys i - window + 1 .. i."),
                ("it is inverted (True where attention is blocked)", ~window(L, w), "True means *may attend*."),
                ("it is the plain causal mask: the window is ignored", torch.ones(L, L, dtype=torch.bool).tril(),
                 "Also block the keys that are window or more positions back: i - j < window."),
            ]
            for name, wrong, hint in mistakes:
                if torch.equal(mask, wrong):
                    raise fail(f"wrong mask for seq_len={L}, window={w}: {name}", hint)
            raise fail(f"wrong mask for seq_len={L}, window={w}", WINDOW_DEFINITION)
        return "correct for (seq_len, window) = " + ", ".join(f"({L}, {w})" for L, w in cases)

    return run_check("sliding_window_mask", body)


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
            out = expect_tensor(out, f"the result {where}", (B, H, L, d_k), explain=" (B, H_kv * n_rep, L, d_k)")
            expected = x[:, torch.arange(H) // n_rep]
            if not close(out, expected):
                raise diagnose(out, [
                    ("the heads were tiled (0, 1, 0, 1, ...) instead of grouped (0, 0, 1, 1, ...)",
                     lambda: x.repeat(1, n_rep, 1, 1),
                     "x.repeat(1, n_rep, 1, 1) tiles the heads. Query heads 0 .. n_rep-1 share key/value head 0, the "
                     "next n_rep share head 1: torch.repeat_interleave(x, n_rep, dim=1), as F.scaled_dot_product_"
                     "attention(enable_gqa=True) and Hugging Face's repeat_kv do."),
                ], f"the result is wrong {where}", "Result head h is head h // n_rep of x.")
        return f"correct on {len(cases)} cases (n_rep = 1, 2, 3, 4)"

    return run_check("repeat_kv", body)


CACHE_CONTRACT = ("With T tokens cached, the n new ones sit at positions T .. T+n-1: rotate the new query and key "
                  "with those positions, append the rotated key and the value to the caches, and let the new "
                  "queries attend to all T + n keys, causally within the chunk.")


def _step(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, *, start: int | None = None,
          append: str = "yes", mask: str = "offset", rotate_v: bool = False) -> Tensor:
    """One cached attention step with the knobs that common mistakes turn; returns the output."""
    T, n = k_cache.size(-2), q.size(-2)
    pos = torch.arange(n) + (T if start is None else start)
    q, k = rotate(q, pos), rotate(k, pos)
    v = rotate(v, pos) if rotate_v else v
    keys, values = {"yes": (torch.cat([k_cache, k], -2), torch.cat([v_cache, v], -2)),
                    "no": (k, v), "past only": (k_cache, v_cache)}[append]
    Lk = keys.size(-2)
    m = {"offset": torch.ones(n, Lk, dtype=torch.bool).tril(diagonal=Lk - n),
         "no offset": torch.ones(n, Lk, dtype=torch.bool).tril(), "none": None}[mask]
    return reference_attend(q, keys, values, m)[0]


def check_cached_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(query, key, value, k_cache, v_cache) -> (output, k_cache, v_cache)``.

    ``query, key, value (B, H, n, d_k)``: the new chunk's heads, not yet rotated; ``k_cache,
    v_cache (B, H, T, d_k)``: the rotated keys and the values of the ``T`` earlier tokens
    (``T = 0`` at first). Returns the output ``(B, H, n, d_k)`` and both caches grown to ``T + n``.
    Decoding chunk by chunk must equal causal rotary attention over the whole sequence.
    """

    def body() -> str:
        g = gen(92)
        B, H, d_k, chunks = 2, 2, 8, [3, 1, 1, 2, 1]
        L = sum(chunks)
        q_all, k_all, v_all = randn(g, B, H, L, d_k), randn(g, B, H, L, d_k), randn(g, B, H, L, d_k)
        k_cache, v_cache = torch.zeros(B, H, 0, d_k, dtype=torch.float64), torch.zeros(B, H, 0, d_k, dtype=torch.float64)
        T = 0
        for n in chunks:
            q, k, v = (t[..., T:T + n, :] for t in (q_all, k_all, v_all))
            where = f"for a chunk of {n} new token{'s' if n > 1 else ''} after {T} cached"
            args = cloned(q, k, v, k_cache, v_cache)
            result = call(fn, *args, what=f"your function ({where})")
            check_unchanged(["query", "key", "value", "k_cache", "v_cache"], [q, k, v, k_cache, v_cache], args,
                            "your function")
            if result is None:
                expect_tensor(None, "the result", (B, H, n, d_k))  # raises: "not implemented yet"
            if not isinstance(result, (tuple, list)) or len(result) != 3:
                raise fail(f"your function returned {type(result).__name__}; expected (output, k_cache, v_cache)",
                           "End with: return output, k_cache, v_cache")
            out, new_k, new_v = result
            out = expect_tensor(out, f"the output {where}", (B, H, n, d_k), explain=" (B, H, n, d_k)")
            expected = _step(q, k, v, k_cache, v_cache)
            if not close(out, expected):
                raise diagnose(out, [
                    ("a causal mask built as tril on (n, T + n) without the offset T, which hides the past",
                     lambda: _step(q, k, v, k_cache, v_cache, mask="no offset"),
                     "New query r sits at position T + r and may see keys 0 .. T + r: "
                     "torch.ones(n, T + n, dtype=torch.bool).tril(diagonal=T)."),
                    ("the positions restart at 0 for every chunk", lambda: _step(q, k, v, k_cache, v_cache, start=0),
                     "The new tokens sit at positions T .. T + n - 1, where T = k_cache.size(-2): rotate with "
                     "torch.arange(T, T + n)."),
                    ("the positions were counted after appending (the new tokens got T + n .. instead of T ..)",
                     lambda: _step(q, k, v, k_cache, v_cache, start=T + n),
                     "Read T = k_cache.size(-2) before appending the new keys."),
                    ("the new queries attend only to the new keys: the cache was not used",
                     lambda: _step(q, k, v, k_cache, v_cache, append="no"),
                     "Append the new keys and values to the caches (torch.cat along dim=-2) and attend to all of them."),
                    ("the new queries attend only to the cached keys, not to their own chunk",
                     lambda: _step(q, k, v, k_cache, v_cache, append="past only"),
                     "Append the new keys and values first, then attend: a token may attend to itself."),
                    ("there is no causal mask within the chunk", lambda: _step(q, k, v, k_cache, v_cache, mask="none"),
                     "Within a chunk of several tokens, each may see only the ones before it (and itself)."),
                    ("the values were rotated too", lambda: _step(q, k, v, k_cache, v_cache, rotate_v=True),
                     "Rotate only the queries and keys; the values stay as they are."),
                ], f"the output is wrong {where}", CACHE_CONTRACT)
            grown = []
            for name, cache, old, expected_new in (
                    ("k_cache", new_k, k_cache, torch.cat([k_cache, rotate(k, torch.arange(T, T + n))], -2)),
                    ("v_cache", new_v, v_cache, torch.cat([v_cache, v], -2))):
                if isinstance(cache, Tensor) and tuple(cache.shape) == tuple(old.shape):
                    raise fail(f"the returned {name} still holds {T} tokens {where}: the new ones were not appended",
                               "Append the new chunk: torch.cat([k_cache, k], dim=-2), and return the grown caches.")
                cache = expect_tensor(cache, f"the returned {name} {where}", (B, H, T + n, d_k),
                                      explain=" (B, H, T + n, d_k)")
                if not close(cache, expected_new):
                    if name == "v_cache":
                        raise fail(f"the returned v_cache is wrong {where}", CACHE_CONTRACT)
                    raise diagnose(cache, [
                        ("the keys were stored before rotating them", lambda: torch.cat([k_cache, k], -2),
                         "The cache holds the keys already rotated, so that each step rotates only the new ones."),
                        ("the positions were counted after appending (the new tokens got T + n .. instead of T ..)",
                         lambda: torch.cat([k_cache, rotate(k, torch.arange(T + n, T + 2 * n))], -2),
                         "Read T = k_cache.size(-2) before appending the new keys."),
                    ], f"the returned k_cache is wrong {where}", CACHE_CONTRACT)
                grown.append(cache.cpu().to(torch.float64))
            k_cache, v_cache = grown  # the learner's own caches, checked, go into the next step
            T += n
        return f"decoding {L} tokens in chunks of {', '.join(map(str, chunks))} equals causal rotary attention"

    return run_check("attention with a key/value cache", body)
