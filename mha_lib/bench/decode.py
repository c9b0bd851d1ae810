"""Decoding with a KV cache against recomputing the prefix, and the cache's memory with GQA.

    python -m mha_lib.bench decode                  # 256 tokens, d_model 512, 8 heads, batch 1, CPU
    python -m mha_lib.bench decode --tokens 64 --repeats 1   # a quick run
    python -m mha_lib.bench decode --threads 1      # steadier on a shared machine

One self-attention layer (:class:`~mha_lib.EfficientMultiHeadAttention`, eval mode, no
gradients) produces the outputs of ``tokens`` positions one at a time, two ways:

- **recompute**: at step ``t`` run the whole prefix ``x[:, :t]`` with ``causal_mask(t)`` and keep
  the last output, as a decoder without a cache must: every key and value again, every step;
- **cache**: at step ``t`` run only token ``t`` with a :class:`~mha_lib.KVCache`, which appends
  its key and value and attends to all cached ones.

The inputs are a fixed random sequence (the attention layer's work does not depend on where the
tokens come from). Each way is timed ``repeats`` times; the fastest run counts, since other
programs on a busy machine can only slow a run down. Both ways' outputs are compared, so the
benchmark proves that they agree. The cache's bytes are measured (``KVCache.nbytes``) for all
heads and for ``kv_heads`` key/value heads (GQA), and checked against :func:`~mha_lib.kv_cache_bytes`.

A cached step is a dozen small operations on one token, so its time is mostly per-operation
overhead. On a busy machine ``--threads 1`` measures it more steadily: two threads that wait for
each other on cores other programs hold slow small operations down more than they speed them up
(measured on 2 shared cores: 12.5x to 26x with one thread, 4.5x to 17x with two, depending on the load).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from ..efficient import EfficientMultiHeadAttention
from ..inference import KVCache, kv_cache_bytes
from ..masks import causal_mask
from .cli import positive_int
from .timing import synchronize

__all__ = ["DecodeResult", "decode_benchmark", "format_result", "main"]


@dataclass(frozen=True)
class DecodeResult:
    """What :func:`decode_benchmark` measured: seconds for all tokens, bytes after the last one."""

    tokens: int
    d_model: int
    num_heads: int
    kv_heads: int
    batch: int
    device: str
    threads: int
    recompute_s: float
    cache_s: float
    speedup: float  # recompute_s / cache_s
    max_abs_diff: float  # between the two ways' outputs
    cache_bytes: int  # all num_heads key/value heads
    gqa_cache_bytes: int  # kv_heads key/value heads
    bytes_ratio: float  # gqa_cache_bytes / cache_bytes, kv_heads / num_heads

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def decode_recompute(module: EfficientMultiHeadAttention, x: Tensor) -> Tensor:
    """Step ``t`` attends over the whole prefix ``x[:, :t + 1]`` again; ``(B, L, D) -> (B, L, D)``."""
    outputs = []
    for t in range(1, x.size(1) + 1):
        prefix = x[:, :t]  # (B, t, D)
        outputs.append(module(prefix, prefix, prefix, causal_mask(t, device=x.device))[:, -1:])  # (B, 1, D)
    return torch.cat(outputs, dim=1)


def decode_cached(module: EfficientMultiHeadAttention, x: Tensor, cache: KVCache) -> Tensor:
    """Step ``t`` runs token ``t`` only, against the cache; ``(B, L, D) -> (B, L, D)``."""
    outputs = []
    for t in range(x.size(1)):
        token = x[:, t : t + 1]  # (B, 1, D)
        outputs.append(module(token, token, token, cache=cache))  # (B, 1, D)
    return torch.cat(outputs, dim=1)


def _fastest(runs: Sequence[Any], repeats: int, device: torch.device) -> list[tuple[float, Tensor]]:
    """The fastest of ``repeats`` timings of each of ``runs``, taken in turns (round robin).

    Taking the ways in turns spreads a stretch of load from other programs over all of them,
    so it cannot make one way look slower than the other; load only adds time, so the
    fastest repetition is the one closest to the way's own cost.
    """
    best, outs = [float("inf")] * len(runs), [None] * len(runs)
    for _ in range(repeats):
        for i, run in enumerate(runs):
            synchronize(device)
            start = time.perf_counter()
            outs[i] = run()
            synchronize(device)
            best[i] = min(best[i], time.perf_counter() - start)
    return list(zip(best, outs))


def decode_benchmark(
    tokens: int = 256,
    d_model: int = 512,
    num_heads: int = 8,
    kv_heads: int = 2,
    batch: int = 1,
    repeats: int = 3,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> DecodeResult:
    """Time decoding ``tokens`` positions with and without a cache; measure the cache's bytes (float32)."""
    if repeats < 1 or tokens < 1:
        raise ValueError(f"tokens and repeats must be positive, got tokens={tokens}, repeats={repeats}")
    device = torch.device(device)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, tokens, d_model, generator=generator).to(device)  # (B, L, D)
    module = EfficientMultiHeadAttention(d_model, num_heads).to(device).eval()
    grouped = EfficientMultiHeadAttention(d_model, num_heads, num_kv_heads=kv_heads).to(device).eval()

    with torch.inference_mode():
        decode_cached(module, x[:, : min(tokens, 8)], KVCache())  # warm up both paths
        decode_recompute(module, x[:, : min(tokens, 8)])
        (recompute_s, recomputed), (cache_s, cached) = _fastest(
            [lambda: decode_recompute(module, x), lambda: decode_cached(module, x, KVCache())], repeats, device)
        full_cache, gqa_cache = KVCache(), KVCache()
        decode_cached(module, x, full_cache)
        decode_cached(grouped, x, gqa_cache)

    d_k = d_model // num_heads
    for cache, heads in ((full_cache, num_heads), (gqa_cache, kv_heads)):
        expected = kv_cache_bytes(1, heads, d_k, tokens, batch, bytes_per_element=4)
        assert cache.nbytes == expected, f"KVCache.nbytes = {cache.nbytes}, the arithmetic says {expected}"
    return DecodeResult(
        tokens=tokens, d_model=d_model, num_heads=num_heads, kv_heads=kv_heads, batch=batch,
        device=str(device), threads=torch.get_num_threads(),
        recompute_s=recompute_s, cache_s=cache_s, speedup=recompute_s / cache_s,
        max_abs_diff=float((recomputed - cached).abs().max()),
        cache_bytes=full_cache.nbytes, gqa_cache_bytes=gqa_cache.nbytes,
        bytes_ratio=gqa_cache.nbytes / full_cache.nbytes,
    )


def format_result(result: DecodeResult) -> str:
    """A short report of a :class:`DecodeResult`, as ``python -m mha_lib.bench decode`` prints it."""
    r = result
    return "\n".join([
        f"decoding {r.tokens} tokens one at a time: d_model {r.d_model}, {r.num_heads} heads, batch {r.batch}, "
        f"{r.device} ({r.threads} thread{'s' * (r.threads != 1)}), fastest of the runs",
        f"  recompute the prefix every step: {r.recompute_s * 1e3:9.1f} ms",
        f"  with a KV cache:                 {r.cache_s * 1e3:9.1f} ms   ({r.speedup:.1f}x faster)",
        f"  largest difference between the two outputs: {r.max_abs_diff:.1e}",
        f"KV cache after {r.tokens} tokens (float32, one layer):",
        f"  {r.num_heads} key/value heads: {r.cache_bytes:>10,} bytes",
        f"  {r.kv_heads} key/value heads: {r.gqa_cache_bytes:>10,} bytes   ({r.bytes_ratio:g} of it)",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mha_lib.bench decode``; returns the exit status (argument errors exit with status 2)."""
    parser = argparse.ArgumentParser(prog="python -m mha_lib.bench decode", description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=positive_int, default=256, help="positions to decode (default 256)")
    parser.add_argument("--d-model", type=positive_int, default=512, help="model width (default 512)")
    parser.add_argument("--heads", type=positive_int, default=8, help="query heads (default 8)")
    parser.add_argument("--kv-heads", type=positive_int, default=2, help="key/value heads for GQA (default 2)")
    parser.add_argument("--batch", type=positive_int, default=1, help="sequences decoded together (default 1)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="runs of each way; the fastest counts")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, ...")
    parser.add_argument("--threads", type=positive_int, help="CPU threads for this process (default: PyTorch's)")
    args = parser.parse_args(argv)
    if args.threads:  # this command's own process only; decode_benchmark itself sets nothing
        torch.set_num_threads(args.threads)
    try:
        result = decode_benchmark(args.tokens, args.d_model, args.heads, args.kv_heads, args.batch,
                                  args.repeats, args.device)
    except (ValueError, RuntimeError) as error:
        parser.error(str(error))
    print(format_result(result))
    return 0
