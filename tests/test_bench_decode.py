"""``python -m mha_lib.bench decode`` (:mod:`mha_lib.bench.decode`) on tiny sizes; its timings are measured, not tested."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from mha_lib import kv_cache_bytes
from mha_lib.bench.decode import DecodeResult, decode_benchmark, format_result, main


def test_decode_benchmark_returns_its_numbers():
    result = decode_benchmark(tokens=6, d_model=16, num_heads=4, kv_heads=2, batch=3, repeats=2)
    assert isinstance(result, DecodeResult)
    fields = {f.name for f in dataclasses.fields(DecodeResult)}
    assert set(result.as_dict()) == fields >= {"recompute_s", "cache_s", "speedup", "cache_bytes", "bytes_ratio"}
    assert (result.tokens, result.d_model, result.num_heads, result.kv_heads, result.batch) == (6, 16, 4, 2, 3)
    assert result.device == "cpu" and result.threads >= 1
    assert result.recompute_s > 0 and result.cache_s > 0
    assert result.speedup == pytest.approx(result.recompute_s / result.cache_s)
    assert result.max_abs_diff < 1e-5  # the two ways decode the same outputs
    assert result.cache_bytes == kv_cache_bytes(1, 4, 4, 6, batch=3, bytes_per_element=4) == 2 * 3 * 4 * 6 * 4 * 4
    assert result.gqa_cache_bytes * 2 == result.cache_bytes and result.bytes_ratio == 0.5


def test_the_book_configuration_holds_a_quarter_with_two_kv_heads():
    result = decode_benchmark(tokens=3, repeats=1)  # d_model 512, 8 heads, 2 key/value heads
    assert result.cache_bytes == 2 * 8 * 3 * 64 * 4 and result.bytes_ratio == 0.25


def test_kv_cache_bytes_arithmetic():
    assert kv_cache_bytes(32, 32, 128, 4096) == 2 * 2**30  # LLaMA-2-7B-like, float16: 2 GiB
    assert kv_cache_bytes(32, 8, 128, 4096) == 2**30 // 2  # with 8 key/value heads, a quarter
    with pytest.raises(ValueError, match="seq_len"):  # the message names the argument
        kv_cache_bytes(32, 8, 128, -1)


def test_the_command_line(capsys):
    assert main(["--tokens", "4", "--d-model", "16", "--heads", "4", "--kv-heads", "1", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "decoding 4 tokens one at a time" in out and "with a KV cache" in out and "(0.25 of it)" in out
    with pytest.raises(SystemExit) as exit_info:
        main(["--heads", "3"])
    assert exit_info.value.code == 2
    assert "d_model=512 is not divisible by num_heads=3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--tokens", "0"])
    assert "expected a positive integer, got 0" in capsys.readouterr().err


def test_format_result_names_every_number():
    result = DecodeResult(tokens=256, d_model=512, num_heads=8, kv_heads=2, batch=1, device="cpu", threads=1,
                          recompute_s=2.0, cache_s=0.1, speedup=20.0, max_abs_diff=1e-7,
                          cache_bytes=1048576, gqa_cache_bytes=262144, bytes_ratio=0.25)
    text = format_result(result)
    assert "2000.0 ms" in text and "100.0 ms" in text and "(20.0x faster)" in text and "(1 thread)" in text
    assert "1,048,576 bytes" in text and "262,144 bytes" in text and "(0.25 of it)" in text


def test_python_m_mha_lib_bench_decode_is_the_command():
    result = subprocess.run([sys.executable, "-m", "mha_lib.bench", "decode", "--tokens", "0"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert "usage: python -m mha_lib.bench decode" in result.stderr
    assert "argument --tokens: expected a positive integer, got 0" in result.stderr
