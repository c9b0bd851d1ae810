"""Check for chapter 11: attention with a key/value cache, decoding chunk by chunk with RoPE.

Decoding must equal causal rotary attention over the whole sequence (:mod:`.reference`'s
attention on keys rotated by :func:`.positions.rotate`), and the learner's function must keep
no state of its own: it is called twice with the same arguments, and two sequences are decoded
in turn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ._core import (CheckResult, call, check_device_care, check_unchanged, cloned, close, diagnose, expect_tensor, fail,
                    gen, on_meta, randn, run_check)
from .reference import attend as reference_attend
from .positions import rotate

CACHE_CONTRACT = ("With T tokens cached, the n new ones sit at positions T .. T+n-1: rotate the new query and key "
                  "with those positions, append the rotated key and the value to the caches, and let the new "
                  "queries attend to all T + n keys, causally within the chunk.")


def _step(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, *, start: int | None = None,
          append: str = "yes", mask: str = "offset", rotate_v: bool = False, query_start: int | None = None,
          rerotate: bool = False) -> Tensor:
    """One cached attention step with the knobs that common mistakes turn; returns the output.

    ``query_start``: the queries' first position when it differs from the keys'; ``rerotate``: the
    cached keys are rotated again, with the new ones, by positions 0 .. T + n - 1."""
    T, n = k_cache.size(-2), q.size(-2)
    pos = torch.arange(n) + (T if start is None else start)
    q, k_rot = rotate(q, pos if query_start is None else torch.arange(n) + query_start), rotate(k, pos)
    v = rotate(v, pos) if rotate_v else v
    if rerotate:
        k_cache, k_rot = rotate(torch.cat([k_cache, k], -2), torch.arange(T + n)).split([T, n], dim=-2)
    keys, values = {"yes": (torch.cat([k_cache, k_rot], -2), torch.cat([v_cache, v], -2)),
                    "no": (k_rot, v), "past only": (k_cache, v_cache)}[append]
    Lk = keys.size(-2)
    m = {"offset": torch.ones(n, Lk, dtype=torch.bool).tril(diagonal=Lk - n),
         "no offset": torch.ones(n, Lk, dtype=torch.bool).tril(),
         "not itself": torch.ones(n, Lk, dtype=torch.bool).tril(diagonal=Lk - n - 1), "none": None}[mask]
    return reference_attend(q, keys, values, m)[0]


STATE_HINT = ("Use only what the function is given: T = k_cache.size(-2) tells where the new tokens sit, and the "
              "k_cache and v_cache arguments hold the past. A global cache or step counter breaks as soon as two "
              "sequences are decoded, or one is decoded again.")


def _triple(result: Any, shape: tuple[int, ...]) -> tuple[Any, Any, Any]:
    if result is None:
        expect_tensor(None, "the result", shape)  # raises: "not implemented yet"
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        raise fail(f"your function returned {type(result).__name__}; expected (output, k_cache, v_cache)",
                   "End with: return output, k_cache, v_cache")
    return result[0], result[1], result[2]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return a.shape == b.shape and close(a.detach(), b.detach())
    return type(a) is type(b)


def _state_probe(fn: Callable[..., Any], g: torch.Generator, B: int, H: int, d_k: int) -> None:
    """Call ``fn`` twice with the same arguments, from an empty and from a non-empty cache that it
    never built itself: a pure function answers the same both times."""
    empty = torch.zeros(B, H, 0, d_k, dtype=torch.float64)
    past_k, past_v = rotate(randn(g, B, H, 3, d_k), torch.arange(3)), randn(g, B, H, 3, d_k)
    for (k_cache, v_cache), n in (((empty, empty), 3), ((past_k, past_v), 2)):
        T = k_cache.size(-2)
        q, k, v = randn(g, B, H, n, d_k), randn(g, B, H, n, d_k), randn(g, B, H, n, d_k)
        where = f"for a chunk of {n} new tokens after {T} cached"
        results = []
        for _ in range(2):
            result = call(fn, *cloned(q, k, v, k_cache, v_cache), what=f"your function ({where})")
            results.append(_triple(result, (B, H, n, d_k)))
        differ = [name for name, a, b in zip(("output", "k_cache", "v_cache"), *results) if not _same(a, b)]
        if differ:
            raise fail(f"called twice with the same arguments ({where}), your function returned a different "
                       f"{' and '.join(differ)} the second time: it keeps state between calls (a global cache or "
                       "a global step counter?) instead of using the k_cache and v_cache it is given", STATE_HINT)


def check_cached_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(query, key, value, k_cache, v_cache) -> (output, k_cache, v_cache)``.

    ``query, key, value (B, H, n, d_k)``: the new chunk's heads, not yet rotated; ``k_cache,
    v_cache (B, H, T, d_k)``: the rotated keys and the values of the ``T`` earlier tokens
    (``T = 0`` at first). Returns the output ``(B, H, n, d_k)`` and both caches grown to ``T + n``,
    in the inputs' dtype. Decoding chunk by chunk must equal causal rotary attention over the whole
    sequence; the function keeps no state of its own (called twice, it answers the same; two
    sequences decoded in turn don't mix).
    """

    def body() -> str:
        g = gen(92)
        B, H, d_k, chunks = 2, 2, 8, [3, 1, 1, 2, 1]
        L = sum(chunks)
        q_all, k_all, v_all = randn(g, B, H, L, d_k), randn(g, B, H, L, d_k), randn(g, B, H, L, d_k)
        empty = torch.zeros(B, H, 0, d_k, dtype=torch.float64)
        g2 = gen(93)
        _state_probe(fn, g2, B, H, d_k)
        # A second sequence, decoded in turn with the first, from a cache of 2 tokens that the check built.
        other = [randn(g2, B, H, 6, d_k) for _ in range(3)]
        streams = [dict(q=q_all, k=k_all, v=v_all, chunks=chunks, T=0, k_cache=empty, v_cache=empty, label=""),
                   dict(q=other[0], k=other[1], v=other[2], chunks=[1, 2, 1], T=2,
                        k_cache=rotate(other[1][..., :2, :], torch.arange(2)), v_cache=other[2][..., :2, :],
                        label=" (a second sequence, decoded in turn with the first)")]
        for step in range(max(len(st["chunks"]) for st in streams)):
            for st in streams:
                if step < len(st["chunks"]):
                    n, T = st["chunks"][step], st["T"]
                    st["k_cache"], st["v_cache"] = _check_step(fn, st, n, T)
                    st["T"] = T + n
        meta = [on_meta(randn(g, B, H, n, d_k)) for n in (2, 2, 2, 3, 3)]  # query, key, value (2 new), caches (3)
        check_device_care(fn, *meta, what="your function",
                          hint="Make the positions and the mask on the query's device: "
                               "torch.arange(T, T + n, device=query.device), torch.ones(..., device=query.device).")
        return (f"decoding {L} tokens in chunks of {', '.join(map(str, chunks))} equals causal rotary attention, "
                "also on another device")

    return run_check("attention with a key/value cache", body)


def _check_step(fn: Callable[..., Any], st: dict[str, Any], n: int, T: int) -> tuple[Tensor, Tensor]:
    """One call of ``fn`` on the next chunk of the stream ``st``; returns the caches, checked."""
    k_cache, v_cache = st["k_cache"], st["v_cache"]
    B, H, _, d_k = k_cache.shape
    q, k, v = (st[name][..., T:T + n, :] for name in ("q", "k", "v"))
    where = f"for a chunk of {n} new token{'s' if n > 1 else ''} after {T} cached{st['label']}"
    args = cloned(q, k, v, k_cache, v_cache)
    result = call(fn, *args, what=f"your function ({where})")
    check_unchanged(["query", "key", "value", "k_cache", "v_cache"], [q, k, v, k_cache, v_cache], args,
                    "your function")
    out, new_k, new_v = _triple(result, (B, H, n, d_k))
    out = expect_tensor(out, f"the output {where}", (B, H, n, d_k), dtype=torch.float64, explain=" (B, H, n, d_k)")
    for name, cache in (("k_cache", new_k), ("v_cache", new_v)):
        if not isinstance(cache, Tensor) or cache.dim() != 4:
            continue
        held = cache.size(-2)
        if held == T:
            raise fail(f"the returned {name} still holds {T} tokens {where}: the new ones were not appended",
                       "Append the new chunk: torch.cat([k_cache, k], dim=-2), and return the grown caches.")
        if held == T + 2 * n:
            raise fail(f"the returned {name} holds {held} tokens {where}, expected {T + n}: it looks like the new "
                       "ones were appended twice",
                       "Append the new keys and values once (torch.cat along dim=-2) and return that grown cache.")
        if held == n and T > 0:
            raise fail(f"the returned {name} holds only the {n} new token{'s' if n > 1 else ''} {where}, expected "
                       f"{T + n}: it looks like only the new chunk was returned, not the grown cache",
                       "Return the caches with the past and the new tokens: torch.cat([k_cache, k], dim=-2).")
    expected = _step(q, k, v, k_cache, v_cache)
    if not close(out, expected):
        raise diagnose(out, [
            ("a causal mask built as tril on (n, T + n) without the offset T, which hides the past",
             lambda: _step(q, k, v, k_cache, v_cache, mask="no offset"),
             "New query r sits at position T + r and may see keys 0 .. T + r: "
             "torch.ones(n, T + n, dtype=torch.bool).tril(diagonal=T)."),
            ("a mask that hides each new token from itself (tril with diagonal=T - 1)",
             lambda: _step(q, k, v, k_cache, v_cache, mask="not itself"),
             "New token r sits at position T + r and may see keys 0 .. T + r, itself included: "
             "tril(diagonal=T)."),
            ("the positions restart at 0 for every chunk", lambda: _step(q, k, v, k_cache, v_cache, start=0),
             "The new tokens sit at positions T .. T + n - 1, where T = k_cache.size(-2): rotate with "
             "torch.arange(T, T + n)."),
            ("the queries' positions restart at 0 (the keys' are right)",
             lambda: _step(q, k, v, k_cache, v_cache, query_start=0),
             "Rotate the new queries with the same positions as the new keys, torch.arange(T, T + n)."),
            ("the keys' positions restart at 0 (the queries' are right)",
             lambda: _step(q, k, v, k_cache, v_cache, start=0, query_start=T),
             "Rotate the new keys with the same positions as the new queries, torch.arange(T, T + n)."),
            ("the positions start at 1: the new tokens got T + 1 .. T + n instead of T .. T + n - 1",
             lambda: _step(q, k, v, k_cache, v_cache, start=T + 1),
             "The first token sits at position 0, so the new ones at T .. T + n - 1: torch.arange(T, T + n)."),
            ("the positions were counted after appending (the new tokens got T + n .. instead of T ..)",
             lambda: _step(q, k, v, k_cache, v_cache, start=T + n),
             "Read T = k_cache.size(-2) before appending the new keys."),
            ("the cached keys were rotated again (they are stored already rotated)",
             lambda: _step(q, k, v, k_cache, v_cache, rerotate=True),
             "Rotate only the new keys, then append them: the cached ones were rotated when they were new."),
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
        ], f"the output is wrong {where}", CACHE_CONTRACT, expected=expected, axis="new token")
    grown = []
    for name, cache, expected_new in (
            ("k_cache", new_k, torch.cat([k_cache, rotate(k, torch.arange(T, T + n))], -2)),
            ("v_cache", new_v, torch.cat([v_cache, v], -2))):
        cache = expect_tensor(cache, f"the returned {name} {where}", (B, H, T + n, d_k), dtype=torch.float64,
                              explain=" (B, H, T + n, d_k)")
        if not close(cache, expected_new):
            if name == "v_cache":
                raise diagnose(cache, [
                    ("the values were rotated before caching",
                     lambda: torch.cat([v_cache, rotate(v, torch.arange(T, T + n))], -2),
                     "Rotate only the queries and keys; the values go into the cache as they are."),
                    ("the keys were stored in v_cache", lambda: torch.cat([v_cache, rotate(k, torch.arange(T, T + n))], -2),
                     "Append the values to v_cache: torch.cat([v_cache, value], dim=-2)."),
                ], f"the returned v_cache is wrong {where}", CACHE_CONTRACT, expected=expected_new, axis="position")
            raise diagnose(cache, [
                ("the keys were stored before rotating them", lambda: torch.cat([k_cache, k], -2),
                 "The cache holds the keys already rotated, so that each step rotates only the new ones."),
                ("the positions were counted after appending (the new tokens got T + n .. instead of T ..)",
                 lambda: torch.cat([k_cache, rotate(k, torch.arange(T + n, T + 2 * n))], -2),
                 "Read T = k_cache.size(-2) before appending the new keys."),
                ("the positions start at 1: the new keys got T + 1 .. T + n instead of T .. T + n - 1",
                 lambda: torch.cat([k_cache, rotate(k, torch.arange(T + 1, T + n + 1))], -2),
                 "The first token sits at position 0, so the new ones at T .. T + n - 1: torch.arange(T, T + n)."),
                ("the positions restart at 0 for every chunk",
                 lambda: torch.cat([k_cache, rotate(k, torch.arange(n))], -2),
                 "The new tokens sit at positions T .. T + n - 1, where T = k_cache.size(-2)."),
                ("the cached keys were rotated again (they are stored already rotated)",
                 lambda: rotate(torch.cat([k_cache, k], -2), torch.arange(T + n)),
                 "Rotate only the new keys, then append them: the cached ones were rotated when they were new."),
            ], f"the returned k_cache is wrong {where}", CACHE_CONTRACT, expected=expected_new, axis="position")
        grown.append(cache.cpu().to(torch.float64))
    return grown[0], grown[1]  # the learner's own caches, checked, go into the next step
