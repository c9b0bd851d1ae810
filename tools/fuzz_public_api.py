"""A fuzz of mha_lib's public API: every public function and class, called with bad and with unusual
but valid arguments, one argument at a time, the way a learner or a user would get them wrong.

    python tools/fuzz_public_api.py            # the counts, then every case that is not fine
    python tools/fuzz_public_api.py --all      # every case

Each call is one of:

- ``accepted``: a valid edge input (``np.int64`` sizes, NumPy arrays where documented, slices,
  float masks, ...) gave the result of the plain input (or of a reference such as PyTorch);
- ``refused``: a bad input raised ValueError or TypeError, from mha_lib's own code, with a message
  that names the argument;
- ``unclear``: an error from deep inside Python, NumPy or PyTorch, or one that does not name the argument;
- ``silently wrong``: a bad input was accepted, or a valid one gave a different result than its reference;
- ``valid refused``: a valid edge input raised.

The bars (tests/test_fuzz_public_api.py): no ``silently wrong``, no ``valid refused``, at most 3 ``unclear``.
Cases that may go either way (``seq_len=0``: an empty mask or a refusal) count as ``accepted`` or ``refused``
but still must not be unclear. Seeded: every run makes the same cases. A GPU is not needed: device mix-ups
are left to the tests that have one.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import random
import re
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402

import mha_lib  # noqa: E402
from mha_lib import checks, induction, sentiment  # noqa: E402

OURS = str(Path(mha_lib.__file__).resolve().parent)
NAN, INF = float("nan"), float("inf")
BAD_SIZES = (None, "4", 4.0, 2.5, -1, True, NAN)
OUTCOMES = ("accepted", "refused", "unclear", "silently wrong", "valid refused")


@dataclass
class Case:
    target: str  # what was called, e.g. "split_heads(num_heads='4')"
    call: Callable[[], Any]
    expect: str  # "valid", "bad" or "either"
    words: tuple[str, ...] = ()  # a clear refusal names one of these (the argument)
    reference: Callable[[Any], bool] | None = None  # for a valid call: is the result right?


def same(a: Any, b: Any) -> bool:
    """Equal results: tensors (NaN equal to NaN), modules (weights and repr), containers, numbers."""
    if isinstance(a, torch.nn.Module):
        return (isinstance(b, torch.nn.Module) and repr(a) == repr(b)
                and same(list(a.state_dict().values()), list(b.state_dict().values())))
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
                and bool(torch.allclose(a.double(), b.double(), atol=1e-6, equal_nan=True)))
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if hasattr(a, "__dict__") and not isinstance(a, type):  # a dataclass or another object: its fields
        return type(a) is type(b) and same(vars(a), vars(b))
    return bool(a == b)


def classify(case: Case) -> tuple[str, str]:
    """(outcome, what happened)."""
    try:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            result = case.call()
    except Exception as error:  # noqa: BLE001 - classifying every error is the point
        text = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:160]
        if case.expect == "valid":
            return "valid refused", text
        frames = traceback.extract_tb(error.__traceback__)
        ours = bool(frames) and str(Path(frames[-1].filename).resolve()).startswith(OURS)
        named = any(re.search(rf"(?<![\w.]){re.escape(word)}(?!\w)", str(error), re.I) for word in case.words)
        clear = isinstance(error, (ValueError, TypeError, RuntimeError)) and ours and named
        return ("refused" if clear else "unclear"), text
    finally:
        plt.close("all")
    if isinstance(result, checks.CheckResult):  # a check's verdict on a bad answer is its refusal
        fine = result.status != "passed" if case.expect == "bad" else result.status == "passed"
        return ("refused" if case.expect == "bad" else "accepted") if fine else "silently wrong", result.message[:160]
    if case.expect == "bad":
        return "silently wrong", f"returned {type(result).__name__}"
    try:
        right = case.expect != "valid" or case.reference is None or case.reference(result)
    except Exception as error:  # noqa: BLE001 - a result the reference can't even compare with
        right = False
        result = error
    if not right:
        return "silently wrong", f"differs from the reference ({_short(result)})"
    return "accepted", ""


def seeded(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        torch.manual_seed(0)
        return fn(*args, **kwargs)
    return call


def plain_call(target: str, fn: Callable[..., Any], base: dict) -> tuple[Any, Case | None]:
    """``fn(**base)``'s result, or, when that plain call itself fails, the one valid case that says so."""
    try:
        return fn(**base), None
    except Exception:  # noqa: BLE001 - any failure of the plain call is the finding
        return None, Case(f"{target}({_args(base)})", partial(fn, **base), "valid")


def sizes(target: str, fn: Callable[..., Any], base: dict, names: tuple[str, ...], zero: str = "bad",
          extra_bad: dict | None = None, optional: bool = False) -> Iterator[Case]:
    """Each size argument in ``names``: the bad values, ``0`` (``zero``: bad, valid or either), NumPy ints
    (``optional``: None is the default, not a bad value)."""
    fn = seeded(fn)
    expected, failing = plain_call(target, fn, base)
    if failing is not None:
        yield failing
        return
    for name in names:
        for bad in BAD_SIZES[optional:] + tuple((extra_bad or {}).get(name, ())):
            yield Case(f"{target}({name}={bad!r})", partial(fn, **{**base, name: bad}), "bad", (name,))
        if zero != "valid":
            yield Case(f"{target}({name}=0)", partial(fn, **{**base, name: 0}), zero, (name,))
        for cast in (np.int64, np.int32):
            yield Case(f"{target}({name}=np.{cast.__name__})", partial(fn, **{**base, name: cast(base[name])}),
                       "valid", (name,), lambda r: same(r, expected))


def values(target: str, fn: Callable[..., Any], base: dict, name: str, bad: tuple = (), valid: tuple = (),
           either: tuple = (), words: tuple[str, ...] = ()) -> Iterator[Case]:
    """One argument: bad values, valid ones (same result as ``base`` unless they are tuples
    ``(value, reference_result)``), and ones that may go either way."""
    fn = seeded(fn)
    expected, failing = plain_call(target, fn, base)
    if failing is not None:
        yield failing
        return
    for value in bad:
        yield Case(f"{target}({name}={_short(value)})", partial(fn, **{**base, name: value}), "bad", words or (name,))
    for value in either:
        yield Case(f"{target}({name}={_short(value)})", partial(fn, **{**base, name: value}), "either", words or (name,))
    for value in valid:
        yield Case(f"{target}({name}={_short(value)})", partial(fn, **{**base, name: value}), "valid", (name,),
                   lambda r: same(r, expected))


def _args(base: dict) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in base.items())


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}:{str(value.dtype).replace('torch.', '')}"
    if isinstance(value, np.ndarray):
        return f"ndarray{value.shape}"
    text = repr(value)
    return text if len(text) < 30 else text[:27] + "..."


def tensor_bad(x: torch.Tensor) -> tuple:
    """The usual wrong things in place of a float tensor ``x``."""
    return (None, x.tolist(), x.numpy(), x[0], x[None], x.long(), 3.0)


def flag_bad() -> tuple:
    return ("False", "no", 1, 0, None)


def functions() -> Iterator[Case]:
    g = torch.Generator().manual_seed(0)
    randn = partial(torch.randn, generator=g)
    yield from sizes("causal_mask", mha_lib.causal_mask, dict(seq_len=4), ("seq_len",), zero="either")
    yield from values("causal_mask", mha_lib.causal_mask, dict(seq_len=4), "device", bad=("nope", 3.5, [0]),
                      valid=("cpu", torch.device("cpu"), None))
    yield from sizes("sliding_window_mask", mha_lib.sliding_window_mask, dict(seq_len=5, window=2),
                     ("seq_len", "window"), zero="either")
    yield from sizes("sliding_window_mask", mha_lib.sliding_window_mask, dict(seq_len=5, window=2, sinks=1),
                     ("sinks",), zero="valid")
    yield from values("padding_mask", mha_lib.padding_mask, dict(lengths=[3, 1]), "lengths",
                      bad=(None, "31", 3, [3, -1], [3.5, 1], [[3], [1]], torch.tensor([3.0, 1.0]), [True, False], []),
                      valid=((3, 1), np.array([3, 1]), torch.tensor([3, 1]), [np.int64(3), 1]))
    yield from values("padding_mask", mha_lib.padding_mask, dict(lengths=[3, 1], max_len=5), "max_len",
                      bad=(2, -1, 2.5, "5", True), valid=(np.int64(5), torch.tensor(5)))
    x3, x4 = randn(2, 3, 8), randn(2, 2, 3, 4)
    # a function of one tensor names it by its own name: "split_heads expects (B, L, D), got ..."
    yield from values("split_heads", mha_lib.split_heads, dict(x=x3, num_heads=2), "x", bad=tensor_bad(x3)[:5],
                      words=("x", "split_heads"))
    yield from sizes("split_heads", mha_lib.split_heads, dict(x=x3, num_heads=2), ("num_heads",),
                     extra_bad={"num_heads": (3,)})
    yield from values("combine_heads", mha_lib.combine_heads, dict(x=x4), "x", bad=tensor_bad(x4)[:5],
                      words=("x", "combine_heads"))
    yield from values("repeat_kv", mha_lib.repeat_kv, dict(x=x4, n_rep=2), "x", bad=tensor_bad(x4)[:5],
                      words=("x", "repeat_kv"))
    yield from sizes("repeat_kv", mha_lib.repeat_kv, dict(x=x4, n_rep=2), ("n_rep",))
    yield from sizes("sinusoidal_positions", mha_lib.sinusoidal_positions, dict(seq_len=4, d_model=8),
                     ("seq_len", "d_model"), zero="either")
    yield from sizes("alibi_bias", mha_lib.alibi_bias, dict(num_heads=4, seq_len=3), ("num_heads", "seq_len"),
                     zero="either")
    yield from sizes("relative_position_buckets", mha_lib.relative_position_buckets,
                     dict(seq_len=5, num_buckets=8, max_distance=16), ("seq_len", "num_buckets",
                                                                       "max_distance"), zero="either")
    yield from values("relative_position_buckets", mha_lib.relative_position_buckets, dict(seq_len=5), "bidirectional",
                      bad=flag_bad(), valid=(np.bool_(True),))
    yield from sizes("kv_cache_bytes", mha_lib.kv_cache_bytes, dict(num_layers=2, num_kv_heads=2, d_k=4, seq_len=8),
                     ("num_layers", "num_kv_heads", "d_k", "seq_len"), zero="valid")
    yield from sizes("latent_cache_bytes", mha_lib.latent_cache_bytes, dict(num_layers=2, d_latent=4, seq_len=8),
                     ("num_layers", "d_latent", "seq_len"), zero="valid")
    yield from values("seed_everything", mha_lib.seed_everything, dict(seed=1), "seed",
                      bad=(1.5, "1", None, True, -1, 2**70), valid=(np.int64(1), 0))
    r = randn(1, 2, 3, 4)
    yield from values("apply_rotary", mha_lib.apply_rotary, dict(x=r), "x",
                      bad=(None, r.numpy(), r.long(), r.bool(), randn(1, 2, 3, 3), randn(4)), words=("x", "d_k"))
    yield from values("apply_rotary", mha_lib.apply_rotary, dict(x=r), "positions",
                      bad=(torch.arange(4), torch.arange(3.0), [0, 1, 2], "0", torch.arange(6).view(2, 3)),
                      valid=(torch.arange(3), np.int64(0) + torch.arange(3)))
    yield from values("apply_rotary", mha_lib.apply_rotary, dict(x=r), "base",
                      bad=(INF, NAN, 1.0, 0.5, -1.0, "1e4", None, True), valid=(np.float64(10000.0), 10000))
    yield from values("apply_rotary", mha_lib.apply_rotary, dict(x=r), "positions",
                      bad=(torch.arange(3).view(3, 1), torch.arange(3).view(1, 1, 3), torch.arange(3).bool()),
                      valid=(torch.arange(3).view(1, 3),), words=("positions",))
    yield from values("apply_rotary", mha_lib.apply_rotary, dict(x=r), "interleaved", bad=flag_bad(),
                      valid=(np.bool_(False),))
    yield from sizes("rotary_permutation", mha_lib.rotary_permutation, dict(d_k=4), ("d_k",),
                     extra_bad={"d_k": (3,)})
    yield from values("plot_attention", mha_lib.plot_attention, dict(weights=torch.rand(3, 4)), "weights",
                      bad=(None, "w", torch.rand(2, 2, 2, 3, 4), torch.rand(0, 4)), valid=(),
                      either=(np.random.default_rng(0).random((3, 4)), [[0.5, 0.5], [1.0, 0.0]], torch.rand(3, 4) * NAN))
    yield from values("plot_attention", mha_lib.plot_attention, dict(weights=torch.rand(3, 4)), "query_labels",
                      bad=(3, ["a", "b"], "ab cd"), either=(["a", "b", "c"], ("a", "b", "c"), "abc"))  # one per character
    yield from sdpa_cases(randn)
    yield from explorer_cases(randn)


def explorer_cases(randn: Callable[..., torch.Tensor]) -> Iterator[Case]:
    """attention_explorer: tokens, one (H, L, L) tensor of causal weights per layer, a title."""
    explore = mha_lib.attention_explorer
    w = randn(2, 3, 3).masked_fill(~mha_lib.causal_mask(3), -INF).softmax(-1)  # (H, L, L), causal
    base = dict(tokens=["a", "b", "c"], weights=[w, w])
    expected = explore(**base).data()

    def case(name: str, value: Any, expect: str) -> Case:
        return Case(f"attention_explorer({name}={_short(value)})", partial(explore, **{**base, name: value}), expect,
                    (name,), lambda r: r.data() == expected)

    for tokens in (None, 3, "abc", ["a", "b"], [1, 2, 3], ["a", "b", None], [], ["a"] * 513):
        yield case("tokens", tokens, "bad")
    for tokens in (("a", "b", "c"), [np.str_("a"), "b", "c"]):
        yield case("tokens", tokens, "valid")
    for weights in (None, w, [], [w.tolist()], [w.long()], [w.bool()], [w[0]], [w[None].expand(2, 2, 3, 3)],
                    [w[:, :2, :2]], [w, w[:1]], [w.mT], [w * 2], [w * NAN], [w - 0.5], [randn(2, 3, 3)]):
        yield case("weights", weights, "bad")
    for weights in ((w, w), [w[None], w], [w.numpy(), w.double()], [w.clone().requires_grad_(), w]):
        yield case("weights", weights, "valid")
    for title in (3, b"t", ["t"]):
        yield case("title", title, "bad")
    yield Case("attention_explorer(title='t')", partial(explore, **base, title="t"), "valid", ("title",),
               lambda r: r.data() == expected and r.title == "t")


def sdpa_cases(randn: Callable[..., torch.Tensor]) -> Iterator[Case]:
    sdpa = mha_lib.scaled_dot_product_attention
    q, k, v = randn(2, 3, 4), randn(2, 5, 4), randn(2, 5, 6)
    base = dict(query=q, key=k, value=v)

    def torch_ref(query, key, value, mask=None):
        return lambda r: same(r[0], F.scaled_dot_product_attention(query, key, value, attn_mask=mask))

    for name, x in base.items():
        yield from values("scaled_dot_product_attention", sdpa, base, name,
                          bad=tensor_bad(x)[:4] + (x.long(), x.double()))
    yield Case("scaled_dot_product_attention(4-D query, 3-D key/value)", partial(sdpa, randn(2, 2, 3, 4), k, v),
               "bad", ("dimensions",))
    yield Case("scaled_dot_product_attention(d_k mismatch)", partial(sdpa, q, randn(2, 5, 3), v), "bad", ("d_k",))
    yield Case("scaled_dot_product_attention(Lk mismatch)", partial(sdpa, q, k, randn(2, 4, 6)), "bad", ("Lk",))
    yield from values("scaled_dot_product_attention", sdpa, base, "mask",
                      bad=(torch.ones(3, 5, dtype=torch.long), torch.ones(3, 5), torch.zeros(3, 5) * NAN,
                           torch.zeros(3, 5).masked_fill(torch.eye(3, 5, dtype=torch.bool), INF),
                           torch.ones(5, 3, dtype=torch.bool), torch.ones(4, 3, 5, dtype=torch.bool), [[True] * 5] * 3),
                      words=("mask",))
    yield from values("scaled_dot_product_attention", sdpa, base, "dropout_p",
                      bad=(-0.1, 1.0, NAN, "0.1", None, True), valid=(0, np.float64(0.0)))
    yield from values("scaled_dot_product_attention", sdpa, base, "sinks",
                      bad=([0.0], torch.zeros(2, 1, 1).long(), torch.zeros(2, 1, 1).double(), torch.zeros(2, 1, 2),
                           torch.zeros(3, 1, 1), torch.zeros(2, 3, 5), torch.full((2, 1, 1), NAN),
                           torch.full((2, 1, 1), INF), "0"),
                      valid=(torch.full((2, 1, 1), -INF),), words=("sinks",))  # -inf: no sink
    for shape in ((3, 4), (1, 2, 3, 4), (2, 1, 2, 3, 4)):
        qq, kk, vv = randn(*shape), randn(*shape[:-2], 5, 4), randn(*shape[:-2], 5, 6)
        yield Case(f"scaled_dot_product_attention({shape} against PyTorch)", partial(sdpa, qq, kk, vv), "valid",
                   ("query",), torch_ref(qq, kk, vv))
    bias = randn(3, 5)
    yield Case("scaled_dot_product_attention(float bias mask)", partial(sdpa, q, k, v, bias), "valid", ("mask",),
               torch_ref(q, k, v, bias))
    keys = torch.tensor([True, False, True, True, False])
    yield Case("scaled_dot_product_attention((Lk,) mask)", partial(sdpa, q, k, v, keys), "valid", ("mask",),
               torch_ref(q, k, v, keys))
    half = (randn(1, 3, 64) * 60).half(), (randn(1, 5, 64) * 60).half(), randn(1, 5, 6).half()  # QK^T up to ~1e5

    def close_to_torch(r: Any) -> bool:
        expected = F.scaled_dot_product_attention(*(t.float() for t in half))
        return bool(torch.isfinite(r[0]).all()) and bool(torch.allclose(r[0].float(), expected, atol=2e-2))

    yield Case("scaled_dot_product_attention(float16, QK^T past 65504)", partial(sdpa, *half), "valid", ("query",),
               close_to_torch)
    nan_v = v.clone()
    nan_v[:, 4] = NAN  # a padded position's value
    yield Case("scaled_dot_product_attention(NaN in a masked value)",
               partial(sdpa, q, k, nan_v, mha_lib.padding_mask([4, 4], max_len=5)[:, 0]),
               "either", ("value", "NaN", "nan"))


def module_cases() -> Iterator[Case]:
    x = torch.randn(2, 4, 8)
    for cls in (mha_lib.MultiHeadAttention, mha_lib.EfficientMultiHeadAttention):
        name = cls.__name__
        base = dict(d_model=8, num_heads=2)
        yield from sizes(name, cls, base, ("d_model", "num_heads"), extra_bad={"num_heads": (3, 16)})
        yield from sizes(name, cls, dict(base, num_kv_heads=1), ("num_kv_heads",), extra_bad={"num_kv_heads": (3,)},
                         optional=True)
        yield from values(name, cls, base, "dropout", bad=(-0.1, 1.0, NAN, "0.1", True, None), valid=(0, np.float64(0.0)))
        for flag in ("bias", "rotary"):
            yield from values(name, cls, dict(base, **{flag: False}), flag, bad=flag_bad(), valid=(np.bool_(False),))
        yield Case(f"{name}(rotary=True, d_k odd)", partial(cls, 6, 2, rotary=True), "bad", ("rotary", "d_k"))
        rotary = dict(base, rotary=True)
        yield from values(name, cls, rotary, "rope_base", bad=(INF, NAN, 1.0, 0.5, -1.0, "1e4", True),
                          valid=(np.float64(10000.0), 10000))
        yield from values(name, cls, rotary, "rope_interleaved", bad=flag_bad(), valid=(np.bool_(False),))
        for flag in ("qk_norm", "sinks"):
            yield from values(name, cls, dict(base, **{flag: False}), flag, bad=flag_bad(), valid=(np.bool_(False),))
        for setting in (dict(rope_base=500.0), dict(rope_interleaved=True)):  # RoPE's settings without RoPE
            yield Case(f"{name}({next(iter(setting))}, rotary=False)", partial(cls, 8, 2, **setting), "bad",
                       ("rotary",))
        if cls is mha_lib.EfficientMultiHeadAttention:  # its kernel takes no sink logits: refused, not ignored
            yield Case(f"{name}(sinks=True)", partial(cls, 8, 2, sinks=True), "bad", ("sinks",))
        rotary_module = seeded(cls)(8, 2, rotary=True)
        fwd = dict(query=x, key=x, value=x)
        yield from values(f"{name}.forward", rotary_module, fwd, "positions",
                          bad=(torch.arange(4.0), [0, 1, 2, 3], torch.arange(5), torch.arange(12).view(3, 4),
                               torch.arange(4).bool(), torch.arange(4, device="meta"), "0..3"),
                          valid=(torch.arange(4), torch.arange(4).expand(2, 4), np.int64(0) + torch.arange(4)))
        yield Case(f"{name}.forward(positions, rotary=False)",
                   partial(seeded(cls)(8, 2), x, x, x, positions=torch.arange(4)), "bad", ("positions", "rotary"))
        yield Case(f"{name}.forward(positions, cross-attention)",
                   partial(rotary_module, x, x[:, :2], x[:, :2], positions=torch.arange(4)), "bad", ("positions",))
        module = seeded(cls)(8, 2)
        fwd = dict(query=x, key=x, value=x)
        for arg in ("query", "key", "value"):
            yield from values(f"{name}.forward", module, fwd, arg,
                              bad=tensor_bad(x)[:6] + (x.double(), torch.randn(2, 4, 6)))
        yield from values(f"{name}.forward", module, fwd, "mask",
                          bad=(torch.ones(4, 4, dtype=torch.long), torch.ones(4, 4), torch.ones(2, 4, dtype=torch.bool),
                               torch.ones(3, 4, 4, dtype=torch.bool), torch.zeros(4, 4).fill_diagonal_(INF), "causal"),
                          words=("mask",))
        yield from values(f"{name}.forward", module, fwd, "return_weights", bad=("yes", 1, None))
        yield from values(f"{name}.forward", module, fwd, "cache", bad=(3, "cache", [], mha_lib.LatentCache()),
                          words=("cache", "KVCache", "LatentCache"))
        yield Case(f"{name}.forward(cross-attention with a cache)",
                   partial(module, x, x[:, :2], x[:, :2], cache=mha_lib.KVCache()),
                   "bad", ("self-attention",))
        full = module(x, x, x, mask=mha_lib.causal_mask(4))
        additive = torch.zeros(4, 4).masked_fill(~mha_lib.causal_mask(4), -INF)  # 0 = may attend, -inf = blocked
        yield Case(f"{name}.forward(0/1 float mask with a KVCache)",
                   partial(module, x, x, x, mask=mha_lib.causal_mask(4).float(), cache=mha_lib.KVCache()), "bad", ("mask",))
        yield Case(f"{name}.forward(0/-inf float mask with a KVCache)",
                   partial(module, x, x, x, mask=additive, cache=mha_lib.KVCache()), "valid", ("mask",),
                   lambda r, full=full: same(r, full))

        def decode(module: torch.nn.Module = module) -> torch.Tensor:
            cache = mha_lib.KVCache()
            return torch.cat([module(x[:, i:i + 1], x[:, i:i + 1], x[:, i:i + 1], cache=cache) for i in range(4)], dim=1)

        yield Case(f"{name}.forward(token by token with a KVCache, slices)", decode, "valid", ("cache",),
                   lambda r, full=full: same(r, full))
        shared = mha_lib.KVCache()

        def two_layers(module: torch.nn.Module = module, shared: mha_lib.KVCache = shared, cls: type = cls) -> Any:
            other = cls(8, 2)
            module(x, x, x, cache=shared)
            return other(x, x, x, cache=shared)

        yield Case(f"{name}.forward(one KVCache for two layers)", two_layers, "bad", ("KVCache", "layer"))
        big = torch.randn(1, 3, 64) * 60  # Q Kᵀ past float16's 65504 before the 1/√d_k scale

        def half(cls: type = cls, big: torch.Tensor = big) -> tuple[torch.Tensor, torch.Tensor]:
            module = seeded(cls)(64, 1)
            return module.half()(big.half(), big.half(), big.half()).float(), module.float()(big, big, big)

        yield Case(f"{name}(float16 module, large inputs, against float32)", half, "valid", ("query",),
                   lambda r: bool(torch.isfinite(r[0]).all()) and bool(torch.allclose(r[0], r[1], atol=0.1, rtol=0.02)))
    yield from sizes("AttentionHead", mha_lib.AttentionHead, dict(d_model=8, d_k=4), ("d_model", "d_k"))
    yield from sizes("AttentionHead", mha_lib.AttentionHead, dict(d_model=8, d_k=4, d_v=4), ("d_v",), optional=True)
    yield from values("AttentionHead", mha_lib.AttentionHead, dict(d_model=8, d_k=4), "bias", bad=flag_bad())
    head = seeded(mha_lib.AttentionHead)(8, 4)
    for arg in ("query", "key", "value"):
        yield from values("AttentionHead.forward", head, dict(query=x, key=x, value=x), arg,
                          bad=tensor_bad(x)[:6] + (x.double(),))
    yield from values("AttentionHead.forward", head, dict(query=x, key=x, value=x), "mask",
                      bad=(torch.ones(4, 4, dtype=torch.long), torch.ones(4, 4), torch.ones(3, 4, dtype=torch.bool), "m"),
                      valid=(torch.ones(4, 4, dtype=torch.bool),), words=("mask",))
    yield from values("AttentionHead.forward", head, dict(query=x, key=x, value=x), "return_weights", bad=("yes", None))
    yield from sizes("EncoderLayer", mha_lib.EncoderLayer, dict(d_model=8, num_heads=2, d_ff=16),
                     ("d_model", "num_heads", "d_ff"))
    layer = seeded(mha_lib.EncoderLayer)(8, 2, 16)
    yield from values("EncoderLayer.forward", layer, dict(x=x), "x",
                      bad=tensor_bad(x)[:6] + (x.double(), torch.randn(2, 4, 6)))
    yield from values("EncoderLayer.forward", layer, dict(x=x), "mask",
                      bad=(torch.ones(4, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool), "m"), words=("mask",))
    yield from values("EncoderLayer.forward", layer, dict(x=x), "return_weights", bad=("yes", None))
    cache = mha_lib.KVCache()
    kv = torch.randn(1, 2, 3, 4)
    yield from values("KVCache.update", cache.update, dict(keys=kv, values=kv), "keys", bad=(None, kv.numpy(), kv[0]),
                      words=("keys",))
    yield from sizes("MultiHeadLatentAttention", mha_lib.MultiHeadLatentAttention,
                     dict(d_model=8, num_heads=2, d_latent=4),
                     ("d_model", "num_heads", "d_latent"))


def submodule_cases() -> Iterator[Case]:
    yield from values("sentiment.tokenize", sentiment.tokenize, dict(text="a good film"), "text", bad=(None, 3, ["a"]))
    yield from values("sentiment.Vocab", sentiment.Vocab, dict(words=["a", "b"]), "words", bad=(None, 3, "ab", [1, 2]))
    yield from sizes("sentiment.SentimentClassifier", sentiment.SentimentClassifier,
                     dict(vocab_size=10, d_model=8, num_heads=2, num_layers=1, d_ff=8, max_len=6),
                     ("vocab_size", "d_model", "num_heads", "num_layers", "d_ff", "max_len"))
    model = seeded(sentiment.SentimentClassifier)(10, d_model=8, num_heads=2, d_ff=8, max_len=6)
    tokens = torch.tensor([[2, 4, 5, 0], [2, 6, 0, 0]])
    yield from values("SentimentClassifier.forward", model, dict(tokens=tokens), "tokens",
                      bad=(None, tokens.float(), tokens[0], tokens + 20, tokens - 5, torch.ones(2, 9, dtype=torch.long),
                           tokens.numpy(), tokens.tolist()),
                      valid=(tokens.int(),))
    yield from values("SentimentClassifier.forward", model, dict(tokens=tokens), "mask",
                      bad=(torch.ones(4, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool), torch.ones(4, 4)),
                      valid=(torch.ones(4, 4, dtype=torch.bool),), words=("mask",))
    yield from values("SentimentClassifier.forward", model, dict(tokens=tokens), "return_weights", bad=("yes", None, 1))
    yield from sizes("sentiment.make_datasets", sentiment.make_datasets, dict(n_train=8, n_test=4, seed=0),
                     ("n_train", "n_test"), zero="either")
    mha = mha_lib.MultiHeadAttention(8, 2)
    yield from values("sentiment.silence_heads", lambda attention,
                      heads: sentiment.silence_heads(attention, heads).__enter__(),
                      dict(attention=mha, heads=[1]), "heads", bad=(1, "1", [2], [-1], [1.0], None))
    x = torch.randn(2, 4, 8)

    def silenced(attention: torch.nn.Module, heads: Any) -> torch.Tensor:
        with sentiment.silence_heads(attention, heads):
            return attention(x, x, x)

    fresh = mha_lib.MultiHeadAttention(8, 2)  # the calls above leave hooks on mha (entered, never left)
    yield from values("sentiment.silence_heads", silenced, dict(attention=fresh, heads=[1]), "heads",
                      bad=([torch.tensor(1.0)], [torch.tensor([1])], [torch.tensor(True)], [np.True_], [np.float64(1)]),
                      valid=([np.int64(1)], [torch.tensor(1)], [torch.tensor([0.2, 0.9]).argmax()], (1,)))
    yield from values("sentiment.silence_heads", lambda attention,
                      heads: sentiment.silence_heads(attention, heads).__enter__(),
                      dict(attention=mha, heads=[1]), "attention", bad=(None, torch.nn.Linear(8, 8), "mha"),
                      words=("multi-head", "module"))
    yield from sizes("induction.AttentionOnlyTransformer", induction.AttentionOnlyTransformer,
                     dict(vocab_size=16, d_model=8, num_heads=2, num_layers=1, max_len=8), ("vocab_size", "d_model",
                                                                                            "num_heads",
                                                                                           "num_layers", "max_len"))
    yield from values("induction.AttentionOnlyTransformer", induction.AttentionOnlyTransformer,
                      dict(vocab_size=16, d_model=8),
                      "positions", bad=("nope", None, 3))
    rs = partial(induction.repeated_segments, generator=None)
    yield from sizes("induction.repeated_segments", rs, dict(batch_size=2, seq_len=16, vocab_size=16, segment=(3, 5)),
                     ("batch_size", "seq_len", "vocab_size"))
    yield from values("induction.repeated_segments", rs, dict(batch_size=2, seq_len=16, vocab_size=16, segment=(3, 5)),
                      "segment", bad=((5, 3), (0, 2), "35", 3, (3, 20), (3.0, 5)), valid=((np.int64(3), 5), [3, 5]))
    w = torch.softmax(torch.randn(2, 2, 6, 6), dim=-1)
    for fn in (induction.previous_token_score, induction.self_score):
        yield from values(f"induction.{fn.__name__}", fn, dict(weights=w), "weights",
                          bad=(None, w.numpy(), w[0, 0], w.long()))
    yield from sizes("induction.uniform_previous_token_score", induction.uniform_previous_token_score, dict(seq_len=6),
                     ("seq_len",))
    yield from values("induction.phase_change_step", induction.phase_change_step,
                      dict(history={"loss": [3.0, 2.0, 1.0], "step": [0, 10, 20]}, threshold=1.5), "threshold",
                      bad=(NAN, "0.4", None), words=("threshold",))
    yield from values("bench.make_mask", mha_lib.bench.make_mask, dict(kind="causal", length=4, num_heads=2), "kind",
                      bad=("nope", None, 3), words=("kind", "mask"))
    yield from sizes("bench.make_mask", mha_lib.bench.make_mask, dict(kind="causal", length=4, num_heads=2),
                     ("length", "num_heads"))
    yield from values("bench.Step", mha_lib.bench.Step, dict(variant="efficient", mode="forward", length=4), "variant",
                      bad=("flash", None), words=("variant",))
    step = dict(variant="efficient", mode="forward", length=4, d_model=8, num_heads=2)
    yield from sizes("bench.Step", lambda **kw: repr(mha_lib.bench.Step(**kw)), step, ("length", "d_model", "num_heads"))
    yield from more_submodule_cases()
    for name in checks.__all__:
        check = getattr(checks, name)
        if name.startswith("check_"):
            for bad in (None, 3):
                yield Case(f"checks.{name}({bad!r})", partial(check, bad), "bad",
                           ("function", "class", "callable", "module"))


def more_submodule_cases() -> Iterator[Case]:
    train, test = sentiment.make_datasets(12, 6, seed=0)
    vocab = sentiment.Vocab.for_task()
    model = seeded(sentiment.SentimentClassifier)(len(vocab), d_model=8, num_heads=2, d_ff=8, max_len=16)
    sentences = [e.tokens for e in train[:3]]
    yield from values("sentiment.batch_examples", sentiment.batch_examples, dict(sentences=sentences, vocab=vocab),
                      "sentences",
                      bad=(None, "a good film", [3], [["a", 3]]), valid=(train[:3],), words=("sentences", "sentence"))
    yield from values("sentiment.batch_examples", sentiment.batch_examples, dict(sentences=sentences, vocab=vocab),
                      "vocab",
                      bad=(None, ["a"], {"a": 1}), words=("vocab", "Vocab"))
    yield from values("sentiment.batch_examples", sentiment.batch_examples,
                      dict(sentences=sentences, vocab=vocab, max_len=12),
                      "max_len", bad=("12", 1.5, -1, 0, True, 2), valid=(np.int64(12),), either=(None,))
    yield from values("sentiment.predict", sentiment.predict, dict(model=model, sentences=sentences, vocab=vocab),
                      "model",
                      bad=(None, "model", torch.nn.Linear(2, 2)), words=("model", "SentimentClassifier"))
    yield from values("sentiment.predict", sentiment.predict, dict(model=model, sentences=sentences, vocab=vocab),
                      "sentences",
                      bad=(None, "a good film", 3), either=([],), words=("sentences", "sentence"))
    yield from values("sentiment.evaluate", sentiment.evaluate, dict(model=model, examples=test, vocab=vocab), "examples",
                      bad=(None, "x", [1], sentences), either=([],), words=("examples", "Example"))
    yield from values("sentiment.four_groups", sentiment.four_groups, dict(examples=test), "examples",
                      bad=(None, "x", [1]), either=([],), words=("examples", "Example"))
    yield from values("sentiment.attention_shares", sentiment.attention_shares,
                      dict(model=model, examples=test, vocab=vocab), "layer", bad=(5, -1, "0", 1.5,
                                                                                   None), valid=(np.int64(0),))
    yield from values("sentiment.attention_shares", sentiment.attention_shares,
                      dict(model=model, examples=test, vocab=vocab), "query", bad=("nope", None, 3))
    def fit(**kwargs: Any) -> Any:
        tiny = seeded(sentiment.SentimentClassifier)(len(vocab), d_model=8, num_heads=2, d_ff=8, max_len=16)
        return sentiment.train_model(**{"model": tiny, "train": train, "vocab": vocab, **kwargs})

    yield from sizes("sentiment.train_model", fit, dict(epochs=1, batch_size=4), ("epochs", "batch_size"))
    yield from values("sentiment.train_model", fit, dict(epochs=1), "lr", bad=(0, -1.0, NAN, INF, "0.01", None, True))
    yield from values("sentiment.train_model", fit, dict(epochs=1), "train", bad=(None, "x", [], [1]),
                      words=("train", "examples", "Example"))
    net = seeded(induction.AttentionOnlyTransformer)(16, d_model=8, num_heads=2, num_layers=1, max_len=8)
    tokens = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(0))
    yield from values("AttentionOnlyTransformer.forward", net, dict(tokens=tokens), "tokens",
                      bad=(None, tokens.float(), tokens[0], tokens + 16, tokens - 16, torch.zeros(2, 9, dtype=torch.long),
                           tokens.numpy(), tokens.tolist()), valid=(tokens.int(),))
    yield from values("AttentionOnlyTransformer.forward", net, dict(tokens=tokens), "return_weights",
                      bad=("yes", None, 1))
    batch = induction.repeated_segments(2, seq_len=8, vocab_size=16, segment=(2, 3),
                                        generator=torch.Generator().manual_seed(0))
    _, weights = net(batch.tokens, return_weights=True)
    for fn in (induction.induction_score, induction.duplicate_token_score):
        yield from values(f"induction.{fn.__name__}", fn, dict(weights=weights[0], batch=batch), "weights",
                          bad=(None, weights[0][0], weights[0].long(), torch.rand(2, 2, 5, 5)), words=("weights",))
        yield from values(f"induction.{fn.__name__}", fn, dict(weights=weights[0], batch=batch), "batch",
                          bad=(None, batch.tokens, "b"), words=("batch", "RepeatBatch"))
    for fn in (induction.induction_queries, induction.uniform_induction_score):
        yield from values(f"induction.{fn.__name__}", fn, dict(batch=batch), "batch", bad=(None, batch.tokens, "b"),
                          words=("batch", "RepeatBatch"))
    logits = net(batch.tokens)
    yield from values("induction.losses", induction.losses, dict(logits=logits, batch=batch), "logits",
                      bad=(None, logits[0], logits[..., :5], logits.long(), logits.detach().numpy()), words=("logits",))
    yield from values("induction.check_task", induction.check_task, dict(seq_len=16, vocab_size=16, segment=(3, 5)),
                      "segment",
                      bad=((5, 3), (0, 2), "35", 3, (3, 20), (3.0, 5), None), valid=((np.int64(3), 5),))
    def learn(**kwargs: Any) -> Any:
        tiny = seeded(induction.AttentionOnlyTransformer)(16, d_model=8, num_heads=2, num_layers=1, max_len=8)
        history = induction.train_induction(tiny, **kwargs)
        return {k: v for k, v in history.items() if k != "seconds"}  # the time differs from run to run

    yield from sizes("induction.train_induction", learn,
                     dict(steps=1, batch_size=2, seq_len=8, segment=(2, 3), log_every=1),
                     ("steps", "batch_size", "log_every"))
    yield from values("induction.train_induction", learn, dict(steps=1, batch_size=2, seq_len=8, segment=(2, 3)), "lr",
                      bad=(0, -1.0, NAN, "0.01", None))
    yield from values("induction.train_induction", learn, dict(steps=1, batch_size=2, seq_len=8, segment=(2, 3)),
                      "seq_len",
                      bad=(9, 1, "8", 8.0))
    steps = {"a": lambda: None}
    timed = lambda **kw: {k: len(v) for k, v in mha_lib.bench.time_steps(**kw).items()}  # noqa: E731 - the count only
    yield from values("bench.time_steps", timed, dict(steps=steps, repeats=2, min_time=0.0), "steps",
                      bad=(None, [lambda: None], {"a": 3}, lambda: None), words=("steps",))
    yield from sizes("bench.time_steps", timed, dict(steps=steps, repeats=2, min_time=0.0), ("repeats",))
    yield from sizes("bench.time_steps", timed, dict(steps=steps, repeats=2, warmup=1, min_time=0.0), ("warmup",),
                     zero="either")
    yield from values("bench.time_steps", timed, dict(steps=steps, repeats=2, min_time=0.0), "min_time",
                      bad=(-1.0, NAN, "0.1", None), valid=(0,))
    yield from values("bench.format_table", mha_lib.bench.format_table, dict(results=[]), "stat", bad=("mean", None, 3),
                      words=("stat",))
    yield from sizes("bench.make_variants", lambda **kw: list(mha_lib.bench.make_variants(**kw)),
                     dict(d_model=8, num_heads=2),
                     ("d_model", "num_heads"))
    cache, kv = mha_lib.KVCache(), torch.randn(1, 2, 3, 4)
    yield from values("KVCache.extend", cache.extend, dict(keys=kv, values=kv), "keys", bad=(None, kv.numpy(), kv[0]),
                      words=("keys",))
    yield from values("KVCache.extend", lambda **kw: mha_lib.KVCache().extend(**kw), dict(keys=kv, values=kv), "mask",
                      bad=(torch.ones(3, 3, dtype=torch.long), "m", torch.ones(2, 2, dtype=torch.bool)), words=("mask",))
    latent = seeded(mha_lib.MultiHeadLatentAttention)(8, 2, 4)
    x = torch.randn(2, 4, 8)
    for arg in ("query", "key", "value"):
        yield from values("MultiHeadLatentAttention.forward", latent, dict(query=x, key=x, value=x), arg,
                          bad=tensor_bad(x)[:6] + (x.double(),))
    yield from values("MultiHeadLatentAttention.forward", latent, dict(query=x, key=x, value=x), "absorb",
                      bad=("yes", None))
    yield Case("MultiHeadLatentAttention.forward(0/1 float mask with a LatentCache)",
               partial(latent, x, x, x, mask=mha_lib.causal_mask(4).float(), cache=mha_lib.LatentCache()), "bad", ("mask",))
    full = latent(x, x, x, mask=mha_lib.causal_mask(4))
    additive = torch.zeros(4, 4).masked_fill(~mha_lib.causal_mask(4), -INF)
    yield Case("MultiHeadLatentAttention.forward(0/-inf float mask with a LatentCache)",
               partial(latent, x, x, x, mask=additive, cache=mha_lib.LatentCache()), "valid", ("mask",),
               lambda r: same(r, full))
    yield from values("LatentCache.update", lambda **kw: mha_lib.LatentCache().update(**kw),
                      dict(latent=torch.randn(1, 3, 4)),
                      "latent", bad=(None, torch.randn(3, 4), torch.randn(1, 3, 4).numpy()), words=("latent", "latents"))
    yield from environment_cases()


def environment_cases() -> Iterator[Case]:
    """``MHA_DEVICE`` picks the device of :func:`mha_lib.get_device`."""
    def with_env(value: str) -> Callable[[], Any]:
        def call() -> Any:
            old = os.environ.get("MHA_DEVICE")
            os.environ["MHA_DEVICE"] = value
            try:
                return mha_lib.get_device()
            finally:
                if old is None:
                    del os.environ["MHA_DEVICE"]
                else:
                    os.environ["MHA_DEVICE"] = old
        return call

    for bad in ("nope", "gpu0", "cuda:x"):
        yield Case(f"get_device(MHA_DEVICE={bad!r})", with_env(bad), "bad", ("MHA_DEVICE",))
    if not torch.cuda.is_available():
        yield Case("get_device(MHA_DEVICE='cuda', none here)", with_env("cuda"), "bad", ("MHA_DEVICE", "cuda"))
    yield Case("get_device(MHA_DEVICE='cpu')", with_env("cpu"), "valid", ("MHA_DEVICE",),
               lambda r: r == torch.device("cpu"))
    yield Case("get_device(MHA_DEVICE=' CPU ')", with_env(" CPU "), "either", ("MHA_DEVICE",))


def random_cases(seed: int = 0, n: int = 40) -> Iterator[Case]:
    """Random valid shapes and masks, against references: PyTorch's kernel (a row that sees no key gets
    zeros, mha_lib's convention), and the efficient module against the teaching one with the same weights."""
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)

    def reference(q, k, v, mask):  # noqa: ANN001, ANN202
        blocked = None
        if mask is not None and mask.dtype == torch.bool:
            blocked = ~mask.expand(*q.shape[:-1], k.size(-2)).any(-1, keepdim=True)
            mask = mask | blocked
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out if blocked is None else out.masked_fill(blocked, 0.0)

    for i in range(n):
        B, H, Lq, Lk, d_k = (int(rng.integers(1, m)) for m in (4, 4, 6, 6, 6))
        q, k, v = (torch.randn(B, H, L, d_k, generator=g, dtype=torch.float64) for L in (Lq, Lk, Lk))
        kind = ("none", "bool", "padding", "per-head", "bias")[i % 5]
        mask = {"none": None, "bool": torch.rand(Lq, Lk, generator=g) > 0.4,
                "padding": mha_lib.padding_mask(rng.integers(0, Lk + 1, B).tolist(), max_len=Lk),
                "per-head": torch.rand(H, Lq, Lk, generator=g) > 0.3,
                "bias": torch.randn(Lq, Lk, generator=g, dtype=torch.float64)}[kind]
        yield Case(f"scaled_dot_product_attention(random {B, H, Lq, Lk, d_k}, {kind} mask)",
                   partial(mha_lib.scaled_dot_product_attention, q, k, v, mask), "valid", ("query",),
                   lambda r, q=q, k=k, v=v, mask=mask: same(r[0], reference(q, k, v, mask)))
        D, kv_heads = H * 2 * int(rng.integers(1, 3)), H if i % 3 else 1
        teaching = seeded(mha_lib.MultiHeadAttention)(D, H, num_kv_heads=kv_heads, rotary=bool(i % 2)).double()
        fused = mha_lib.EfficientMultiHeadAttention.from_module(teaching)
        x, memory = torch.randn(B, Lq, D, generator=g, dtype=torch.float64), torch.randn(B, Lk, D, generator=g,
                                                                                         dtype=torch.float64)
        key = x if kind in ("none", "per-head") or Lq == Lk else memory
        mask = None if kind in ("per-head", "bias") and key is memory else mask
        if mask is not None and mask.size(-2) != Lq or key is x and mask is not None and mask.size(-1) != Lq:
            mask = None
        yield Case(f"EfficientMultiHeadAttention(random {B, Lq, Lk, D}, H={H}, H_kv={kv_heads}, {kind} mask)",
                   partial(fused, x, key, key, mask), "valid", ("query",),
                   lambda r, t=teaching, x=x, key=key, mask=mask: same(r, t(x, key, key, mask)))


def cases() -> list[Case]:
    torch.manual_seed(0)
    return [*functions(), *module_cases(), *submodule_cases(), *random_cases()]


def results() -> list[tuple[Case, str, str]]:
    """Every case with its outcome and what happened; PyTorch's threads and the random states of PyTorch,
    NumPy and Python are as found afterwards."""
    threads, numpy_state, python_state = torch.get_num_threads(), np.random.get_state(), random.getstate()
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest
    try:
        with warnings.catch_warnings(), torch.random.fork_rng(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")  # e.g. Matplotlib on an all-NaN picture: the outcome is what counts
            return [(case, *classify(case)) for case in cases()]
    finally:
        torch.set_num_threads(threads)
        np.random.set_state(numpy_state)
        random.setstate(python_state)


def run(verbose: bool = False) -> Counter:
    counts: Counter = Counter()
    for case, outcome, what in results():  # training prints its progress: results() keeps that quiet
        counts[outcome] += 1
        if verbose or outcome in ("unclear", "silently wrong", "valid refused"):
            print(f"{outcome:>15}  {case.target}  {what}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="print every case, not only the ones that are not fine")
    counts = run(parser.parse_args(argv).all)
    print(", ".join(f"{counts[o]} {o}" for o in OUTCOMES), f"({sum(counts.values())} calls)")
    ok = counts["silently wrong"] == 0 and counts["valid refused"] == 0 and counts["unclear"] <= 3
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
