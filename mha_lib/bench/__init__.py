"""Time and memory of four multi-head attention implementations against sequence length.

    python -m mha_lib.bench                       # 128 … 4096 on mha_lib.get_device()
    python -m mha_lib.bench --quick               # a small run, under a minute on a CPU
    python -m mha_lib.bench --batch 32 --lengths 100 --repeats 15   # the book's configuration
    python -m mha_lib.bench --mask halves         # with a per-head (H, L, L) mask (also per-head, alibi)
    python -m mha_lib.bench --plot bench.png      # also draw time and memory against length
    python -m mha_lib.bench decode                # chapter 11: decoding with a KV cache (decode --help)

The variants, all self-attention with the same weights (:mod:`mha_lib.bench.steps`):

- ``teaching``: :class:`mha_lib.MultiHeadAttention`, which stores every ``(B, H, L, L)`` weight;
- ``efficient``: :class:`mha_lib.EfficientMultiHeadAttention` (fused projection, fused kernel);
- ``nn.MHA(weights)``: ``torch.nn.MultiheadAttention`` with ``need_weights=True`` (its default);
- ``nn.MHA``: the same with ``need_weights=False``, the baseline of every ratio.

**Time** (:mod:`mha_lib.bench.timing`). "forward" runs under ``torch.no_grad()`` in eval mode
(inference; there ``nn.MultiheadAttention`` takes its own fused "fast path"); "fwd+bwd" is a
training step: forward, then ``out.backward(g)`` with a fixed random ``g`` (a dense upstream
gradient, as a loss would send). Every variant is warmed up first; then each repetition times
every variant once, in a rotating order (round robin), so that a slow spell of a shared
machine hits all of them alike. The table shows the median over repetitions (``--stat min``:
the fastest one, which other programs on a busy machine disturb less). Short steps are
repeated inside one measurement, so that each lasts at least ``--min-time`` seconds.

**Peak memory** (:mod:`mha_lib.bench.memory`) is the rise during one step, after a warm-up
step, above the memory in use before it: on CUDA the caching allocator's count of tensor
bytes, on the CPU the peak resident set size of a separate process that runs the steps (Linux
only; see that module for its limits). Measured in a separate pass, not while timing.

**Which kernel stores the weights.** On the CPU, ``F.scaled_dot_product_attention`` runs a
flash-attention-style kernel that never stores the ``(B, H, L, L)`` weights, but falls back
to its explicit "math" kernel, which does, for a mask of 3 dimensions, for dropout in a
training step (``--dropout 0.1``) and for a float mask that requires grad (``--mask
float-grad``). There the efficient module's memory grows like ``L²`` as well
(tests/test_bench.py measures it). The module passes per-head ``(H, L, L)`` masks and biases
(``--mask per-head``, ``halves``, ``alibi``) as ``(1, H, L, L)``, which the fused kernel takes;
they cost the mask's own ``H · L²`` numbers. ``Step(..., kernel="math")`` forces the math kernel
(``torch.nn.attention.sdpa_kernel``), to measure what the fused one saves.

Variants whose ``(B, H, L, L)`` weights would not fit in the free memory (estimated) are
skipped at that length and marked "skip". The command line is :mod:`mha_lib.bench.cli`, the
table :mod:`mha_lib.bench.run`, the plot :mod:`mha_lib.bench.plots`.

**Decoding** (:mod:`mha_lib.bench.decode`, chapter 11; ``python -m mha_lib.bench decode``): one
layer decodes token by token with a :class:`~mha_lib.KVCache` against recomputing the prefix at
every step, and the cache's bytes with fewer key/value heads (GQA).
"""

from __future__ import annotations

from .cli import build_parser, main
from .decode import DecodeResult, decode_benchmark, format_result
from .memory import cpu_memory_supported, free_memory, peak_memories, peak_memory, start_memory_worker
from .plots import STYLES, plot_results
from .run import DEFAULT_LENGTHS, EXPLICIT_COPIES, QUICK_LENGTHS, Result, format_table, run_benchmark
from .steps import (BASELINE, DTYPES, EXPLICIT, KERNELS, MASKS, MODES, VARIANTS, Step, make_mask, make_step,
                    make_variants)
from .timing import time_steps

__all__ = [
    "BASELINE",
    "DEFAULT_LENGTHS",
    "DTYPES",
    "EXPLICIT",
    "EXPLICIT_COPIES",
    "KERNELS",
    "MASKS",
    "MODES",
    "QUICK_LENGTHS",
    "STYLES",
    "VARIANTS",
    "DecodeResult",
    "Result",
    "Step",
    "build_parser",
    "cpu_memory_supported",
    "decode_benchmark",
    "format_result",
    "format_table",
    "free_memory",
    "main",
    "make_mask",
    "make_step",
    "make_variants",
    "peak_memories",
    "peak_memory",
    "plot_results",
    "run_benchmark",
    "start_memory_worker",
    "time_steps",
]
