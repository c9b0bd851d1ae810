"""python -m mha_lib.bench: a tiny run through its main function, its measurements, its errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from mha_lib import bench

TINY = ["--device", "cpu", "--lengths", "8", "16", "--repeats", "1", "--d-model", "16", "--heads", "2",
        "--min-time", "0"]
needs_rss = pytest.mark.skipif(not bench.cpu_memory_supported(), reason="CPU memory is measured on Linux only")


def test_tiny_run_prints_every_variant(capsys):
    assert bench.main(TINY) == 0
    out = capsys.readouterr().out
    assert "forward ms" in out and "fwd+bwd ms" in out and "peak MiB" in out
    rows = [line for line in out.splitlines() if line.strip().startswith(("8 ", "16 "))]
    assert len(rows) == 2 * len(bench.VARIANTS)
    for variant in bench.VARIANTS:
        assert sum(f" {variant} " in row for row in rows) == 2, variant
    baseline_rows = [row for row in rows if f" {bench.BASELINE} " in row]
    for row in baseline_rows:  # the baseline's time ratio, in both modes: (ms, ratio, MiB, ratio) a mode
        assert [mode.split()[1] for mode in row.split("|")[1:]] == ["1.00x", "1.00x"], row
    if bench.cpu_memory_supported():
        assert "peak RSS of a worker process" in out
        for row in rows:  # every peak was measured: a number of MiB in both modes
            assert all(float(part.split()[2]) >= 0 for part in row.split("|")[1:]), row


def test_stat_min_reports_the_fastest_repetition(capsys):
    assert bench.main(TINY + ["--modes", "forward", "--no-memory", "--stat", "min", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "min of 2 round-robin repetitions" in out and "forward ms" in out and "fwd+bwd" not in out
    results = [bench.Result(8, "nn.MHA", "forward", seconds=0.004, fastest=0.002, peak_bytes=None)]
    assert "2.00" in bench.format_table(results, stat="min") and "4.00" in bench.format_table(results)
    with pytest.raises(ValueError, match="stat must be 'median' or 'min', got 'mean'"):
        bench.format_table(results, stat="mean")


def test_plot_writes_a_png(tmp_path, capsys):
    path = tmp_path / "bench.png"
    assert bench.main(TINY + ["--modes", "fwd+bwd", "--no-memory", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot saved to {path}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lengths", "0"], "expected a positive integer, got 0"),
        (["--lengths", "ten"], "expected a positive integer, got 'ten'"),
        (["--repeats", "-1"], "expected a positive integer, got -1"),
        (["--warmup", "0"], "expected a positive integer, got 0"),
        (["--d-model", "10", "--heads", "4"], "--d-model 10 is not divisible by --heads 4"),
        (["--device", "tpu"], "--device='tpu' is not a device the course knows"),
        (["--dtype", "int8"], "invalid choice: 'int8'"),
        (["--mask", "square"], "invalid choice: 'square'"),
        (["--dropout", "1"], "expected a number in [0, 1), got 1.0"),
        (["--variants", "teaching", "efficient"], "must include the baseline 'nn.MHA'"),
        (["--plot", "/no/such/folder/bench.png"], "folder /no/such/folder does not exist"),
        (["--min-time", "-1"], "--min-time must be >= 0"),
    ],
)
def test_argument_errors_are_clear(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_unavailable_cuda_is_named(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--device", "cuda"])
    assert "CUDA is not available on this machine" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("garbage", "MHA_DEVICE='garbage' is not a device the course knows"),
        pytest.param("cuda", "MHA_DEVICE='cuda', but CUDA is not available on this machine",
                     marks=pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")),
    ],
)
def test_device_auto_reports_get_devices_message(value, message, monkeypatch, capsys):
    monkeypatch.setenv("MHA_DEVICE", value)
    assert bench.main(["--quick"]) == 2  # the default is --device auto
    err = capsys.readouterr().err
    assert err.strip() == f"python -m mha_lib.bench: error: --device auto: {message}" or message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_the_command_exits_with_one_line_and_no_traceback():
    result = subprocess.run([sys.executable, "-m", "mha_lib.bench", "--device", "auto"], capture_output=True,
                            text=True, env=dict(os.environ, MHA_DEVICE="garbage"), timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "python -m mha_lib.bench: error: --device auto: MHA_DEVICE='garbage' is not a device the course knows; "
        "use cpu, cuda, cuda:N or mps, or unset MHA_DEVICE to pick automatically"
    ]


def allocate_6_mb() -> None:
    """A step for the fresh process (module level, so that it pickles): a 6 MB peak, 3 MB at the end."""
    a = torch.ones(1_000_000)  # 4 MB
    b = torch.ones(500_000)  # 2 MB: the peak, 6 MB, is reached here
    del a
    c = torch.ones(250_000)  # 1 MB, with b still alive: 3 MB
    del b, c


@needs_rss
def test_cpu_peak_memory_sees_the_peak_not_the_end():
    peak = bench.peak_memory(allocate_6_mb, "cpu")
    assert abs(peak - 6_000_000) < 2**20  # not the 4 MB before it, nor the 3 MB at the end


@needs_rss
def test_a_worker_started_early_is_the_one_that_measures():
    """start_memory_worker returns at once (the worker imports PyTorch in the background), and
    peak_memory then uses that worker; other devices start nothing."""
    from mha_lib.bench import memory

    assert bench.start_memory_worker("meta") is False
    assert bench.start_memory_worker("cpu") is True
    worker = memory._worker
    assert worker is not None and worker.poll() is None
    assert abs(bench.peak_memory(allocate_6_mb, "cpu") - 6_000_000) < 2**20
    assert memory._worker is worker and bench.start_memory_worker("cpu") is True and memory._worker is worker


def test_cpu_peak_memory_refuses_a_step_it_cannot_send():
    if not bench.cpu_memory_supported():
        pytest.skip("CPU memory is measured on Linux only")
    with pytest.raises(TypeError, match="needs a step it can pickle"):
        bench.peak_memory(lambda: None, "cpu")


B, L, D, H = 1, 1024, 32, 8
WEIGHTS_BYTES = B * H * L * L * 4  # one float32 (B, H, L, L) tensor: 32 MiB
CASES = {  # name: (variant, mode, mask, dropout)
    "teaching": ("teaching", "fwd+bwd", "none", 0.0),
    "efficient": ("efficient", "fwd+bwd", "none", 0.0),
    "efficient, causal (L, L)": ("efficient", "fwd+bwd", "causal", 0.0),
    "efficient, per-head (H, L, L)": ("efficient", "fwd+bwd", "per-head", 0.0),
    "efficient, dropout in training": ("efficient", "fwd+bwd", "none", 0.1),
    "efficient, float mask with grad": ("efficient", "fwd+bwd", "float-grad", 0.0),
    "efficient, float mask, inference": ("efficient", "forward", "float-grad", 0.0),
}


@pytest.fixture(scope="module")
def peaks() -> dict[str, int]:
    """The peak memory of every case, measured in one fresh process."""
    if not bench.cpu_memory_supported():
        pytest.skip("CPU memory is measured on Linux only")
    steps = [bench.Step(v, mode, L, B, D, H, mask=mask, dropout=p) for v, mode, mask, p in CASES.values()]
    return dict(zip(CASES, bench.peak_memories(steps, "cpu")))


def test_teaching_module_needs_the_weights_memory_and_efficient_does_not(peaks):
    assert peaks["teaching"] > 2 * WEIGHTS_BYTES  # the weights and what autograd keeps of them
    assert peaks["efficient"] < WEIGHTS_BYTES / 4
    assert peaks["efficient, causal (L, L)"] < WEIGHTS_BYTES / 2  # the mask and its float copy: 5 L² bytes
    assert peaks["efficient, float mask, inference"] < WEIGHTS_BYTES / 2


def test_a_per_head_mask_runs_the_fused_kernel_and_costs_only_its_float_copy(peaks):
    """The module passes an (H, L, L) mask as (1, H, L, L), which the CPU's fused kernel takes; the
    kernel turns a bool mask into floats first, H·L² numbers (as many as the weights at B = 1),
    and the guard for fully masked rows makes one bool copy (H·L² bytes): 1.25 copies of the
    weights' size, where the math kernel (below) needs more than 2."""
    case = "efficient, per-head (H, L, L)"
    assert 0.9 * WEIGHTS_BYTES < peaks[case] < 1.5 * WEIGHTS_BYTES, peaks[case] / 2**20


@pytest.mark.parametrize("case", ["efficient, dropout in training", "efficient, float mask with grad"])
def test_efficient_module_stores_the_weights_where_the_cpu_kernel_falls_back(peaks, case):
    """F.scaled_dot_product_attention's math kernel on the CPU: the weights exist again
    (about three copies)."""
    assert peaks[case] > 2 * WEIGHTS_BYTES, (case, peaks[case] / 2**20)
    assert peaks[case] > 10 * peaks["efficient"]


@pytest.mark.parametrize(
    ("case", "kwargs"),
    [
        ("no mask", {}),
        ("(L, L) bool", {"attn_mask": torch.ones(6, 6, dtype=torch.bool).tril()}),
        ("(H, L, L) bool", {"attn_mask": torch.ones(4, 6, 6, dtype=torch.bool).tril()}),
        ("(1, H, L, L) bool", {"attn_mask": torch.ones(1, 4, 6, 6, dtype=torch.bool).tril()}),
        ("(H, L, L) float", {"attn_mask": torch.zeros(4, 6, 6)}),
        ("(1, H, L, L) float", {"attn_mask": torch.zeros(1, 4, 6, 6)}),
        ("dropout", {"dropout_p": 0.1}),
        ("float with grad", {"attn_mask": torch.zeros(6, 6, requires_grad=True)}),
    ],
)
def test_which_cpu_kernel_sdpa_runs(case, kwargs):
    """The fallbacks the docs name: the math kernel has no fused backward of its own. A mask of
    3 dimensions is one of them; the same mask with 4 runs the fused kernel."""
    q, k, v = (torch.randn(1, 4, 6, 8, requires_grad=True) for _ in range(3))
    kernel = F.scaled_dot_product_attention(q, k, v, **kwargs).grad_fn.name()
    fused = "FlashAttentionForCpu" in kernel
    assert fused == (case in ("no mask", "(L, L) bool", "(1, H, L, L) bool", "(1, H, L, L) float")), (case, kernel)


@pytest.mark.parametrize("mask", list(bench.MASKS))
def test_variants_compute_the_same_function(mask):
    functions = bench.make_variants(16, 4, dtype=torch.float64)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    attn_mask = bench.make_mask(mask, 7, 4, dtype=torch.float64)
    expected = functions[bench.BASELINE](x, attn_mask)
    for variant, fn in functions.items():
        torch.testing.assert_close(fn(x, attn_mask), expected, msg=variant)
    if mask != "none":  # the mask changes the result: it was applied
        assert not torch.allclose(functions[bench.BASELINE](x), expected)


def test_a_step_is_sent_as_its_settings():
    import pickle

    step = bench.Step("efficient", "fwd+bwd", 8, d_model=16, num_heads=2, mask="per-head")
    step()
    copy = pickle.loads(pickle.dumps(step))
    assert copy.settings == step.settings and repr(copy) == repr(step)  # the built run (a closure) stays behind
    copy()
    with pytest.raises(ValueError, match="unknown variant 'flash'"):
        bench.Step("flash", "forward", 8)
    with pytest.raises(ValueError, match="mask must be one of"):
        bench.Step("teaching", "forward", 8, mask="square")


def test_time_steps_runs_round_robin():
    calls = []
    steps = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = bench.time_steps(steps, repeats=3, warmup=2, min_time=0.0)
    assert calls == list("aabbcc") + list("abc") + list("bca") + list("cab")
    assert set(times) == set("abc") and all(len(t) == 3 and min(t) >= 0 for t in times.values())


def test_variants_that_would_not_fit_are_skipped(monkeypatch):
    monkeypatch.setattr(bench.memory, "free_memory", lambda device: 1000)
    results = bench.run_benchmark([8], d_model=16, num_heads=2, repeats=1, min_time=0.0, memory=False)
    skipped = {r.variant for r in results if r.skipped}
    assert skipped == set(bench.EXPLICIT)
    table = bench.format_table(results)
    assert "skip" in table and "would not fit" in table
    with pytest.raises(ValueError, match=r"unknown variant\(s\) \['flash'\]"):
        bench.run_benchmark([8], variants=["flash"])


def test_the_benchmark_uses_no_private_pytorch_api():
    """Private names (torch._C, torch.profiler's internals) change without notice between versions."""
    import ast
    from pathlib import Path

    for path in Path(bench.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        names += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        names += [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Attribute)]
        private = [n for n in names if n.split(".")[0] == "torch"
                   and any(part.startswith("_") and not part.endswith("__") for part in n.split("."))]
        assert not private, (path.name, private)
