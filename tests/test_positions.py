"""Sinusoidal positions and rotary position embeddings (RoPE)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import TOLERANCES
from mha_lib import (EfficientMultiHeadAttention, KVCache, MultiHeadAttention, apply_rotary, causal_mask,
                     combine_heads, padding_mask, rotary_permutation, sinusoidal_positions, split_heads)
from mha_lib.positions import alibi_bias, alibi_slopes, relative_position_buckets


# ---------------------------------------------------------------- sinusoidal positions
@pytest.mark.parametrize("seq_len, d_model", [(1, 2), (7, 16), (5, 9), (3, 1)])
def test_sinusoidal_positions_follow_the_papers_formula(seq_len, d_model):
    table = sinusoidal_positions(seq_len, d_model)
    assert table.shape == (seq_len, d_model) and table.dtype == torch.float32
    expected = torch.empty(seq_len, d_model, dtype=torch.float64)
    for pos in range(seq_len):
        for feature in range(d_model):
            i = feature // 2
            angle = pos / 10000 ** (2 * i / d_model)
            expected[pos, feature] = math.sin(angle) if feature % 2 == 0 else math.cos(angle)
    torch.testing.assert_close(table, expected.float())


def test_sinusoidal_positions_match_the_annotated_transformer():
    """The Annotated Transformer writes the frequencies as exp(-2i log(10000) / d)."""
    L, D = 50, 32
    position = torch.arange(L).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, D, 2) * -(math.log(10000.0) / D))
    expected = torch.zeros(L, D)
    expected[:, 0::2] = torch.sin(position * div_term)
    expected[:, 1::2] = torch.cos(position * div_term)
    torch.testing.assert_close(sinusoidal_positions(L, D), expected, atol=1e-5, rtol=1e-5)
    assert sinusoidal_positions(L, D)[0].tolist() == [0.0, 1.0] * (D // 2)  # position 0: sin 0, cos 0


def test_sinusoidal_positions_on_a_device(device):
    assert sinusoidal_positions(4, 6, device=device).device.type == device.type


@pytest.mark.parametrize("args", [(0, 8), (4, 0), (4.0, 8), (True, 8), (4, -2)])
def test_sinusoidal_positions_refuse_bad_sizes(args):
    with pytest.raises(ValueError, match="must be a positive int"):
        sinusoidal_positions(*args)


# ---------------------------------------------------------------- rotary positions
def reference_rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Hugging Face LLaMA's formulation: x * cos + rotate_half(x) * sin, in float64."""
    d_k = x.size(-1)
    inv_freq = 1.0 / base ** (torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)  # (d_k/2,)
    freqs = positions.double()[:, None] * inv_freq  # (L, d_k/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (L, d_k)
    x1, x2 = x.double().chunk(2, dim=-1)
    rotate_half = torch.cat([-x2, x1], dim=-1)
    return x.double() * emb.cos() + rotate_half * emb.sin()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 5, 8), (1, 1, 1, 2), (4, 6, 16), (7, 64)])
def test_apply_rotary_matches_hugging_face_llama(shape, dtype, device):
    x = torch.randn(*shape, dtype=torch.float64).to(device, dtype)
    positions = torch.randint(0, 1000, (shape[-2],))
    out = apply_rotary(x, positions.to(device))
    assert out.shape == x.shape and out.dtype == dtype and out.device == x.device
    torch.testing.assert_close(out, reference_rotary(x.cpu(), positions).to(device, dtype), **TOLERANCES[dtype])
    default = apply_rotary(x)  # positions default to arange(L)
    expected = reference_rotary(x.cpu(), torch.arange(shape[-2])).to(device, dtype)
    torch.testing.assert_close(default, expected, **TOLERANCES[dtype])


def test_apply_rotary_rotates_each_pair_by_position_times_frequency():
    """d_k = 2 is one pair, rotated by exactly m radians at position m (θ_0 = 1)."""
    x = torch.tensor([[1.0, 0.0]] * 4, dtype=torch.float64)  # (L=4, 2): the unit vector e_0
    out = apply_rotary(x)
    m = torch.arange(4, dtype=torch.float64)
    torch.testing.assert_close(out, torch.stack([m.cos(), m.sin()], dim=-1))
    # d_k = 4: pairs (0, 2) turn by m, pairs (1, 3) by m / 100 (θ_1 = 10000^(-2/4))
    y = torch.zeros(1, 4, dtype=torch.float64)
    y[0, 1] = 1.0
    out = apply_rotary(y, torch.tensor([3]))
    torch.testing.assert_close(out, torch.tensor([[0.0, math.cos(0.03), 0.0, math.sin(0.03)]], dtype=torch.float64))


def test_apply_rotary_preserves_norms_and_leaves_position_zero_alone():
    x = torch.randn(2, 4, 9, 16, dtype=torch.float64)
    out = apply_rotary(x)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    assert torch.equal(out[..., 0, :], x[..., 0, :])
    assert not torch.allclose(out[..., 1:, :], x[..., 1:, :])  # every other position moved


def scores(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    return apply_rotary(q, q_pos) @ apply_rotary(k, k_pos).transpose(-2, -1)  # (..., Lq, Lk)


@pytest.mark.parametrize("shift", [1, 17, 1000])
def test_shifting_every_position_leaves_the_scores_unchanged(shift):
    q, k = torch.randn(2, 3, 6, 8, dtype=torch.float64), torch.randn(2, 3, 6, 8, dtype=torch.float64)
    positions = torch.arange(6)
    before = scores(q, k, positions, positions)
    after = scores(q, k, positions + shift, positions + shift)
    torch.testing.assert_close(after, before)
    assert not torch.allclose(before, q @ k.transpose(-2, -1))  # the rotation did change them


def test_the_score_depends_only_on_the_offset():
    """The same query at every position against the same key at every position: score[i, j] is a
    function of i - j alone, so every diagonal of the score matrix is constant."""
    L = 10
    q = torch.randn(1, 8, dtype=torch.float64).expand(L, 8)
    k = torch.randn(1, 8, dtype=torch.float64).expand(L, 8)
    s = scores(q, k, torch.arange(L), torch.arange(L))  # (L, L)
    for offset in range(-L + 1, L):
        diagonal = s.diagonal(offset=-offset)  # entries with i - j = offset
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal))
    assert s.diagonal(0).std() < 1e-12 and s.diagonal(-1)[0] != s.diagonal(0)[0]


def test_the_offset_checks_can_fail():
    """Added (absolute) positions do not have the offset property: the test above would catch them."""
    L, d = 10, 8
    q = torch.randn(1, d, dtype=torch.float64).expand(L, d) + sinusoidal_positions(L, d).double()
    k = torch.randn(1, d, dtype=torch.float64).expand(L, d) + sinusoidal_positions(L, d).double()
    s = q @ k.T
    assert s.diagonal(0).std() > 1e-3
    # and rotating by unshifted positions on one side breaks the shift invariance
    q, k = torch.randn(6, 8, dtype=torch.float64), torch.randn(6, 8, dtype=torch.float64)
    p = torch.arange(6)
    assert not torch.allclose(scores(q, k, p + 5, p), scores(q, k, p, p))


def test_interleaved_pairing_is_the_same_rotation_up_to_a_permutation():
    """RoFormer pairs (2i, 2i+1); we pair (i, i + d_k/2). Permuting the features maps one onto the other."""
    d_k = 8
    x = torch.randn(5, d_k, dtype=torch.float64)
    perm = torch.cat([torch.arange(0, d_k, 2), torch.arange(1, d_k, 2)])  # 0, 2, 4, 6, 1, 3, 5, 7
    interleaved = torch.empty_like(x)  # the paper's formula on neighbouring pairs
    m = torch.arange(5, dtype=torch.float64)[:, None]
    theta = 10000.0 ** (-torch.arange(d_k // 2, dtype=torch.float64) * 2 / d_k)
    a, b = x[:, 0::2], x[:, 1::2]
    interleaved[:, 0::2] = a * (m * theta).cos() - b * (m * theta).sin()
    interleaved[:, 1::2] = a * (m * theta).sin() + b * (m * theta).cos()
    # half-split feature i holds interleaved feature 2i, feature i + d_k/2 holds 2i + 1
    torch.testing.assert_close(apply_rotary(x[:, perm]), interleaved[:, perm])
    assert not torch.allclose(apply_rotary(x), interleaved)  # but the two conventions differ


def test_apply_rotary_base_changes_the_frequencies():
    x = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(apply_rotary(x, base=500.0), reference_rotary(x, torch.arange(3), base=500.0))
    assert not torch.allclose(apply_rotary(x, base=500.0), apply_rotary(x))


def test_apply_rotary_refuses_bad_input():
    with pytest.raises(ValueError, match="even d_k.*d_k=5"):
        apply_rotary(torch.randn(2, 3, 4, 5))
    with pytest.raises(ValueError, match=r"\(\.\.\., L, d_k\)"):
        apply_rotary(torch.randn(4))
    with pytest.raises(ValueError, match=r"shape \(L,\) = \(4,\), \(1, L\) or \(B, L\) = \(1, 4\) .*got \(3,\)"):
        apply_rotary(torch.randn(1, 4, 8), torch.arange(3))
    with pytest.raises(ValueError, match=r"\(B, L\) = \(2, 4\) .*got \(3, 4\)"):  # a batch of 3 positions for 2
        apply_rotary(torch.randn(2, 1, 4, 8), torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(L,\) = \(4,\), \(1, L\) for x of shape \(4, 8\), got \(2, 4\)"):
        apply_rotary(torch.randn(4, 8), torch.zeros(2, 4, dtype=torch.long))  # no batch dimension to match
    with pytest.raises(ValueError, match="interleaved must be True or False"):
        apply_rotary(torch.randn(4, 8), interleaved="yes")
    with pytest.raises(TypeError, match="integer tensor"):
        apply_rotary(torch.randn(4, 8), torch.arange(4.0))
    with pytest.raises(TypeError, match="integer tensor"):
        apply_rotary(torch.randn(4, 8), [0, 1, 2, 3])
    for base in (0.0, 1.0, -5, float("inf"), float("nan"), True, "10000"):
        with pytest.raises(ValueError, match="base must be a finite number above 1"):
            apply_rotary(torch.randn(4, 8), base=base)
    for dtype in (torch.int64, torch.bool):  # rotating integers would round the result away
        with pytest.raises(TypeError, match="floating-point"):
            apply_rotary(torch.zeros(4, 8, dtype=dtype))


# ---------------------------------------------------------------- neighbour pairing, per-sequence positions
def reference_rotary_neighbours(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """GPT-J's formulation of RoFormer's pairing (2i, 2i + 1): x * cos + rotate_every_two(x) * sin, with
    every angle repeated for the two features of its pair, in float64. ``positions`` ``(L,)`` or ``(B, L)``."""
    d_k = x.size(-1)
    inv_freq = 1.0 / base ** (torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)  # (d_k/2,)
    freqs = positions.double()[..., None] * inv_freq  # (..., L, d_k/2)
    if positions.dim() == 2:  # (B, L, d_k/2) -> (B, 1, ..., L, d_k/2)
        freqs = freqs.reshape(positions.size(0), *[1] * (x.dim() - 3), *freqs.shape[1:])
    sin, cos = freqs.sin().repeat_interleave(2, dim=-1), freqs.cos().repeat_interleave(2, dim=-1)  # (..., L, d_k)
    x = x.double()
    rotate_every_two = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)  # (-x1, x0, -x3, x2, ...)
    return x * cos + rotate_every_two * sin


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 5, 8), (1, 1, 1, 2), (4, 6, 16), (7, 64)])
def test_interleaved_rotary_matches_gpt_j(shape, dtype, device):
    x = torch.randn(*shape, dtype=torch.float64).to(device, dtype)
    positions = torch.randint(0, 1000, (shape[-2],))
    # float32 angles near 1000 radians are 6e-5 apart, and the rotation inherits that error
    tolerance = dict(atol=2e-4, rtol=1e-4) if dtype == torch.float32 else TOLERANCES[dtype]
    for base in (10000.0, 500000.0):
        out = apply_rotary(x, positions.to(device), base=base, interleaved=True)
        assert out.shape == x.shape and out.dtype == dtype and out.device == x.device
        expected = reference_rotary_neighbours(x.cpu(), positions, base).to(device, dtype)
        torch.testing.assert_close(out, expected, **tolerance)
    if shape[-1] > 2:  # one pair is both pairings at once
        assert not torch.allclose(apply_rotary(x, positions.to(device)), out, atol=1e-2)


def test_interleaved_rotary_turns_neighbours():
    """d_k = 4, interleaved: features (0, 1) turn by m, features (2, 3) by m / 100 (θ_1 = 10000^(-2/4))."""
    y = torch.zeros(1, 4, dtype=torch.float64)
    y[0, 0], y[0, 2] = 1.0, 1.0
    out = apply_rotary(y, torch.tensor([3]), interleaved=True)
    expected = [math.cos(3), math.sin(3), math.cos(0.03), math.sin(0.03)]
    torch.testing.assert_close(out, torch.tensor([expected], dtype=torch.float64))


@pytest.mark.parametrize("d_k", [2, 8, 64])
def test_rotary_permutation_converts_neighbour_pairing_to_half_split(d_k):
    perm = rotary_permutation(d_k)
    assert perm.dtype == torch.int64 and sorted(perm.tolist()) == list(range(d_k))
    x, positions = torch.randn(2, 3, 7, d_k, dtype=torch.float64), torch.randint(-50, 5000, (7,))
    interleaved = apply_rotary(x, positions, interleaved=True)
    torch.testing.assert_close(interleaved[..., perm], apply_rotary(x[..., perm], positions))
    back = torch.argsort(perm)
    torch.testing.assert_close(apply_rotary(x[..., perm], positions)[..., back], interleaved)
    if d_k > 2:  # the identity would not do
        assert not torch.allclose(interleaved, apply_rotary(x, positions))


def test_rotary_permutation_is_the_one_llama_checkpoints_are_converted_with():
    """Hugging Face's convert_llama_weights_to_hf.py permutes W_q's and W_k's rows, head by head, with
    ``w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)``."""
    H, d_k, D = 3, 8, 5
    rows = torch.arange(H * d_k, dtype=torch.float64)[:, None].expand(H * d_k, D)  # row r holds r
    hf = rows.reshape(H, d_k // 2, 2, D).transpose(1, 2).reshape(H * d_k, D)
    ours = (torch.arange(H)[:, None] * d_k + rotary_permutation(d_k)).flatten()  # head by head
    assert hf[:, 0].long().tolist() == ours.tolist()


def test_a_neighbour_paired_module_equals_a_half_split_one_with_permuted_rows():
    """The conversion of a checkpoint: permute each head's rows of W_q and W_k (and their biases)."""
    D, H, H_kv, L = 16, 4, 2, 6
    neighbours = MultiHeadAttention(D, H, num_kv_heads=H_kv, rotary=True, rope_interleaved=True).double().eval()
    halves = MultiHeadAttention(D, H, num_kv_heads=H_kv, rotary=True).double().eval()
    perm = rotary_permutation(D // H)
    state = dict(neighbours.state_dict())
    for name, heads in (("W_q", H), ("W_k", H_kv)):
        rows = (torch.arange(heads)[:, None] * (D // H) + perm).flatten()
        state[f"{name}.weight"], state[f"{name}.bias"] = state[f"{name}.weight"][rows], state[f"{name}.bias"][rows]
    halves.load_state_dict(state)
    x = torch.randn(2, L, D, dtype=torch.float64)
    (out_n, w_n), (out_h, w_h) = (m(x, x, x, causal_mask(L), return_weights=True) for m in (neighbours, halves))
    torch.testing.assert_close(out_h, out_n)
    torch.testing.assert_close(w_h, w_n)
    halves.load_state_dict(neighbours.state_dict())  # unconverted weights: another function
    assert not torch.allclose(halves(x, x, x, causal_mask(L)), out_n, atol=1e-3)


def test_per_sequence_positions_rotate_each_sequence_by_its_own():
    x = torch.randn(3, 2, 5, 8, dtype=torch.float64)  # (B, H, L, d_k)
    positions = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])  # (B, L)
    for interleaved in (False, True):
        out = apply_rotary(x, positions, interleaved=interleaved)
        for b in range(3):
            torch.testing.assert_close(out[b], apply_rotary(x[b], positions[b], interleaved=interleaved))
        reference = reference_rotary_neighbours(x, positions) if interleaved else torch.stack(
            [reference_rotary(x[b], positions[b]) for b in range(3)])
        torch.testing.assert_close(out, reference)
    for one_row in (positions[2:], positions[:1]):  # (1, L): shared by every sequence, as (L,) is
        torch.testing.assert_close(apply_rotary(x, one_row), apply_rotary(x, one_row[0]))
        torch.testing.assert_close(apply_rotary(x[0, 0], one_row), apply_rotary(x[0, 0], one_row[0]))
    with pytest.raises(ValueError, match=r"\(L,\) = \(5,\), \(1, L\) or \(B, L\) = \(3, 5\)"):
        apply_rotary(x, positions[:2])  # (2, L) for a batch of 3
    single_head = apply_rotary(x[:, 0], positions)  # (B, L, d_k): positions (B, L) fit too
    torch.testing.assert_close(single_head, apply_rotary(x, positions)[:, 0])
    assert not torch.allclose(apply_rotary(x, positions), apply_rotary(x))


# ---------------------------------------------------------------- rotary=True in the modules
def rotary_module_reference(module, x, positions, mask=None):
    """Self-attention with RoPE at ``positions`` (B, L) written out: project, split, rotate (the
    module's base and pairing, by the references above), attend with PyTorch's kernel, combine."""
    H, H_kv, d_k = module.num_heads, module.num_kv_heads, module.d_k
    q = module.W_q(x).unflatten(-1, (H, d_k)).transpose(1, 2)  # (B, H, L, d_k)
    k = module.W_k(x).unflatten(-1, (H_kv, d_k)).transpose(1, 2).repeat_interleave(H // H_kv, dim=1)
    v = module.W_v(x).unflatten(-1, (H_kv, d_k)).transpose(1, 2).repeat_interleave(H // H_kv, dim=1)
    if module.rope_interleaved:
        q, k = (reference_rotary_neighbours(t, positions, module.rope_base) for t in (q, k))
    else:
        q, k = (torch.stack([reference_rotary(t[b], positions[b], module.rope_base) for b in range(t.size(0))])
                for t in (q, k))
    heads = torch.nn.functional.scaled_dot_product_attention(q, k, v.double(), attn_mask=mask)
    return module.W_o(heads.transpose(1, 2).flatten(2))


def fused_copy(teaching: MultiHeadAttention) -> EfficientMultiHeadAttention:
    """An EfficientMultiHeadAttention built with the teaching module's RoPE settings, holding its weights."""
    fused = EfficientMultiHeadAttention(teaching.d_model, teaching.num_heads, num_kv_heads=teaching.num_kv_heads,
                                        rotary=True, rope_base=teaching.rope_base,
                                        rope_interleaved=teaching.rope_interleaved).double().eval()
    with torch.no_grad():
        fused.W_qkv.weight.copy_(torch.cat([teaching.W_q.weight, teaching.W_k.weight, teaching.W_v.weight]))
        fused.W_qkv.bias.copy_(torch.cat([teaching.W_q.bias, teaching.W_k.bias, teaching.W_v.bias]))
        fused.W_o.load_state_dict(teaching.W_o.state_dict())
    return fused


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("base", [10000.0, 500000.0, 100.0])
@pytest.mark.parametrize("kind", ["teaching", "efficient"])
def test_rope_base_pairing_and_positions_in_the_modules(kind, base, interleaved):
    B, L, D, H = 3, 6, 16, 4
    teaching = MultiHeadAttention(D, H, num_kv_heads=2, rotary=True, rope_base=base,
                                  rope_interleaved=interleaved).double().eval()
    module = teaching if kind == "teaching" else fused_copy(teaching)
    assert module.rope_base == base and module.rope_interleaved == interleaved
    x = torch.randn(B, L, D, dtype=torch.float64)
    per_sequence = torch.randint(-3, 3000, (B, L))
    arange = torch.arange(L).expand(B, L)
    shared = torch.randint(0, 3000, (1, L))  # Hugging Face's position_ids often come (1, L)
    for positions, given in ((arange, None), (arange, torch.arange(L)), (per_sequence, per_sequence),
                             (shared.expand(B, L), shared)):
        expected = rotary_module_reference(teaching, x, positions, causal_mask(L))
        torch.testing.assert_close(module(x, x, x, causal_mask(L), positions=given), expected)
    other = MultiHeadAttention(D, H, num_kv_heads=2, rotary=True, rope_base=base * 3,
                               rope_interleaved=not interleaved).double().eval()
    other.load_state_dict(teaching.state_dict())
    assert not torch.allclose(other(x, x, x), teaching(x, x, x), atol=1e-4)  # the settings change the function


def test_default_rope_settings_are_the_old_ones():
    torch.manual_seed(3)
    old = MultiHeadAttention(16, 4, rotary=True).double().eval()
    same = MultiHeadAttention(16, 4, rotary=True, rope_base=10000, rope_interleaved=False).double().eval()
    same.load_state_dict(old.state_dict())
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    assert old.rope_base == 10000.0 and not old.rope_interleaved and repr(old) == repr(same)
    assert torch.equal(old(x, x, x), same(x, x, x))
    assert torch.equal(old(x, x, x), old(x, x, x, positions=torch.arange(7)))
    torch.testing.assert_close(old(x, x, x), rotary_module_reference(old, x, torch.arange(7).expand(2, 7)))


@pytest.mark.parametrize("kind", ["teaching", "efficient"])
def test_a_left_padded_batch_with_positions_equals_each_sequence_alone(kind):
    """Hugging Face's recipe for batched generation: pad on the left, count positions from each
    sequence's first real token, block the pads; then decode with a cache, positions per sequence.
    (RoPE's scores depend on offsets only, so the default positions, one shift of these, give the same
    outputs; positions that are not one shift, such as two draft tokens at one position, do not.)"""
    D, H, lengths, longest, new = 16, 4, [5, 2, 4], 5, 3
    teaching = MultiHeadAttention(D, H, num_kv_heads=2, rotary=True, rope_base=500.0).double().eval()
    module = teaching if kind == "teaching" else fused_copy(teaching)
    tokens = [torch.randn(1, n + new, D, dtype=torch.float64) for n in lengths]  # prompt, then 3 new tokens
    alone = [module(t, t, t, causal_mask(t.size(1))) for t in tokens]  # (1, n + new, D) each
    padded = torch.zeros(len(lengths), longest, D, dtype=torch.float64)  # left padding: zeros first
    for b, (t, n) in enumerate(zip(tokens, lengths)):
        padded[b, longest - n:] = t[0, :n]
    real = padding_mask(lengths, max_len=longest).flip(-1)  # (B, 1, 1, L): True on the real tokens, at the right
    positions = (real[:, 0, 0].long().cumsum(-1) - 1).clamp(min=0)  # (B, L): 0, 0, 0, 1, 2 for a length of 3
    out = module(padded, padded, padded, real & causal_mask(longest), positions=positions)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(out[b, longest - n:], alone[b][0, :n])
    shifted = module(padded, padded, padded, real & causal_mask(longest))  # 0..L-1: each sequence shifted
    torch.testing.assert_close(shifted, out)
    reversed_positions = module(padded, padded, padded, real & causal_mask(longest), positions=positions.flip(-1))
    assert not torch.allclose(reversed_positions[0], out[0])  # the positions given are the ones used
    cache = KVCache()  # prefill, then one token at a time
    module(padded, padded, padded, real & causal_mask(longest), cache=cache, positions=positions)
    next_position = positions[:, -1:] + 1  # (B, 1)
    for step in range(new):
        x = torch.stack([t[0, n + step] for t, n in zip(tokens, lengths)])[:, None]  # (B, 1, D)
        keys = torch.cat([real, torch.ones(len(lengths), 1, 1, step + 1, dtype=torch.bool)], dim=-1)
        y = module(x, x, x, keys, cache=cache, positions=next_position)  # (B, 1, D)
        for b, n in enumerate(lengths):
            torch.testing.assert_close(y[b, 0], alone[b][0, n + step])
        next_position = next_position + 1



def rotary_reference(module, query, key, value, mask=None, rotate_values=False):
    """Project with the teaching module's weights, rotate q and k per head, attend, combine."""
    q, k, v = module.W_q(query), module.W_k(key), module.W_v(value)
    H, H_kv, d_k = module.num_heads, module.num_kv_heads, module.d_k
    q = q.unflatten(-1, (H, d_k)).transpose(1, 2)  # (B, H, Lq, d_k)
    k = k.unflatten(-1, (H_kv, d_k)).transpose(1, 2).repeat_interleave(H // H_kv, dim=1)
    v = v.unflatten(-1, (H_kv, d_k)).transpose(1, 2).repeat_interleave(H // H_kv, dim=1)
    q, k = reference_rotary(q, torch.arange(q.size(2))), reference_rotary(k, torch.arange(k.size(2)))
    if rotate_values:
        v = reference_rotary(v, torch.arange(v.size(2)))
    heads = torch.nn.functional.scaled_dot_product_attention(q, k, v.double(), attn_mask=mask)
    return module.W_o(heads.transpose(1, 2).flatten(2))


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("kind", ["teaching", "efficient"])
def test_rotary_modules_rotate_queries_and_keys_only(kind, num_kv_heads):
    teaching = MultiHeadAttention(16, 4, num_kv_heads=num_kv_heads, rotary=True).double().eval()
    module = teaching if kind == "teaching" else EfficientMultiHeadAttention.from_module(teaching)
    assert module.rotary and (module.num_kv_heads == num_kv_heads)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    memory = torch.randn(2, 9, 16, dtype=torch.float64)
    for query, key, mask in [(x, x, causal_mask(6)), (x, x, None), (x, memory, None)]:
        expected = rotary_reference(teaching, query, key, key, mask)
        out, weights = module(query, key, key, mask, return_weights=True)
        torch.testing.assert_close(module(query, key, key, mask), expected)
        torch.testing.assert_close(out, expected)
        assert weights.shape == (2, 4, 6, key.size(1))
        assert not torch.allclose(out, rotary_reference(teaching, query, key, key, mask, rotate_values=True))
    plain = MultiHeadAttention(16, 4, num_kv_heads=num_kv_heads).double().eval()
    plain.load_state_dict(teaching.state_dict())
    assert not plain.rotary and not torch.allclose(plain(x, x, x), teaching(x, x, x))  # the flag changes the function


def test_rotary_needs_an_even_head_size():
    for cls in (MultiHeadAttention, EfficientMultiHeadAttention):
        with pytest.raises(ValueError, match="rotary=True needs an even head size.*d_k=3"):
            cls(6, 2, rotary=True)
        assert cls(6, 2).d_k == 3  # without RoPE an odd d_k is fine
        assert "rotary=True" in repr(cls(8, 2, rotary=True))


# --- position biases added to the scores: ALiBi and T5 -------------------------------------


def test_alibi_slopes_follow_the_paper():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(h + 1) for h in range(8)]))
    assert torch.allclose(alibi_slopes(16), torch.tensor([2.0 ** (-0.5 * (h + 1)) for h in range(16)]))
    # not a power of two: the 4-head slopes, then every other slope of 8 heads
    assert torch.allclose(alibi_slopes(6), torch.tensor([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]))
    assert alibi_slopes(np.int64(4)).shape == (4,)
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)


def test_alibi_bias_depends_on_the_distance_only():
    bias = alibi_bias(4, 7)
    assert bias.shape == (4, 7, 7) and bias.dtype == torch.float32
    i, j = torch.arange(7)[:, None], torch.arange(7)[None, :]
    assert torch.equal(bias, -alibi_slopes(4)[:, None, None] * (i - j).abs().float() + 0.0)
    assert torch.equal(bias[:, 1:, 1:], bias[:, :-1, :-1])  # constant along every diagonal
    assert not torch.signbit(bias.diagonal(dim1=-2, dim2=-1)).any()  # 0, not -0, on the diagonal


def test_alibi_bias_as_a_float_mask_matches_pytorch():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).double().eval()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    bias = alibi_bias(4, 6).double().masked_fill(~causal_mask(6), float("-inf"))  # (H, L, L), causal
    q, k, v = (split_heads(W(x), 4) for W in (mha.W_q, mha.W_k, mha.W_v))
    expected = mha.W_o(combine_heads(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)))
    torch.testing.assert_close(mha(x, x, x, bias), expected)


def _t5_buckets_reference(relative, bidirectional, num_buckets=32, max_distance=128):
    """T5's bucketing, written out as the paper's code computes it, offset by offset."""
    out = torch.empty_like(relative)
    for index, n in enumerate(relative.flatten().tolist()):
        buckets, base = num_buckets, 0
        if bidirectional:
            buckets //= 2
            base = buckets if n > 0 else 0
            n = abs(n)
        else:
            n = max(-n, 0)
        exact = buckets // 2
        if n < exact:
            bucket = n
        else:
            bucket = min(exact + int(math.log(n / exact) / math.log(max_distance / exact) * (buckets - exact)), buckets - 1)
        out.view(-1)[index] = base + bucket
    return out


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_follow_the_paper_and_depend_on_the_offset_only(bidirectional):
    L = 200
    buckets = relative_position_buckets(L, bidirectional=bidirectional)
    positions = torch.arange(L)
    assert torch.equal(buckets, _t5_buckets_reference(positions[None, :] - positions[:, None], bidirectional))
    assert torch.equal(buckets[1:, 1:], buckets[:-1, :-1])
    assert buckets.min() == 0 and buckets.max() == 31  # all 32 buckets in use at L = 200
    table = torch.nn.Embedding(32, 4)  # one learned scalar per bucket and head
    bias = table(buckets).permute(2, 0, 1)  # (H, L, L), a float mask
    assert bias.shape == (4, L, L) and torch.equal(bias[:, 1:, 1:], bias[:, :-1, :-1])
