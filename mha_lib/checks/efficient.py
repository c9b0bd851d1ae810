"""Checks for chapter 10: the fused ``W_qkv`` projection, and attention computed block by block
with an online softmax (the idea behind flash attention).

The blockwise check also watches the shapes the learner's code computes (``_ShapeRecorder``):
the ``(Lq, Lk)`` scores must never be held at once, and each block must be read once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ..multi_head import MultiHeadAttention
from ._circuits import call_leaving_model_alone
from ._core import (
    ERROR,
    CheckResult,
    Verdict,
    describe_error,
    call,
    check_device_care,
    check_unchanged,
    cloned,
    close,
    diagnose,
    expect_tensor,
    fail,
    gen,
    on_meta,
    randn,
    run_check,
    sqrt,
)
from .reference import attend, linear, projections
from .attention import SCALE_HINT


FUSED_DEVICE_HINT = ("Create the layer on the module's device and in its dtype: weight = mha.W_q.weight; "
                     "nn.Linear(mha.d_model, 3 * mha.d_model, device=weight.device, dtype=weight.dtype). "
                     "nn.Linear(D, 3 * D) alone is float32 on the CPU: a float64 module's inputs then meet float32 "
                     "weights, and a module on the GPU meets a layer on the CPU, and both raise.")


def _fused_verdict(fused: Any, D: int) -> nn.Linear:
    if isinstance(fused, Tensor):
        raise fail("your function returned a tensor; expected an nn.Linear(d_model, 3 * d_model)",
                   "Create the layer, then copy the stacked weights and biases into it.")
    if not isinstance(fused, nn.Linear):
        raise fail(f"your function returned a {type(fused).__name__}; expected an nn.Linear")
    if (fused.in_features, fused.out_features) != (D, 3 * D):
        raise fail(f"the layer is nn.Linear({fused.in_features}, {fused.out_features}), "
                   f"expected nn.Linear({D}, {3 * D})")
    return fused


def check_fused_projection(fn: Callable[[MultiHeadAttention], Any]) -> CheckResult:
    """Check ``fn(mha) -> nn.Linear(d_model, 3 * d_model)`` whose output, cut into three
    along the last axis, is ``(W_q(x), W_k(x), W_v(x))``; the layer is made on the module's device and
    in its dtype; the module is handed over in training mode with gradients on and must come back as it was,
    and the function is called again after the module's weights change."""

    def body() -> str:
        ran = 0
        configs = [(8, 2, 51, torch.float64, True), (12, 3, 52, torch.float32, False), (8, 2, 53, torch.float64, True)]
        shared: MultiHeadAttention | None = None
        for D, H, seed, dtype, training in configs:
            if shared is not None and D == shared.d_model:  # the same module again, its weights changed
                mha = shared
                label = f"d_model={D}, {H} heads, the first module again after its weights changed"
            else:
                torch.manual_seed(seed)
                mha = MultiHeadAttention(D, H).to(dtype).train(training)
                if shared is None:
                    shared = mha
                    witness = mha.register_forward_pre_hook(lambda module, args: None)  # a hook of its own
                label = f"d_model={D}, {H} heads, {str(dtype).replace('torch.', '')}, " + (
                    "training mode" if training else "evaluation mode")
            projections(mha, gen(seed))  # new weights, written into mha; the reference reads them back
            w = {n: (getattr(mha, n).weight.detach().double(), getattr(mha, n).bias.detach().double())
                 for n in ("W_q", "W_k", "W_v")}
            fused = _fused_verdict(call_leaving_model_alone(fn, mha, what=f"your function ({label})"), D)
            ran += 1
            if fused.weight.dtype != dtype or (fused.bias is not None and fused.bias.dtype != dtype):
                raise fail(f"the layer is {fused.weight.dtype}, the module {dtype} ({label}): it was not made in "
                           "the module's dtype", FUSED_DEVICE_HINT)
            x = randn(gen(seed + 1), 2, 4, D, dtype=dtype)
            with torch.no_grad():
                y = fused(x)  # (B, L, 3D), compared at the module's precision
            x = x.double()
            q, k, v = (linear(w[n], x) for n in ("W_q", "W_k", "W_v"))
            if not close(y, torch.cat([q, k, v], dim=-1)):
                chunks = y.split(D, dim=-1)
                wb = fused.bias is None or not close(fused.bias.double(), torch.cat([w[n][1] for n in ("W_q", "W_k", "W_v")]))
                if {i for i, c in enumerate(chunks) for t in (q, k, v) if close(c, t)} == {0, 1, 2}:
                    raise fail(f"the three projections are in the wrong order ({label})",
                               "Stack them as queries, keys, values: torch.cat([W_q.weight, W_k.weight, W_v.weight]).")
                nobias = [x @ w[n][0].T for n in ("W_q", "W_k", "W_v")]
                if wb and close(y, torch.cat(nobias, dim=-1) + (0 if fused.bias is None else fused.bias.detach().double())):
                    raise fail(f"the weights are right but the biases are not ({label})",
                               "Stack the biases too: torch.cat([W_q.bias, W_k.bias, W_v.bias]).")
                if shared is mha and ran > 1:
                    raise fail(f"the fused output is that of the module's old weights ({label}): your function "
                               "returned a layer made on an earlier call",
                               "Build a new layer from the module's current weights on every call: cache nothing.")
                raise fail(f"the fused output doesn't equal (W_q(x), W_k(x), W_v(x)) ({label})",
                           "nn.Linear.weight is (out_features, in_features): stack the three weights along dim 0.")
        witness.remove()
        torch.manual_seed(54)
        there = on_meta(MultiHeadAttention(8, 2).train())
        try:
            fused = fn(there)
        except Exception as error:  # noqa: BLE001 - right on the CPU, so it is the device that fails
            what = "your function (a module on device 'meta', which holds shapes but no numbers, in place of a GPU)"
            line = (f"{what} raised {type(error).__name__}: {str(error).strip()}: it copies the module's weights into "
                    "a layer made on the CPU" if "meta" in str(error) else describe_error(error, what).message)
            raise Verdict(ERROR, f"{line} (right on the CPU: it is the device that fails)", FUSED_DEVICE_HINT) from None
        fused = _fused_verdict(fused, 8)
        if fused.weight.device != there.W_q.weight.device:
            raise fail(f"for a module on another device (meta, in place of a GPU) the layer is on {fused.weight.device}",
                       FUSED_DEVICE_HINT)
        return (f"its output is (W_q(x), W_k(x), W_v(x)) on {ran} calls (float64 and float32, one module again after "
                "its weights changed), on another device, and the modules are left as they were")

    return run_check("fused projection", body)


class _ShapeRecorder(TorchFunctionMode):
    """Record the shape of every tensor that PyTorch functions and tensor methods return, and
    which of them were matrix products, while the learner's blockwise attention runs."""

    _PRODUCTS = {"matmul", "__matmul__", "__rmatmul__", "bmm", "einsum", "mm", "baddbmm", "tensordot", "inner"}

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []
        self.products: list[tuple[int, ...]] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        outputs = result if isinstance(result, (tuple, list)) else (result,)
        name = getattr(func, "__name__", "")
        for out in outputs:
            if isinstance(out, Tensor):
                self.shapes.append(tuple(out.shape))
                if name in self._PRODUCTS:
                    self.products.append(tuple(out.shape))
        return result


BLOCKWISE_HINT = ("Keep, per query, a running maximum m, a running sum l of exp(score - m) and a running output; "
                  "rescale both by exp(m_old - m_new) when m grows; divide by l at the end.")


def _blockwise_reads(fn: Callable[..., Any]) -> None:
    """Run ``fn`` on sizes that tell the shapes apart (Lq=5, Lk=11, d_k=6, d_v=7, blocks of 3) and
    watch the shapes it computes: never the (Lq, Lk) scores, each block's scores once."""
    g = gen(62)
    Lq, Lk, d_k, d_v, block = 5, 11, 6, 7, 3
    q, k, v = randn(g, 2, Lq, d_k), randn(g, 2, Lk, d_k), randn(g, 2, Lk, d_v)
    recorder = _ShapeRecorder()
    with recorder:
        out = call(fn, q.clone(), k.clone(), v.clone(), block, what=f"your function (block_size={block})")
    if isinstance(out, (tuple, list)) and len(out) == 2:
        out = out[0]
    if any(shape[-2:] in ((Lq, Lk), (Lk, Lq)) for shape in recorder.shapes if len(shape) >= 2):
        raise fail(f"it is not blockwise: with Lq={Lq} queries and Lk={Lk} keys in blocks of {block}, your function "
                   f"computed a tensor of shape (..., {Lq}, {Lk}), all the scores (or weights) at once",
                   "The point of the exercise is never to hold the (Lq, Lk) scores: take the keys and values one "
                   "block at a time (key[..., start:start + block_size, :]) and keep a running maximum, sum and "
                   "output per query. A maximum over the whole score matrix, taken first, needs all of it too.")
    sizes = [min(block, Lk - start) for start in range(0, Lk, block)]  # 3, 3, 3, 2
    blocks, whole = len(sizes), Lk // block * block  # 4 blocks; 9 keys in full blocks
    for shape in recorder.shapes:  # the batch axis (2) first; none of the right answer's shapes holds 4, 9 or 12
        dims = shape[1:]
        if Lq in dims and ((blocks in dims and any(s in dims for s in sizes))
                           or any(n in dims for n in (blocks * block, whole))):
            raise fail(f"it is not blockwise: with Lq={Lq} queries and Lk={Lk} keys in {blocks} blocks of {block}, "
                       f"your function computed a tensor of shape {shape}, the scores of several blocks (or of all "
                       "the keys, padded or cut to whole blocks) at once: it looks like the keys were reshaped into "
                       "blocks and every block's scores computed in one product",
                       "Reshaping the keys to (..., n_blocks, block_size, d_k) and multiplying once still holds all "
                       "the (Lq, Lk) scores. Loop over the blocks, for start in range(0, Lk, block_size), and compute "
                       "only that block's scores, query @ key[..., start:start + block_size, :].transpose(-2, -1), "
                       "updating the running maximum, sum and output after each.")
    scores = [shape for shape in recorder.products if len(shape) >= 2 and shape[-2] == Lq and shape[-1] in sizes]
    if len(scores) >= 2 * len(sizes):
        times = {2: "twice", 3: "three times"}.get(len(scores) // len(sizes), f"{len(scores) // len(sizes)} times")
        raise fail(f"each block's scores were computed {times} (Lk={Lk} keys in "
                   f"{len(sizes)} blocks of {block}, {len(scores)} products of a query with a block of keys): it "
                   "looks like a first pass over the blocks finds the maximum and a second one sums",
                   "The online softmax reads each block once: when a block raises the running maximum from m to "
                   "m_new, rescale what was accumulated by exp(m - m_new) instead of starting over.")


_LARGE = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64) * 14.0  # two such vectors score 14² / √4 ≈ 100


def _large_scores_output(fn: Callable[..., Any], q: Tensor, k: Tensor, v: Tensor, block: int, label: str,
                         where: str) -> Tensor:
    """The learner's output for float32 inputs with large scores, ``(2, Lq, d_v)``."""
    out = call(fn, q.clone(), k.clone(), v.clone(), block, what=f"your function (block_size={block}, {label})")
    if isinstance(out, (tuple, list)) and len(out) == 2:
        out = out[0]
    return expect_tensor(out, f"the output {where}", (2, q.size(-2), v.size(-1)), dtype=torch.float32,
                         explain=" (..., Lq, d_v)")


def _blockwise_stress(fn: Callable[..., Any]) -> None:
    """Float32 scores near +100 for the first queries and near -100 for the others: exp(score)
    overflows without a maximum, and exp(score - m) underflows when m is not each query's own."""
    g = gen(63)
    Lq, Lk, d_k, d_v, block, u = 4, 9, 4, 3, 4, _LARGE
    k = (u + randn(g, 2, Lk, d_k, scale=0.6)).float()
    q = (torch.stack([u, u, -u, -u]) + randn(g, 2, Lq, d_k, scale=0.3)).float()  # queries 0, 1 high; 2, 3 low
    v = randn(g, 2, Lk, d_v, dtype=torch.float32)
    where = "with float32 scores near +100 (queries 0, 1) and near -100 (queries 2, 3)"
    out = _large_scores_output(fn, q, k, v, block, "large scores", where)
    expected = attend(q.double(), k.double(), v.double())[0]
    if close(out, expected):
        return
    bad = sorted({int(i) for i in (~torch.isfinite(out)).any(-1).nonzero()[:, -1].tolist()})
    if bad and set(bad) <= {0, 1}:
        raise fail(f"the output is inf or NaN for queries {bad} {where}: it looks like exp(score) was taken "
                   "without subtracting a running maximum, and overflowed", "exp(100) is inf in float32 (and inf / inf is NaN): "
                   "subtract the running maximum m from the scores before exp, p = exp(scores - m_new).")
    if bad and set(bad) <= {2, 3}:
        raise fail(f"the output is NaN for queries {bad} {where}: it looks like one maximum was shared by all "
                   "queries (a scalar), so exp(score - m) underflows to 0 for the queries with small scores",
                   "Keep a maximum per query: scores.amax(dim=-1, keepdim=True), shape (..., Lq, 1).")
    raise diagnose(out, [], f"wrong output {where}, although the cases with small scores were right",
                   BLOCKWISE_HINT, expected=expected, axis="query")


def _blockwise_rising(fn: Callable[..., Any]) -> None:
    """Scores near -100 in the first block and near +100 after it: a maximum that is taken from the
    first block and never raised lets exp(score - m) overflow."""
    g = gen(64)
    Lq, Lk, d_k, d_v, block, u = 2, 9, 4, 3, 4, _LARGE
    k = (u + randn(g, 2, Lk, d_k, scale=0.6)).float()
    k[..., :block, :] = (-u + randn(g, 2, block, d_k, scale=0.6)).float()  # the first block scores low
    q = (u + randn(g, 2, Lq, d_k, scale=0.3)).float()
    v = randn(g, 2, Lk, d_v, dtype=torch.float32)
    where = "with float32 scores near -100 in the first block of keys and near +100 after it"
    out = _large_scores_output(fn, q, k, v, block, "rising scores", where)
    if close(out, attend(q.double(), k.double(), v.double())[0]):
        return
    if not bool(torch.isfinite(out).all()):
        raise fail(f"the output is inf or NaN {where}: it looks like the maximum was taken from the first block and "
                   "never raised", "Keep a running maximum: m_new = max(m, block scores' max), and rescale what was "
                   "accumulated by exp(m - m_new) whenever it rises.")
    raise fail(f"wrong output {where}, although the cases with large scores in the first block were right",
               BLOCKWISE_HINT)


def check_blockwise_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(query, key, value, block_size) -> output``: attention computed one block
    of ``block_size`` keys at a time with a running maximum and sum (online softmax), equal
    to ``softmax(QKᵀ/√d_k) V``; query ``(..., Lq, d_k)``, key ``(..., Lk, d_k)``,
    value ``(..., Lk, d_v)``, output ``(..., Lq, d_v)``. The (Lq, Lk) scores are never held
    at once, each block is read once, and float32 scores near ±100 stay finite."""

    def body() -> str:
        g = gen(61)
        cases = [((2, 3), 5, 8, 4, 3, 4), ((1,), 4, 10, 8, 5, 3), ((), 3, 7, 4, 4, 7), ((2,), 2, 6, 4, 2, 1)]
        for batch, Lq, Lk, d_k, d_v, block in cases:
            q, k, v = randn(g, *batch, Lq, d_k, scale=2.0), randn(g, *batch, Lk, d_k, scale=2.0), randn(g, *batch, Lk, d_v)
            args = cloned(q, k, v)
            out = call(fn, *args, block, what=f"your function (block_size={block})")
            check_unchanged(["query", "key", "value"], [q, k, v], args, "your function")
            if isinstance(out, (tuple, list)) and len(out) == 2:
                out = out[0]
            where = f"for Lk={Lk} keys in blocks of {block}"
            out = expect_tensor(out, f"the output {where}", (*batch, Lq, d_v), dtype=q.dtype,
                                explain=" (..., Lq, d_v)")
            expected = attend(q, k, v)[0]
            if close(out, expected):
                continue

            def online(rescale: bool = True, normalize: bool = True, scale: float | None = None) -> Tensor:
                s = sqrt(d_k) if scale is None else scale
                m = torch.full((*batch, Lq, 1), float("-inf"), dtype=torch.float64)
                total = torch.zeros(*batch, Lq, 1, dtype=torch.float64)
                acc = torch.zeros(*batch, Lq, d_v, dtype=torch.float64)
                for start in range(0, Lk, block):
                    scores = q @ k[..., start:start + block, :].transpose(-2, -1) / s
                    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
                    p = torch.exp(scores - m_new)
                    factor = torch.exp(m - m_new) if rescale else torch.ones_like(m)
                    total = total * factor + p.sum(-1, keepdim=True)
                    acc = acc * factor + p @ v[..., start:start + block, :]
                    m = m_new
                return acc / total if normalize else acc

            last = (Lk - 1) // block * block
            whole = Lk // block * block
            skipped = f"key {whole}" if whole == Lk - 1 else f"keys {whole} .. {Lk - 1}"
            raise diagnose(out, [
                ("the running sum and output were not rescaled when the maximum grew", lambda: online(rescale=False),
                 "When a block raises the running maximum from m to m_new, multiply the running sum and the "
                 "running output by exp(m - m_new) before adding the new block."),
                ("the output was never divided by the running sum", lambda: online(normalize=False),
                 "At the end, divide the accumulated output by the accumulated sum of exponentials."),
                ("the scores were not scaled", lambda: online(scale=1.0), SCALE_HINT),
                ("only the last block counts: the running maximum is never updated (m = m_new is missing, so "
                 "exp(m - m_new) = 0 wipes what was accumulated at every block), or the running sums are "
                 "overwritten instead of added to",
                 lambda: attend(q, k[..., last:, :], v[..., last:, :])[0],
                 "End each block with m = m_new, and accumulate: l = l * exp(m - m_new) + p.sum(-1, keepdim=True), "
                 "o = o * exp(m - m_new) + p @ value_block."),
                (f"the last, shorter block ({skipped}) was skipped",
                 lambda: attend(q, k[..., :whole, :], v[..., :whole, :])[0],
                 "Loop with range(0, Lk, block_size): slicing key[..., start:start + block_size, :] gives the last, "
                 "shorter block by itself."),
            ], f"wrong output {where}", BLOCKWISE_HINT, expected=expected, axis="query")
        _blockwise_reads(fn)
        _blockwise_stress(fn)
        _blockwise_rising(fn)
        g = gen(62)
        check_device_care(fn, *(on_meta(randn(g, 2, n, 4)) for n in (3, 7, 7)), 3, what="your function",
                          hint="Make the running maximum, sum and output on the query's device: "
                               "torch.full(..., float('-inf'), device=query.device), torch.zeros(..., device=query.device).")
        return (f"equals softmax attention on {len(cases) + 3} cases (blocks that don't divide Lk included, "
                "float32 scores near ±100), one block at a time, and on another device")

    return run_check("blockwise attention", body)
