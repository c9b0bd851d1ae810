"""The cost of the library's checks and steps: EfficientMultiHeadAttention against the bare PyTorch calls.

    python tools/bench_overhead.py                 # all cases, all threads
    python tools/bench_overhead.py --threads 1     # torch.set_num_threads(1)
    taskset -c 0 python tools/bench_overhead.py --threads 1

"Bare" is the same work written as plain PyTorch with the module's own weights: one fused
``F.linear``, the split into heads (views: nanoGPT's ``split`` of q, k, v, then a ``view`` and a
``transpose`` of each; "bare, one cut" cuts all heads at once as the module does), ``torch.cat`` onto the cached keys and values when
decoding, ``F.scaled_dot_product_attention``, the heads put side by side and the output
``F.linear``. "Bare module" is the same code as an ``nn.Module`` that calls its two ``nn.Linear``
layers (nanoGPT's ``CausalSelfAttention``): it pays the three module calls that any module pays,
so the ratio to it is the cost of the checks and of the named steps alone. The cases:

- ``1 token``: B=1, L=1, d_model=512, 8 heads, float32, no grad (a decoding step without cache);
- ``1 token + cache``: the same with a KVCache holding 100 positions (reset to them before each call);
- ``fwd+bwd``: B=32, L=100, a training step, ``out.backward(g)``.

The variants run interleaved (the order rotating every repetition), and the minimum over the
repetitions is reported: the least disturbed by other programs on a shared machine. Even so, on a
busy machine two runs differ by a few percent; compare several.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from mha_lib import EfficientMultiHeadAttention, KVCache


def bare_attention(mha: EfficientMultiHeadAttention, x: torch.Tensor, past: tuple | None = None,
                   one_cut: bool = False) -> torch.Tensor:
    """``mha(x, x, x)`` (with ``past = (keys, values)`` cached) in plain PyTorch calls, unchecked.

    The heads are cut as nanoGPT cuts them (``q, k, v`` apart, then each into heads: 7 operations),
    or with ``one_cut`` as the module cuts them (all heads at once: 3 operations)."""
    B, L, D = x.shape
    H, H_kv, d_k = mha.num_heads, mha.num_kv_heads, mha.d_k
    qkv = F.linear(x, mha.W_qkv.weight, mha.W_qkv.bias)
    if one_cut:
        q, k, v = qkv.view(B, L, H + 2 * H_kv, d_k).transpose(1, 2).split_with_sizes([H, H_kv, H_kv], dim=1)
    else:
        q, k, v = qkv.split(mha.qkv_sizes, dim=-1)
        q = q.view(B, L, H, d_k).transpose(1, 2)
        k = k.view(B, L, H_kv, d_k).transpose(1, 2)
        v = v.view(B, L, H_kv, d_k).transpose(1, 2)
    if past is not None:
        k, v = torch.cat([past[0], k], dim=-2), torch.cat([past[1], v], dim=-2)
    heads = F.scaled_dot_product_attention(q, k, v, enable_gqa=H_kv != H)
    return F.linear(heads.transpose(1, 2).reshape(B, L, D), mha.W_o.weight, mha.W_o.bias)


class BareAttention(torch.nn.Module):
    """The same work as a plain module, nanoGPT's ``CausalSelfAttention`` style: no checks, no steps."""

    def __init__(self, mha: EfficientMultiHeadAttention) -> None:
        super().__init__()
        self.c_attn, self.c_proj, self.mha = mha.W_qkv, mha.W_o, (mha,)

    def forward(self, x: torch.Tensor, past: tuple | None = None) -> torch.Tensor:
        mha = self.mha[0]
        B, L, D = x.shape
        q, k, v = self.c_attn(x).split(mha.qkv_sizes, dim=-1)
        q = q.view(B, L, mha.num_heads, mha.d_k).transpose(1, 2)
        k = k.view(B, L, mha.num_kv_heads, mha.d_k).transpose(1, 2)
        v = v.view(B, L, mha.num_kv_heads, mha.d_k).transpose(1, 2)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=-2), torch.cat([past[1], v], dim=-2)
        heads = F.scaled_dot_product_attention(q, k, v, enable_gqa=mha.num_kv_heads != mha.num_heads)
        return self.c_proj(heads.transpose(1, 2).reshape(B, L, D))


def make_cases(d_model: int = 512, heads: int = 8, cached: int = 100, batch: int = 32, length: int = 100) -> dict:
    """``{case: {"module": step, "bare": step, "bare module": step}}``, each step a function of no arguments."""
    torch.manual_seed(0)
    mha = EfficientMultiHeadAttention(d_model, heads).eval()
    x1 = torch.randn(1, 1, d_model)
    keys, values = torch.randn(2, 1, heads, cached, d_model // heads).unbind(0)
    cache = KVCache()

    def module_cached() -> None:
        cache.keys, cache.values = keys, values  # 100 positions, every call
        mha(x1, x1, x1, cache=cache)

    train = EfficientMultiHeadAttention(d_model, heads).train()
    xb = torch.randn(batch, length, d_model, requires_grad=True)
    g = torch.randn(batch, length, d_model)

    def no_grad(step):
        def run() -> None:
            with torch.no_grad():
                step()
        return run

    bare, bare_train = BareAttention(mha), BareAttention(train)
    past = (keys, values)
    return {
        "1 token": {"module": no_grad(lambda: mha(x1, x1, x1)),
                    "bare": no_grad(lambda: bare_attention(mha, x1)),
                    "bare module": no_grad(lambda: bare(x1)),
                    "bare, one cut": no_grad(lambda: bare_attention(mha, x1, one_cut=True))},
        "1 token + cache": {"module": no_grad(module_cached),
                            "bare": no_grad(lambda: bare_attention(mha, x1, past)),
                            "bare module": no_grad(lambda: bare(x1, past)),
                            "bare, one cut": no_grad(lambda: bare_attention(mha, x1, past, one_cut=True))},
        "fwd+bwd": {"module": lambda: train(xb, xb, xb).backward(g),
                    "bare": lambda: bare_attention(train, xb).backward(g),
                    "bare module": lambda: bare_train(xb).backward(g),
                    "bare, one cut": lambda: bare_attention(train, xb, one_cut=True).backward(g)},
    }


def measure(steps: dict, repeats: int, calls: int) -> dict[str, float]:
    """Seconds per call of each step: the minimum over ``repeats`` interleaved measurements of ``calls`` calls."""
    names = list(steps)
    best = {name: float("inf") for name in names}
    for name in names:  # warm-up
        for _ in range(3):
            steps[name]()
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            step = steps[name]
            start = time.perf_counter()
            for _ in range(calls):
                step()
            best[name] = min(best[name], (time.perf_counter() - start) / calls)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: PyTorch's)")
    parser.add_argument("--repeats", type=int, default=200, help="interleaved repetitions (1-token cases)")
    parser.add_argument("--calls", type=int, default=20, help="calls per measurement (1-token cases)")
    parser.add_argument("--train-repeats", type=int, default=15, help="repetitions of fwd+bwd (1 call each)")
    parser.add_argument("--cases", nargs="+", help="only these cases")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; minimum over repetitions")
    for case, steps in make_cases().items():
        if args.cases and case not in args.cases:
            continue
        train = case == "fwd+bwd"
        best = measure(steps, args.train_repeats if train else args.repeats, 1 if train else args.calls)
        print(f"{case:>16}: module {best['module'] * 1e6:9.1f} µs; "
              + "; ".join(f"{name} {best[name] * 1e6:9.1f} µs (ratio {best['module'] / best[name]:.3f})"
                          for name in ("bare", "bare module", "bare, one cut")), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
