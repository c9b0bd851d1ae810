"""python -m mha_lib.bench: a tiny run through its main function, its measurements, its errors."""

from __future__ import annotations

import pytest
import torch

from mha_lib import bench

TINY = ["--device", "cpu", "--lengths", "8", "16", "--repeats", "1", "--d-model", "16", "--heads", "2",
        "--min-time", "0"]


def test_tiny_run_prints_every_variant(capsys):
    assert bench.main(TINY) == 0
    out = capsys.readouterr().out
    assert "forward ms" in out and "fwd+bwd ms" in out and "peak MiB" in out
    rows = [line for line in out.splitlines() if line.strip().startswith(("8 ", "16 "))]
    assert len(rows) == 2 * len(bench.VARIANTS)
    for variant in bench.VARIANTS:
        assert sum(f" {variant} " in row for row in rows) == 2, variant
    baseline_rows = [row for row in rows if f" {bench.BASELINE} " in row]
    assert all(row.count("1.00x") == 4 for row in baseline_rows)  # time and memory, in both modes


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
    assert bench.main(TINY + ["--modes", "fwd+bwd", "--plot", str(path)]) == 0
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
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["--dtype", "int8"], "invalid choice: 'int8'"),
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


def test_cpu_peak_memory_counts_live_tensors():
    def step():
        a = torch.ones(1_000_000)  # 4 MB
        b = torch.ones(500_000)  # 2 MB: the peak, 6 MB, is reached here
        del a
        c = torch.ones(250_000)  # 1 MB, with b still alive: 3 MB
        del b, c

    assert bench.peak_memory(step, "cpu") == 6_000_000


def test_teaching_module_needs_the_weights_memory_and_efficient_does_not():
    B, L, D, H = 1, 1024, 32, 4
    weights_bytes = B * H * L * L * 4
    functions = bench.make_variants(D, H)
    x = torch.randn(B, L, D)
    peaks = {v: bench.peak_memory(bench.make_step(functions[v], x, "fwd+bwd")) for v in ("teaching", "efficient")}
    assert peaks["teaching"] > 2 * weights_bytes  # the weights and what autograd keeps of them
    assert peaks["efficient"] < weights_bytes / 4


def test_variants_compute_the_same_function():
    functions = bench.make_variants(16, 4, dtype=torch.float64)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    expected = functions[bench.BASELINE](x)
    for variant, fn in functions.items():
        torch.testing.assert_close(fn(x), expected, msg=variant)


def test_time_steps_runs_round_robin():
    calls = []
    steps = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = bench.time_steps(steps, repeats=3, warmup=2, min_time=0.0)
    assert calls == list("aabbcc") + list("abc") + list("bca") + list("cab")
    assert set(times) == set("abc") and all(len(t) == 3 and min(t) >= 0 for t in times.values())


def test_variants_that_would_not_fit_are_skipped(monkeypatch):
    monkeypatch.setattr(bench, "free_memory", lambda device: 1000)
    results = bench.run_benchmark([8], d_model=16, num_heads=2, repeats=1, min_time=0.0, memory=False)
    skipped = {r.variant for r in results if r.skipped}
    assert skipped == set(bench.EXPLICIT)
    table = bench.format_table(results)
    assert "skip" in table and "would not fit" in table
    with pytest.raises(ValueError, match=r"unknown variant\(s\) \['flash'\]"):
        bench.run_benchmark([8], variants=["flash"])
