"""The checks of chapters 06 and 11: rotary positions, ALiBi's bias, sliding windows, shared key/value
heads and decoding with a cache. Each passes two differently written right answers, fails each
mistake it names with that mistake's hint, reads a stub as "not implemented yet", and never crashes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import mha_lib
from mha_lib import checks
from conftest import expect_fail, expect_pass
from mha_lib.checks import CheckResult
from mha_lib.checks.alibi import alibi as check_alibi
from mha_lib.checks.alibi import alibi_slopes_variant

NEW_CHECKS = [checks.check_apply_rotary, checks.check_rotary_attention, checks.check_alibi_bias,
              checks.check_sliding_window_mask, checks.check_repeat_kv, checks.check_cached_attention]


@pytest.mark.parametrize("check", NEW_CHECKS, ids=lambda c: c.__name__)
def test_a_stub_reads_not_implemented(check):
    def stub(*args, **kwargs):
        raise NotImplementedError

    result = check(stub)
    assert result.status == "not implemented" and "not implemented yet" in str(result), result
    assert str(result).startswith("⏳")


@pytest.mark.parametrize("check", NEW_CHECKS, ids=lambda c: c.__name__)
def test_garbage_never_crashes_the_check(check):
    for garbage in (lambda *a, **k: "nonsense", lambda *a, **k: 1 / 0, 42, lambda *a, **k: None,
                    lambda *a, **k: (torch.zeros(1), torch.zeros(1), torch.zeros(1)), lambda *a, **k: torch.zeros(2, 2)):
        result = check(garbage)
        assert isinstance(result, CheckResult) and not result, result
        assert "bug in mha_lib.checks" not in str(result), result


# ------------------------------------------------------------------ apply_rotary (chapter 06)


def rope(x, positions, *, pairing="half", sign=1.0, exponent=2.0, interleave_out=False, use_positions=True,
         base=10000.0, swap_trig=False):
    """A learner-style RoPE with switches for the classic mistakes."""
    d_k = x.size(-1)
    half = d_k // 2
    if not use_positions:
        positions = torch.arange(x.size(-2), device=x.device)
    theta = base ** (-exponent * torch.arange(half, dtype=x.dtype, device=x.device) / d_k)
    angle = sign * positions.to(x.device, x.dtype)[:, None] * theta
    cos, sin = (angle.sin(), angle.cos()) if swap_trig else (angle.cos(), angle.sin())
    if pairing == "half":
        a, b = x[..., :half], x[..., half:]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    a2, b2 = a * cos - b * sin, a * sin + b * cos
    if interleave_out:
        return torch.stack([a2, b2], dim=-1).flatten(-2)
    return torch.cat([a2, b2], dim=-1)


def rope_rotate_half(x, positions):
    """The Hugging Face way: x·cos + rotate_half(x)·sin with duplicated angles."""
    d_k = x.size(-1)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d_k, 2, dtype=torch.float64, device=x.device) / d_k))
    freqs = torch.outer(positions.to(x.device).double(), inv_freq)  # (L, d_k/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (L, d_k)
    x1, x2 = x[..., : d_k // 2], x[..., d_k // 2 :]
    rotated_half = torch.cat([-x2, x1], dim=-1)
    return (x * emb.cos() + rotated_half * emb.sin()).to(x.dtype)


def rope_float32_angles(x, positions):
    """Right rotation, but integer positions times float32 frequencies: float32 angles for a float64 x."""
    half = x.size(-1) // 2
    angle = positions[:, None] * 10000 ** (-2 * torch.arange(half) / x.size(-1))  # float32
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], dim=-1)


def test_apply_rotary_passes_right_answers():
    expect_pass(checks.check_apply_rotary(rope))
    expect_pass(checks.check_apply_rotary(rope_rotate_half))


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda x, p: rope(x, p, pairing="interleaved", interleave_out=True), ("interleaved", "half-split")),
    (lambda x, p: rope(x, p, use_positions=False), ("positions were ignored", "arange(T, T + L)")),
    (lambda x, p: rope(x, p, sign=-1.0), ("wrong way",)),
    (lambda x, p: rope(x, p, exponent=1.0), ("factor 2 is missing",)),
    (lambda x, p: rope(x, p, interleave_out=True), ("written back interleaved", "torch.cat")),
    (lambda x, p: x.clone(), ("nothing was rotated",)),
    (lambda x, p: rope_float32_angles(x, p), ("angles were computed in float32", "dtype=x.dtype")),
    (lambda x, p: rope(x, p, swap_trig=True), ("cos and sin are swapped", "nothing may change")),
    (lambda x, p: rope(x, p, base=1000.0), ("base 1000 or 100000 instead of 10000",)),
    (lambda x, p: rope(x, p, base=100000.0), ("base 1000 or 100000 instead of 10000",)),
])
def test_apply_rotary_names_the_mistake(wrong, words):
    expect_fail(checks.check_apply_rotary(wrong), *words)


def test_apply_rotary_refuses_the_course_answer_and_in_place_changes():
    expect_fail(checks.check_apply_rotary(lambda x, p: mha_lib.apply_rotary(x, p)), "course's own answer")

    def in_place(x, p):
        x.copy_(rope(x, p))
        return x

    expect_fail(checks.check_apply_rotary(in_place), "in place")
    expect_fail(checks.check_apply_rotary(lambda x, p: rope(x, p)[..., :-1]), "shape")


# ------------------------------------------------------------------ rotary attention (chapter 06)


def rotary_attention(q, k, v, mask=None, *, rotate_q=True, rotate_k=True, rotate_v=False, use_mask=True):
    pos = torch.arange(q.size(-2))
    q = mha_lib.apply_rotary(q, pos) if rotate_q else q
    k = mha_lib.apply_rotary(k, pos) if rotate_k else k
    v = mha_lib.apply_rotary(v, pos) if rotate_v else v
    return mha_lib.scaled_dot_product_attention(q, k, v, mask if use_mask else None)


def rotary_attention_sdpa(query, key, value, mask=None):
    q, k = rope_rotate_half(query, torch.arange(query.size(-2))), rope_rotate_half(key, torch.arange(key.size(-2)))
    return F.scaled_dot_product_attention(q, k, value, attn_mask=mask)


def unscaled_rotary_attention(query, key, value, mask=None):
    pos = torch.arange(query.size(-2))
    q, k = mha_lib.apply_rotary(query, pos), mha_lib.apply_rotary(key, pos)
    scores = q @ k.transpose(-2, -1)  # the division by sqrt(d_k) forgotten
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ value


def test_rotary_attention_passes_right_answers():
    expect_pass(checks.check_rotary_attention(rotary_attention))
    expect_pass(checks.check_rotary_attention(rotary_attention_sdpa))  # one tensor, not a pair


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda q, k, v, mask=None: rotary_attention(q, k, v, mask, rotate_v=True), ("values were rotated too",)),
    (lambda q, k, v, mask=None: rotary_attention(q, k, v, mask, rotate_k=False), ("only the queries",)),
    (lambda q, k, v, mask=None: rotary_attention(q, k, v, mask, rotate_q=False), ("only the keys",)),
    (lambda q, k, v, mask=None: rotary_attention(q, k, v, mask, rotate_q=False, rotate_k=False), ("nothing was rotated",)),
    (lambda q, k, v, mask=None: rotary_attention(q, k, v, mask, use_mask=False), ("mask was ignored",)),
    (lambda q, k, v, mask=None: unscaled_rotary_attention(q, k, v, mask), ("not divided by √d_k",)),
])
def test_rotary_attention_names_the_mistake(wrong, words):
    expect_fail(checks.check_rotary_attention(wrong), *words)


def test_rotary_attention_interleaved_pairing():
    def interleaved(q, k, v, mask=None):
        pos = torch.arange(q.size(-2))
        q2 = rope(q, pos, pairing="interleaved", interleave_out=True)
        k2 = rope(k, pos, pairing="interleaved", interleave_out=True)
        return mha_lib.scaled_dot_product_attention(q2, k2, v, mask)

    expect_fail(checks.check_rotary_attention(interleaved), "interleaved")


# ------------------------------------------------------------------ alibi_bias (chapter 06)


def paper_slopes(H):
    """The paper's code: the n slopes of the largest power of two n <= H, then every other one of 2n."""
    def powers_of_two(n):
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]

    n = 2 ** (H.bit_length() - 1)
    return powers_of_two(n) + powers_of_two(2 * n)[0::2][: H - n]


def alibi(H, L, device=None, *, slopes=paper_slopes, distance="abs", sign=-1.0, dtype=None, layout="HLL",
          use_device=True, causal=False, fill=float("-inf")):
    """A learner-style ALiBi bias with switches for the classic mistakes; ``distance="key"`` is BLOOM's
    ``m·j`` (the key's position only), ``causal`` fills the entries above the diagonal with ``fill``."""
    on = device if use_device else None
    m = torch.tensor(slopes(H), device=on)  # (H,) float32
    pos = torch.arange(L, device=on)
    offset = {"abs": (pos[:, None] - pos[None, :]).abs(), "i - j": pos[:, None] - pos[None, :],
              "j - i": pos[None, :] - pos[:, None], "past": (pos[:, None] - pos[None, :]).clamp(min=0),
              "causal": (pos[:, None] - pos[None, :]).abs(), "key": pos[None, :].expand(L, L)}[distance]
    bias = sign * m[:, None, None] * offset  # (H, L, L)
    if distance == "causal" or causal:
        bias = bias.masked_fill(torch.ones(L, L, dtype=torch.bool, device=on).triu(1), fill)
    bias = bias if dtype is None else bias.to(dtype)
    return {"HLL": bias, "LLH": bias.permute(1, 2, 0), "LL": bias[0], "1HLL": bias[None], "H": m}[layout]


def alibi_bloom(num_heads, seq_len, device=None):
    """Written as Hugging Face's BLOOM builds its slopes (torch.pow of a base), then -m·|i - j|."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), device=device)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, device=device))
    if closest != num_heads:
        extra_base = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), device=device)
        extra = torch.arange(1, 1 + 2 * (num_heads - closest), 2, device=device)
        slopes = torch.cat([slopes, torch.pow(extra_base, extra)])
    i = torch.arange(seq_len, device=device)
    return -slopes[:, None, None] * (i[:, None] - i[None, :]).abs().float()


def alibi_loops(num_heads, seq_len, device=None):
    """Entry by entry, in float64, cast at the end."""
    slopes = paper_slopes(num_heads)
    bias = torch.zeros(num_heads, seq_len, seq_len, dtype=torch.float64)
    for h in range(num_heads):
        for i in range(seq_len):
            for j in range(seq_len):
                bias[h, i, j] = -slopes[h] * abs(i - j)
    return bias.float().to(device)


def test_alibi_reference_is_the_library():
    for H in range(1, 34):
        for L in (1, 2, 7):
            assert torch.equal(alibi(H, L), mha_lib.alibi_bias(H, L)), (H, L)
            assert alibi_slopes_variant(H) == pytest.approx(mha_lib.positions.alibi_slopes(H).tolist(), rel=1e-6)
            torch.testing.assert_close(check_alibi(H, L), mha_lib.alibi_bias(H, L).double())


def test_alibi_bias_passes_right_answers():
    expect_pass(checks.check_alibi_bias(alibi))
    expect_pass(checks.check_alibi_bias(alibi_bloom))
    expect_pass(checks.check_alibi_bias(alibi_loops))
    expect_pass(checks.check_alibi_bias(lambda num_heads, seq_len, device=None: alibi(num_heads, seq_len).to(device)))
    expect_pass(checks.check_alibi_bias(lambda num_heads, seq_len, **kw: alibi(num_heads, seq_len, **kw)))


def _reversed(H):
    return paper_slopes(H)[::-1]


def _extra_not_every_other(H):
    n = 2 ** (H.bit_length() - 1)
    return paper_slopes(n) + paper_slopes(2 * n)[: H - n]


def _first_of_next_power_of_two(H):
    n = 2 ** math.ceil(math.log2(H))  # H itself for a power of two
    return [2 ** (-8 * (h + 1) / n) for h in range(H)]


def _extra_taken_odd(H):
    """The extra slopes taken with [1::2]: they repeat the n heads' own slopes."""
    n = 2 ** (H.bit_length() - 1)
    return paper_slopes(n) + [2 ** (-8 * (h + 1) / (2 * n)) for h in range(2 * n)][1::2][: H - n]


def _right_to_left(H):
    """``2 ** (-8/H) ** (h+1)``, which Python reads as ``2 ** ((-8/H) ** (h+1))``."""
    return [2 ** (-8 / H) ** (h + 1) for h in range(H)]  # the precedence mistake itself


def alibi_bloom_row(num_heads, seq_len, device=None):
    """BLOOM's +m·j as its code writes it, one row per head broadcast over the queries: (H, 1, L)."""
    return torch.tensor(paper_slopes(num_heads), device=device)[:, None, None] * torch.arange(seq_len, device=device)


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda H, L, device=None: alibi(H, L, device, slopes=lambda H: [2.0 ** -(h + 1) for h in range(H)]),
     ("1/2, 1/4, 1/8", "8 heads only", "2^(-8/h)")),
    (lambda H, L, device=None: alibi(H, L, device, slopes=lambda H: [2 ** (-8 * h / H) for h in range(H)]),
     ("counted from 0", "2^0 = 1")),
    (lambda H, L, device=None: alibi(H, L, device, slopes=lambda H: [2 ** (-(h + 1) / H) for h in range(H)]),
     ("the 8 is missing",)),
    (lambda H, L, device=None: alibi(H, L, device, slopes=_reversed), ("wrong order", "reversed")),
    (lambda H, L, device=None: alibi(H, L, device, slopes=lambda H: sorted(paper_slopes(H), reverse=True)),
     ("wrong order", "sorted from steep to flat", "num_heads=6")),
    (lambda H, L, device=None: alibi(H, L, device, slopes=lambda H: [2 ** (-8 * (h + 1) / H) for h in range(H)]),
     ("formula for a power of two", "6 is not one", "every other slope")),
    (lambda H, L, device=None: alibi(H, L, device, slopes=lambda H: _first_of_next_power_of_two(H)),
     ("first 6 of 8 heads' slopes",)),
    (lambda H, L, device=None: alibi(H, L, device, slopes=_extra_not_every_other),
     ("not every other one", "[0::2]")),
    (lambda H, L, device=None: alibi(H, L, device, slopes=lambda H: [0.5] * H), ("every head has the same slope",)),
    (lambda H, L, device=None: alibi(H, L, device, slopes=_extra_taken_odd),
     ("num_heads=6", "repeat ones the first n heads already have", "([0::2]), not [1::2]")),
    (lambda H, L, device=None: alibi(H, L, device, slopes=_right_to_left),
     ("** binds right to left", "2 ** ((-8/H) ** (h+1))", "(2 ** (-8/H)) ** (h+1)", "2 ** (-8*(h+1)/H)")),
    (lambda H, L, device=None: alibi(H, L, device, slopes=lambda H: [1 / (h + 2) for h in range(H)]),
     ("the right pattern", "0.5, 0.3333, 0.25, 0.2")),
    (lambda H, L, device=None: alibi(H, L, device, sign=1.0), ("sign is flipped", "farther the key, the larger")),
    (lambda H, L, device=None: alibi(H, L, device, distance="i - j"), ("-m·(i - j)", "|i - j|")),
    (lambda H, L, device=None: alibi(H, L, device, distance="j - i"), ("-m·(j - i)", "|i - j|")),
    (lambda H, L, device=None: alibi(H, L, device, distance="past"), ("only the keys before the query",)),
    (lambda H, L, device=None: alibi(H, L, device, distance="causal"), ("causal mask built in", "bias alone")),
    (lambda H, L, device=None: alibi(H, L, device, distance="key", sign=1.0),
     ("+m·j, BLOOM's form", "-m·(i - j) up to a constant per row", "softmax ignores", "-m_h · |i - j|")),
    (lambda H, L, device=None: alibi(H, L, device, distance="key"), ("-m·j", "+m·(i - j)", "flipped")),
    (lambda H, L, device=None: alibi(H, L, device, distance="key", sign=1.0, slopes=lambda H: [0.5] * H),
     ("every query's row is the same", "depends on the key j only")),
    (alibi_bloom_row, ("has shape (4, 1, 6)", "one row per head", "+m·j, BLOOM's form")),
    (lambda H, L, device=None: alibi(H, L, device, distance="key", sign=1.0, causal=True),
     ("causal mask built in (-inf above the diagonal)", "below the diagonal like +m·j, BLOOM's form",
      "bias alone")),
    (lambda H, L, device=None: alibi(H, L, device, sign=1.0, causal=True, fill=-1e9),
     ("causal mask built in (a fill of -1e+09 above the diagonal)", "below the diagonal like the sign is flipped")),
    (lambda H, L, device=None: alibi(H, L, device, causal=True, slopes=lambda H: [1 / (h + 2) for h in range(H)]),
     ("causal mask built in", "below the diagonal it is wrong too", "every head differs")),
    (lambda H, L, device=None: alibi(H, L, device) + torch.randn(H, L, L) * 0.1 if device is None else None,
     ("does not depend on i - j only",)),
    (lambda H, L, device=None: alibi(H, L, device, layout="LL"),
     ("(6, 6), expected (4, 6, 6)", "head axis is missing")),
    (lambda H, L, device=None: alibi(H, L, device, layout="LLH"), ("head axis comes last",)),
    (lambda H, L, device=None: alibi(H, L, device, layout="1HLL"), ("extra leading axis",)),
    (lambda H, L, device=None: alibi(H, L, device, layout="H"), ("the slopes, without the distances",)),
    (lambda H, L, device=None: alibi(H, L, device, dtype=torch.float64),
     ("dtype torch.float64", "expected torch.float32")),
    (lambda H, L, device=None: alibi(H, L, device, dtype=torch.int64), ("dtype torch.int64", "slopes are fractions")),
    (lambda H, L, device=None: alibi(H, L, device) < 0, ("torch.bool", "float mask")),
    (lambda H, L, device=None: alibi(H, L, device).numpy(), ("numpy",)),
    (lambda H, L, device=None: list(alibi(H, L, device)), ("torch.stack",)),
    (lambda H, L, device=None: mha_lib.alibi_bias(H, L, device), ("course's own answer",)),
    (lambda H, L, device=None: -mha_lib.positions.alibi_slopes(H)[:, None, None] * alibi(1, L)[0] * 256,
     ("alibi_slopes, the course's own answer",)),
    (lambda H, L, device=None: alibi(H, L, device, use_device=False), ("device=torch.device('meta')", "ignored")),
    (lambda H, L: alibi(H, L), ("doesn't accept the argument device=", "device=none")),
])
def test_alibi_bias_names_the_mistake(wrong, words):
    expect_fail(checks.check_alibi_bias(wrong), *words)


def test_alibi_bias_reports_a_device_that_fails():
    def mixed(num_heads, seq_len, device=None):
        slopes = torch.tensor(paper_slopes(num_heads))  # on the CPU whatever the device
        pos = torch.arange(seq_len, device=device)
        return -slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs()

    def no_meta_kernel(num_heads, seq_len, device=None):
        if torch.device(device or "cpu").type == "meta":
            raise NotImplementedError("Could not run 'aten::something' with arguments from the 'Meta' backend")
        return alibi(num_heads, seq_len, device)

    for fn in (mixed, no_meta_kernel):
        expect_fail(checks.check_alibi_bias(fn), "device=torch.device('meta')", "right on the cpu",
                    "create every tensor on device", status="error")


def test_alibi_bias_crashes_are_reported():
    def crashes_for_non_powers_of_two(num_heads, seq_len, device=None):
        if num_heads & (num_heads - 1):
            raise ValueError("only powers of two")
        return alibi(num_heads, seq_len, device)

    expect_fail(checks.check_alibi_bias(crashes_for_non_powers_of_two), "num_heads=6", "valueerror", status="error")


# ------------------------------------------------------------------ sliding_window_mask (chapter 11)


def window_compare(L, w):
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    return (i - j >= 0) & (i - j < w)


def window_tril(L, w):
    full = torch.ones(L, L, dtype=torch.bool)
    return full.tril() & ~full.tril(diagonal=-w)


def test_sliding_window_mask_passes_right_answers():
    expect_pass(checks.check_sliding_window_mask(window_compare))
    expect_pass(checks.check_sliding_window_mask(window_tril))


def _window(L, w, low=0, high=None, causal=True):
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    if not causal:
        return (i - j).abs() < w
    return (i - j >= low) & (i - j < (w if high is None else high))


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda L, w: _window(L, w, high=w + 1), ("off by one", "window + 1 keys")),
    (lambda L, w: _window(L, w, high=w - 1), ("off by one", "window - 1 keys")),
    (lambda L, w: _window(L, w, low=1, high=w + 1), ("hides each token from itself", "0 < i - j <= window")),
    (lambda L, w: _window(L, w, low=1), ("hides each token from itself", "0 < i - j < window")),
    (lambda L, w: _window(L, w, causal=False), ("not causal",)),
    (lambda L, w: _window(L, w).T, ("future",)),
    (lambda L, w: ~_window(L, w), ("inverted",)),
    (lambda L, w: torch.ones(L, L, dtype=torch.bool).tril(), ("window is ignored",)),
    (lambda L, w: _window(L, w).float(), ("torch.bool",)),
    (lambda L, w: mha_lib.sliding_window_mask(L, w), ("course's own answer",)),
])
def test_sliding_window_mask_names_the_mistake(wrong, words):
    expect_fail(checks.check_sliding_window_mask(wrong), *words)


# ------------------------------------------------------------------ repeat_kv (chapter 11)


def repeat_interleave(x, n_rep):
    return torch.repeat_interleave(x, n_rep, dim=1)


def repeat_expand(x, n_rep):
    B, H_kv, L, d_k = x.shape
    return x[:, :, None].expand(B, H_kv, n_rep, L, d_k).reshape(B, H_kv * n_rep, L, d_k)


def test_repeat_kv_passes_right_answers():
    expect_pass(checks.check_repeat_kv(repeat_interleave))
    expect_pass(checks.check_repeat_kv(repeat_expand))


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda x, n: x.repeat(1, n, 1, 1), ("tiled", "repeat_interleave")),
    (lambda x, n: torch.repeat_interleave(x, n, dim=2), ("wrong axis",)),
    (lambda x, n: torch.repeat_interleave(x, n, dim=0), ("wrong axis",)),
    (lambda x, n: x[:, :, None].expand(-1, -1, n, -1, -1), ("merge the two head axes",)),
    (lambda x, n: mha_lib.repeat_kv(x, n), ("course's own answer",)),
])
def test_repeat_kv_names_the_mistake(wrong, words):
    expect_fail(checks.check_repeat_kv(wrong), *words)


# ------------------------------------------------------------------ decoding with a cache (chapter 11)


def cached(q, k, v, k_cache, v_cache, *, mistake=None):
    """A learner-style cached step with switches for the classic mistakes."""
    T, n = k_cache.size(-2), q.size(-2)
    if mistake == "positions after append":
        k_cache_tmp = torch.cat([k_cache, k], dim=-2)
        start = k_cache_tmp.size(-2)
    else:
        start = 0 if mistake == "restart" else T
    pos = torch.arange(start, start + n)
    q, k_rot = mha_lib.apply_rotary(q, pos), mha_lib.apply_rotary(k, pos)
    if mistake == "rotate v":
        v = mha_lib.apply_rotary(v, pos)
    if mistake == "no append":
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        return mha_lib.scaled_dot_product_attention(q, k_rot, v, causal)[0], k_cache, v_cache
    k_all, v_all = torch.cat([k_cache, k_rot], dim=-2), torch.cat([v_cache, v], dim=-2)
    if mistake == "past only":
        out = mha_lib.scaled_dot_product_attention(q, k_cache, v_cache)[0]
        return out, k_all, v_all
    ones = torch.ones(n, T + n, dtype=torch.bool, device=q.device)
    mask = {"tril": ones.tril(), "no mask": None}.get(mistake, ones.tril(diagonal=T))
    out, _ = mha_lib.scaled_dot_product_attention(q, k_all, v_all, mask)
    if mistake == "unrotated cache":
        k_all = torch.cat([k_cache, k], dim=-2)
    return out, k_all, v_all


def cached_sdpa(query, key, value, k_cache, v_cache):
    """Written differently: positions from a comparison mask, PyTorch's fused attention."""
    T, n = k_cache.shape[-2], query.shape[-2]
    positions = T + torch.arange(n, device=query.device)
    query, key = rope_rotate_half(query, positions), rope_rotate_half(key, positions)
    k_cache, v_cache = torch.cat((k_cache, key), -2), torch.cat((v_cache, value), -2)
    allowed = torch.arange(T + n, device=query.device)[None, :] <= positions[:, None]  # (n, T + n)
    return F.scaled_dot_product_attention(query, k_cache, v_cache, attn_mask=allowed), k_cache, v_cache


def test_cached_attention_passes_right_answers():
    expect_pass(checks.check_cached_attention(cached))
    expect_pass(checks.check_cached_attention(cached_sdpa))


@pytest.mark.parametrize(("mistake", "words"), [
    ("no append", ("not appended", "torch.cat")),
    ("tril", ("without the offset t", "hides the past", "tril(diagonal=T)")),
    ("restart", ("restart at 0", "torch.arange(T, T + n)")),
    ("positions after append", ("counted after appending", "before appending")),
    ("past only", ("only to the cached keys",)),
    ("no mask", ("no causal mask within the chunk",)),
    ("rotate v", ("values were rotated too",)),
    ("unrotated cache", ("stored before rotating",)),
])
def test_cached_attention_names_the_mistake(mistake, words):
    expect_fail(checks.check_cached_attention(lambda *a, m=mistake: cached(*a, mistake=m)), *words)


def test_cached_attention_wants_three_results():
    expect_fail(checks.check_cached_attention(lambda *a: cached(*a)[0]), "expected (output, k_cache, v_cache)")
    expect_fail(checks.check_cached_attention(lambda *a: cached(*a)[:2]), "expected (output, k_cache, v_cache)")


def test_the_checks_leave_the_random_state_alone():
    torch.manual_seed(3)
    before = torch.rand(1)
    torch.manual_seed(3)
    checks.check_cached_attention(cached)
    checks.check_apply_rotary(rope)
    assert torch.equal(torch.rand(1), before)
    assert math.isfinite(before.item())


def test_rotary_and_cache_checks_name_a_tensor_made_on_the_cpu():
    """The solutions' old code, right on the CPU and a crash on a GPU: each check runs once more on the meta device."""
    def rotary_cpu(x, positions):
        half = x.size(-1) // 2
        theta = 10000.0 ** (-2 * torch.arange(half, dtype=x.dtype) / x.size(-1))  # on the CPU, whatever x's device
        angle = positions.to(x.dtype)[:, None] * theta
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], dim=-1)

    def rotary_attention_cpu(query, key, value, mask=None):
        positions = torch.arange(query.size(-2))
        q, k = rotary_cpu(query, positions), rotary_cpu(key, positions)
        return mha_lib.scaled_dot_product_attention(q, k, value, mask)[0]

    def cached_cpu(query, key, value, k_cache, v_cache):
        T, n = k_cache.size(-2), query.size(-2)
        positions = torch.arange(T, T + n)
        query, key = mha_lib.apply_rotary(query, positions), mha_lib.apply_rotary(key, positions)
        k_cache, v_cache = torch.cat([k_cache, key], dim=-2), torch.cat([v_cache, value], dim=-2)
        mask = torch.ones(n, T + n, dtype=torch.bool).tril(diagonal=T)
        return mha_lib.scaled_dot_product_attention(query, k_cache, v_cache, mask)[0], k_cache, v_cache

    for check, fn, fix in ((checks.check_apply_rotary, rotary_cpu, "device=x.device"),
                           (checks.check_rotary_attention, rotary_attention_cpu, "device=query.device"),
                           (checks.check_cached_attention, cached_cpu, "device=query.device")):
        expect_fail(check(fn), "device 'meta'", "it is the device that fails", fix, status="error")
