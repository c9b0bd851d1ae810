# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: -all
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 06 · Positions inside attention
#
# Chapter 02 ended on a problem: attention alone cannot tell "the dog bit the man" from "the man
# bit the dog". Shuffle the tokens and every output shuffles with them, nothing more. A model
# learns word order only if positions are put in from outside; chapter 02 added random vectors
# to show that this breaks the symmetry, and left open which vectors real models use. This
# chapter shows the three ways that are used: **added** positions, a vector per position summed
# into the embeddings before the first layer (the original transformer, and chapter 07's
# sentiment model); **rotary** positions (RoPE), which rotate every head's queries and keys
# inside every layer, the choice of LLaMA, Mistral, Qwen and most open language models today;
# and a **bias on the scores** that depends on the offset (T5; ALiBi in BLOOM and MPT).
#
# **By the end of this chapter you will be able to**
#
# - show with `mha_lib.MultiHeadAttention` that self-attention is permutation-equivariant, and
#   that adding positions breaks the symmetry;
# - build the sinusoidal table of *Attention Is All You Need* yourself, read its picture, and
#   say how it differs from a learned table of positions;
# - rotate queries and keys by their positions (RoPE) in a few lines, prove your version equals
#   `mha_lib.apply_rotary`, and name the pairing convention it uses;
# - prove, numerically, that a rotary score depends only on the offset `i - j`, that shifting
#   every position by the same amount changes nothing, and say why the values are never rotated;
# - use `MultiHeadAttention(..., rotary=True)` and say what it does differently, with the base,
#   the pairing and the positions (per sequence, for a left-padded batch) that other codebases use;
# - add a position bias to the scores (ALiBi's slopes, T5's buckets) as a float mask, and say
#   what RoPE's base is and what stretching positions does to a longer context.
#
# *Sources.* Sinusoidal positions: Vaswani et al., "Attention Is All You Need" (2017),
# section 3.5. Rotary positions: J. Su et al., "RoFormer: Enhanced Transformer with Rotary
# Position Embedding" (2021). The half-split pairing is the one of GPT-NeoX and of the
# Hugging Face implementations of LLaMA and Mistral (`rotate_half`); the neighbour pairing is
# RoFormer's and GPT-J's (`rotate_every_two`). Position biases: O. Press
# et al., "Train Short, Test Long: Attention with Linear Biases" (ALiBi, 2022); C. Raffel et al.,
# "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer" (T5,
# 2020). Longer contexts: S. Chen et al., "Extending Context Window of Large Language Models via
# Positional Interpolation" (2023); B. Peng et al., "YaRN" (2023). No positions: A. Kazemnejad
# et al., "The Impact of Positional Encoding on Length Generalization in Transformers" (2023).

# %% [markdown]
# ## Set-up
#
# As in every chapter: the device (`MHA_DEVICE=cpu` forces the CPU), the seed, random numbers
# drawn on the CPU and then moved.

# %%
import math

import matplotlib.pyplot as plt
import torch
from torch import nn

from mha_lib import (EfficientMultiHeadAttention, MultiHeadAttention, apply_rotary, causal_mask, combine_heads,
                     get_device, rotary_permutation, scaled_dot_product_attention, seed_everything,
                     sinusoidal_positions, split_heads)

# %config InlineBackend.figure_formats = ["retina"]  # figures at twice the pixels: sharp on any screen and in the web book
device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)
print("Running on:", device.type)

# %% [markdown]
# ## 1. Attention alone does not see order
#
# Chapter 02 proved it for one head; the same holds for the multi-head module, because every
# head is permutation-equivariant and the projections act on each token on its own. With `P`
# a permutation of the tokens, `MHA(P x) = P MHA(x)`: the outputs are the same numbers, moved.

# %%
d_model, H, L = 32, 4, 6
mha = MultiHeadAttention(d_model, H).to(device).eval()
x = torch.randn(1, L, d_model).to(device)  # (B, L, d_model): six "tokens"
perm = torch.tensor([5, 2, 0, 4, 1, 3])  # a shuffle of the six positions

with torch.no_grad():
    out = mha(x, x, x)  # (1, L, d_model)
    out_shuffled = mha(x[:, perm], x[:, perm], x[:, perm])
print("x:", tuple(x.shape), " output:", tuple(out.shape))
equivariant = torch.allclose(out_shuffled, out[:, perm], atol=1e-5)
assert equivariant
print("MHA(shuffled x) == MHA(x), shuffled (within 1e-5):", equivariant)

# %% [markdown]
# ## 2. Added positions: the sinusoidal table
#
# Vaswani et al. add to the embedding of the token at position `pos` a vector whose features
# come in pairs, a sine and a cosine of the same angle:
#
# $$PE_{pos,\,2i} = \sin\!\left(\frac{pos}{10000^{2i/d}}\right), \qquad
#   PE_{pos,\,2i+1} = \cos\!\left(\frac{pos}{10000^{2i/d}}\right).$$
#
# Pair `i` turns with the frequency $\omega_i = 10000^{-2i/d}$: the first pair once every
# $2\pi \approx 6.3$ positions, the last one so slowly that it hardly moves over a whole text.
# Here is the table in a few lines, checked against the course's `mha_lib.sinusoidal_positions`.

# %%
def sinusoidal_table(seq_len: int, d: int) -> torch.Tensor:
    """(seq_len, d): sines in the even features, cosines in the odd ones (d even)."""
    pos = torch.arange(seq_len, dtype=torch.float64)[:, None]  # (L, 1)
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,), the frequencies
    table = torch.stack([torch.sin(pos * omega), torch.cos(pos * omega)], dim=-1)  # (L, d/2, 2)
    return table.flatten(1).float()  # (L, d): sin, cos, sin, cos, ...


table = sinusoidal_table(100, 64)
print("table:", tuple(table.shape), " (positions, d_model)")
assert torch.allclose(table, sinusoidal_positions(100, 64), atol=1e-6)
print("our table == mha_lib.sinusoidal_positions (within 1e-6)")

# %% [markdown]
# Every column of the picture is one position's vector. The fast pairs at the top change from
# one position to the next; the slow ones at the bottom tell apart only positions far from each
# other. Together
# they give every position a different vector, for any length: the table is computed, not
# learned, so it has a row for position 10 000 as well.

# %%
fig, ax = plt.subplots(figsize=(8, 3.6))
image = ax.imshow(table.T.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
ax.set_xlabel("position")
ax.set_ylabel("feature (sin, cos, sin, ...)")
ax.set_title("Sinusoidal positions, d_model = 64: fast pairs at the top, slow ones at the bottom")
fig.colorbar(image, ax=ax, fraction=0.03, label="value of the feature")
plt.show()

# %% [markdown]
# Added to the embeddings, the table breaks the symmetry of section 1: the same words in
# another order now give different outputs, not the old ones moved around.

# %%
pe = sinusoidal_positions(L, d_model).to(device)  # (L, d_model)
with torch.no_grad():
    out_pos = mha(x + pe, x + pe, x + pe)
    xs = x[:, perm] + pe  # the words moved, the positions did not
    out_pos_shuffled = mha(xs, xs, xs)
still_equivariant = torch.allclose(out_pos_shuffled, out_pos[:, perm], atol=1e-5)
assert not still_equivariant
print("with positions added, MHA(shuffled) == MHA(x) shuffled:", still_equivariant)

# %% [markdown]
# The sines and cosines were chosen for a property Vaswani et al. point out: moving `k`
# positions on turns every pair by the angle $k\,\omega_i$, the same rotation whatever the
# starting position. So $PE_{pos+k}$ is a fixed linear function of $PE_{pos}$. Keep this in mind:
# RoPE is built on the same rotation.

# %%
k_shift = 7
omega = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)  # (32,)
c, s = torch.cos(k_shift * omega), torch.sin(k_shift * omega)
sin_pos, cos_pos = table[:90, 0::2].double(), table[:90, 1::2].double()  # (90, 32) each
moved = torch.stack([sin_pos * c + cos_pos * s, cos_pos * c - sin_pos * s], dim=-1).flatten(1)  # (90, 64)
assert torch.allclose(moved.float(), table[k_shift:k_shift + 90], atol=1e-5)
print(f"rotating every pair of PE[pos] by {k_shift}·ω_i gives PE[pos + {k_shift}], for pos = 0 .. 89")

# %% [markdown]
# **Learned positions** are the other kind of added position: an `nn.Embedding`
# with one trainable row per position, `max_len` rows in all. The model learns whatever vectors
# help, but has no row for a position at or past `max_len`. The sentiment model of chapter 07 uses one
# with 16 rows, BERT and GPT-2 one with 512 and 1024.

# %%
learned = nn.Embedding(16, d_model)  # max_len = 16 rows of d_model trainable numbers
print("learned position table:", tuple(learned.weight.shape), f"= {learned.weight.numel()} parameters")

# %% [markdown]
# Either way, added positions reach attention only through the projections. The score between
# a query at position `i` and a key at `j` is $(W_q(x_i + p_i)) \cdot (W_k(x_j + p_j))$ (summed
# over the heads, before the division by $\sqrt{d_k}$). It mixes what the tokens *are* with
# *where* they are, and depends on `i` and `j` themselves, not only on how far apart they are.
# Put the same two words four positions apart at the start of the sequence and again further
# on: the score changes.

# %%
def score_at(q_proj, k_proj, a, b, i, j, pe):
    """Score between word a at position i (query) and word b at position j (key), positions added."""
    return (q_proj(a + pe[i]) @ k_proj(b + pe[j])).item()


pe_long = sinusoidal_positions(64, d_model).to(device)
word_a, word_b = torch.randn(2, d_model).to(device)
with torch.no_grad():
    scores = [score_at(mha.W_q, mha.W_k, word_a, word_b, i, i - 4, pe_long) for i in (4, 20, 40)]
print("same two words, offset 4, at positions (4, 0), (20, 16), (40, 36):", [round(s, 3) for s in scores])
assert max(scores) - min(scores) > 0.1

# %% [markdown]
# ## 3. Rotary positions: rotate the queries and keys
#
# Su et al. ask for the opposite: a score that sees **only the offset** `i - j`. The idea fits
# in two dimensions. Rotate the query by the angle $i\theta$ and the key by $j\theta$. A rotation
# keeps lengths, and the angle between the two vectors changes by $(i - j)\theta$; so their dot
# product, $|q|\,|k| \cos(\text{angle})$, depends on `i - j` and nothing else:
#
# $$\big(R(i\theta)\,q\big) \cdot \big(R(j\theta)\,k\big) = q \cdot R\big((j - i)\theta\big)\,k.$$

# %%
def rotate_2d(v: torch.Tensor, angle: float) -> torch.Tensor:
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, -s], [s, c]], dtype=v.dtype) @ v


q2, k2, theta = torch.tensor([1.0, 2.0]), torch.tensor([0.5, -1.0]), 0.3
scores_2d = []
for i, j in [(3, 1), (10, 8), (52, 50)]:
    scores_2d.append(rotate_2d(q2, i * theta) @ rotate_2d(k2, j * theta))
    print(f"query at {i:2d}, key at {j:2d} (offset {i - j}): score {scores_2d[-1]:.4f}")
assert torch.allclose(torch.stack(scores_2d), scores_2d[0].expand(3), atol=1e-5)

# %% [markdown]
# A head's `d_k` features are cut into `d_k / 2` such pairs, and pair `i` turns with its own
# frequency $\theta_i = 10000^{-2i/d_k}$, the formula of the sinusoidal table with `d_k` in place
# of `d_model`. Which
# features form a pair is a convention. The course uses the **half-split** one: pair `i` is
# features `i` and `i + d_k/2`, as in GPT-NeoX and Hugging Face's LLaMA and Mistral code, the
# code you are most likely to read. (RoFormer's paper pairs neighbours, `2i` and `2i + 1`; more
# on that below.)
#
# A pair `(a, b)` is also the complex number `a + b·j` (here `j = √-1`, not a position), and
# rotating it by $m\theta$ is multiplying it by $e^{\,j m\theta}$. That gives a short version to
# check the course's `mha_lib.apply_rotary` with.

# %%
def rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """(..., L, d_k) -> (..., L, d_k): pair (i, i + d_k/2) at position m turned by m·θ_i."""
    half = x.size(-1) // 2
    theta = base ** (-torch.arange(half, dtype=torch.float64) * 2 / x.size(-1))  # (d_k/2,)
    turn = torch.polar(torch.ones(len(positions), half, dtype=torch.float64),
                       positions.double()[:, None] * theta)  # (L, d_k/2): e^{i m θ}
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * turn.to(x.device)  # (..., L, d_k/2)
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


B, d_k = 2, 16
q = torch.randn(B, H, L, d_k).to(device)  # (B, H, L, d_k), as after split_heads
positions = torch.arange(L)
assert torch.allclose(rope(q, positions), apply_rotary(q), atol=1e-5)
assert torch.allclose(rope(q, positions + 9), apply_rotary(q, positions + 9), atol=1e-5)
print("q:", tuple(q.shape), " rotated:", tuple(apply_rotary(q).shape))
print("our rope == mha_lib.apply_rotary, with positions 0..5 and 9..14 (within 1e-5)")
lengths_kept = torch.allclose(apply_rotary(q).norm(dim=-1), q.norm(dim=-1), atol=1e-5)
position_0_unchanged = torch.allclose(apply_rotary(q)[..., 0, :], q[..., 0, :])
print("every vector keeps its length:", lengths_kept, "  position 0 is not turned:", position_0_unchanged)
assert lengths_kept and position_0_unchanged

# %% [markdown]
# ## 4. The score depends only on the offset
#
# Now the property itself. Give every position the **same** query vector and the same key
# vector, rotate them by their positions, and compute all `L × L` scores. Without positions,
# every score would be the same number. With RoPE, the score of `(i, j)` depends on `i - j`
# only: the matrix is constant along each diagonal.

# %%
L_long = 12
q_one, k_one = torch.randn(2, d_k).to(device)  # one query, one key
q_rot = apply_rotary(q_one.expand(1, 1, L_long, d_k))  # (1, 1, L, d_k): the query at every position
k_rot = apply_rotary(k_one.expand(1, 1, L_long, d_k))
S = (q_rot @ k_rot.transpose(-2, -1))[0, 0]  # (L, L): S[i, j] = score of query at i, key at j
constant_diagonals = torch.allclose(S[1:, 1:], S[:-1, :-1], atol=1e-5)  # S[i+1, j+1] == S[i, j]
print("S:", tuple(S.shape), " constant along every diagonal:", constant_diagonals)
assert constant_diagonals
print("first row (query at 0, keys at 0..5):", S[0, :6].cpu())

# %% [markdown]
# The stronger statement: shift **every** position by the same amount, for queries and keys
# with different vectors at each position, and no score changes. Through its scores, a rotary
# layer sees how the tokens lie relative to each other, not where in a long text they sit.

# %%
q64, k64 = q.double(), torch.randn(B, H, L, d_k, dtype=torch.float64).to(device)  # float64: rounding stays far below 1e-8
scores_0 = apply_rotary(q64) @ apply_rotary(k64).transpose(-2, -1)  # (B, H, L, L), positions 0..5
for shift in (1, 100, 10_000):
    moved = apply_rotary(q64, positions + shift) @ apply_rotary(k64, positions + shift).transpose(-2, -1)
    assert torch.allclose(moved, scores_0, atol=1e-8)
print("scores:", tuple(scores_0.shape), " unchanged when all positions move by 1, 100 and 10 000 (within 1e-8)")

# %% [markdown]
# What does RoPE do to the scores as the offset grows? Take a query and a key that point the same
# way (all ones, `d_k = 64`): at offset 0 the score is `64`. As the offset grows, the fast pairs
# turn away and stop contributing, while the slow pairs still agree; the score falls and
# oscillates lower, which Su et al. call the *long-term decay*. For a random pair of vectors there
# is no such trend to expect (its score averages 0 over random draws, at every offset); one draw
# just wanders around 0 with the offset.

# %%
d_plot, max_offset = 64, 512
offsets = torch.arange(max_offset + 1)  # the query sits at position i = offset, the key at j = 0
ones = torch.ones(1, 1, max_offset + 1, d_plot, dtype=torch.float64)  # (1, 1, 513, 64)
same_way = (apply_rotary(ones, offsets) @ torch.ones(d_plot, dtype=torch.float64))[0, 0]  # (513,)
q_r, k_r = torch.randn(2, d_plot, dtype=torch.float64)  # a key at 0 is not turned: k_r as it is
random_pair = (apply_rotary(q_r.expand(1, 1, max_offset + 1, d_plot), offsets) @ k_r)[0, 0]  # (513,)

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [1, 1.6]})
image = left.imshow(S.cpu().numpy(), cmap="RdBu")
left.set_title("one q and one k at every position:\nthe score S[i, j] depends on i - j only")
left.set_xlabel("key position j")
left.set_ylabel("query position i")
fig.colorbar(image, ax=left, fraction=0.046, label="score S[i, j]")
right.plot(offsets, same_way, label="q = k = all ones")
right.plot(offsets, random_pair, label="a random q and k", alpha=0.7)
right.axhline(0, color="grey", lw=0.5)
right.set_xlabel("offset i - j")
right.set_ylabel("score q·k after RoPE")
right.set_title("the score over the offset (d_k = 64)")
right.legend()
plt.tight_layout(w_pad=4)
plt.show()

# %%
print(f"all ones: score {same_way[0]:.1f} at offset 0, on average {same_way[128:].mean():.1f} over offsets 128..512")
assert abs(same_way[0] - d_plot) < 1e-9 and same_way[128:].mean() < 0.6 * d_plot

# %% [markdown]
# ## 5. Two pairings, one idea
#
# The interleaved pairing of the RoFormer paper, GPT-J and Meta's original LLaMA code (features
# `2i` and `2i + 1`) gives the same offset property. The two are the same rotation of
# differently ordered features: reorder the features so that neighbours become `(i, i + d_k/2)`
# (evens first, then odds: `mha_lib.rotary_permutation(d_k)`), rotate half-split, order them
# back, and you get the interleaved rotation, which `apply_rotary(x, interleaved=True)` computes
# directly. For one model they are **not** interchangeable: weights trained with one pairing give
# wrong scores with the other. Converting a checkpoint between them means permuting each head's
# rows of `W_q` and `W_k` once, which is what conversion scripts do (Hugging Face's LLaMA
# converter does exactly this permutation); `MultiHeadAttention(..., rotary=True,
# rope_interleaved=True)` runs such a checkpoint unconverted.

# %%
def rope_interleaved(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """RoFormer's pairing: features (2i, 2i + 1) turned by m·θ_i."""
    half = x.size(-1) // 2
    theta = 10000.0 ** (-torch.arange(half, dtype=torch.float64) * 2 / x.size(-1))
    angle = positions.double()[:, None] * theta  # (L, d_k/2)
    angle = angle.to(x.device)
    a, b = x[..., 0::2].double(), x[..., 1::2].double()  # neighbours
    rotated = torch.stack([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], dim=-1)
    return rotated.flatten(-2).to(x.dtype)  # (..., L, d_k), neighbours again


to_half_split = rotary_permutation(d_k)  # evens first, then odds
print("rotary_permutation(16):", to_half_split.tolist())
back = torch.argsort(to_half_split)
same_rotation = torch.allclose(apply_rotary(q[..., to_half_split])[..., back], rope_interleaved(q, positions), atol=1e-5)
differ = not torch.allclose(apply_rotary(q), rope_interleaved(q, positions), atol=1e-3)
print("interleaved == half-split on reordered features:", same_rotation, "  but not on the same features:", differ)
library = torch.allclose(apply_rotary(q, positions, interleaved=True), rope_interleaved(q, positions), atol=1e-5)
print("our rope_interleaved == apply_rotary(..., interleaved=True) (within 1e-5):", library)
assert same_rotation and differ and library

# %% [markdown]
# ## 6. RoPE inside the module, and why the values stay as they are
#
# `MultiHeadAttention(d_model, num_heads, rotary=True)` rotates the queries and keys of every
# head right after `split_heads`, each by its position `0 .. L-1`, and leaves the values alone.
# Its forward pass, written out and compared with the module:

# %%
rot = MultiHeadAttention(d_model, H, rotary=True).to(device).eval()
print("rotary:", rot.rotary, " num_heads:", rot.num_heads, " d_k:", rot.d_k)
with torch.no_grad():
    q_h = apply_rotary(split_heads(rot.W_q(x), H))  # (B, H, L, rot.d_k), rotated
    k_h = apply_rotary(split_heads(rot.W_k(x), H))  # (B, H, L, rot.d_k), rotated
    v_h = split_heads(rot.W_v(x), H)  # (B, H, L, rot.d_k), NOT rotated
    heads, _ = scaled_dot_product_attention(q_h, k_h, v_h)  # (B, H, L, rot.d_k)
    by_hand = rot.W_o(combine_heads(heads))  # (B, L, d_model)
    from_module = rot(x, x, x)
assert torch.allclose(by_hand, from_module, atol=1e-5)
print("q, k per head:", tuple(q_h.shape), " output:", tuple(from_module.shape))
print("hand-written rotary forward == MultiHeadAttention(rotary=True) (within 1e-5)")

# %% [markdown]
# `EfficientMultiHeadAttention`, the fused module chapter 10 builds, takes the same
# `rotary=True`, and `from_module` carries it over with the weights, so the fused module computes the same rotary function:

# %%
fused = EfficientMultiHeadAttention.from_module(rot).eval()
with torch.no_grad():
    same_function = torch.allclose(fused(x, x, x), from_module, atol=1e-5)
assert fused.rotary and same_function
print("EfficientMultiHeadAttention.from_module(rot): rotary =", fused.rotary, "  same outputs (within 1e-5):",
      same_function)

# %% [markdown]
# Positions are needed to decide **where to look**, and that is all the scores do. The values are
# **what gets handed over**: if they were rotated, the same token would hand over a different
# vector depending on where it sits, and the output would carry absolute positions again.
# The experiment: number the same six tokens `100 .. 105` instead of `0 .. 5`. With the values
# left alone (the module's way) the heads' outputs do not change, since the scores of section 4
# do not; with the values rotated too, they do.

# %%
def rotary_heads(q_h, k_h, v_h, positions, rotate_values):
    """(B, H, L, d_k) each -> (B, H, L, d_k): attention with RoPE at the given positions."""
    v_h = apply_rotary(v_h, positions) if rotate_values else v_h
    return scaled_dot_product_attention(apply_rotary(q_h, positions), apply_rotary(k_h, positions), v_h)[0]


with torch.no_grad():
    q_raw, k_raw = split_heads(rot.W_q(x), H), split_heads(rot.W_k(x), H)  # (B, H, L, d_k), not rotated
    for rotate_values in (False, True):
        at_0 = rotary_heads(q_raw, k_raw, v_h, positions, rotate_values)
        at_100 = rotary_heads(q_raw, k_raw, v_h, positions + 100, rotate_values)
        unchanged = torch.allclose(at_0, at_100, atol=1e-5)
        assert unchanged == (not rotate_values)
        print(f"values rotated: {rotate_values!s:5}  output the same at positions 0..5 and 100..105: {unchanged}")

# %% [markdown]
# And the rotary module sees order: shuffle the tokens and the outputs are no longer the old
# ones moved around. Unlike added positions, nothing was added to the embeddings.

# %%
with torch.no_grad():
    out_rot = rot(x, x, x)
    out_rot_shuffled = rot(x[:, perm], x[:, perm], x[:, perm])
sees_order = not torch.allclose(out_rot_shuffled, out_rot[:, perm], atol=1e-5)
assert sees_order
print("rotary MHA(shuffled x) differs from MHA(x) shuffled:", sees_order)

# %% [markdown]
# `apply_rotary` takes the positions as an argument because they are not always `0 .. L-1`. A
# model that generates text one token at a time has seen `T` tokens already, and the new one sits
# at position `T`, not 0; with a cache of `T` tokens (chapter 11), the module rotates the new ones
# by `arange(T, T + n)` itself. And a batch of prompts of different lengths is usually padded on
# the **left**, so that every prompt ends in the last column and the next tokens line up; each
# sequence then counts its positions from its own first real token. The module takes them as
# `forward(..., positions=...)`, `(L,)` or one row per sequence `(B, L)` (Hugging Face's
# `position_ids`), and its base as `rope_base` (Hugging Face's `rope_theta`: 500 000 in
# LLaMA 3). Below, the second sequence has two pad tokens in front; at its four real tokens the
# batch gives what the sequence gives alone:

# %%
x_pair = torch.randn(2, L, d_model).to(device)  # (B, L, d_model); sequence 1: 2 pads, then 4 tokens
real = torch.tensor([[True] * L, [False, False] + [True] * (L - 2)], device=device)  # (B, L)
positions_pad = (real.long().cumsum(-1) - 1).clamp(min=0)  # (B, L): 0..5 and 0, 0, 0, 1, 2, 3
print("positions per sequence:", positions_pad.tolist())
llama3 = MultiHeadAttention(d_model, H, rotary=True, rope_base=500_000).to(device).eval()
with torch.no_grad():
    batched = llama3(x_pair, x_pair, x_pair, real[:, None, None, :] & causal_mask(L, device=device),
                     positions=positions_pad)  # (B, L, d_model)
    alone = llama3(x_pair[1:, 2:], x_pair[1:, 2:], x_pair[1:, 2:], causal_mask(L - 2, device=device))
same_as_alone = torch.allclose(batched[1, 2:], alone[0], atol=1e-5)
print("left-padded sequence, its real tokens == the sequence alone (within 1e-5):", same_as_alone)
assert same_as_alone

# %% [markdown]
# With RoPE alone, the default positions `0 .. L-1` would give the same numbers here: they
# shift each sequence by a constant, which section 4 showed changes no score. Positions that are
# not such a shift do matter (two candidate tokens at one position, a model with added
# positions), and the module takes whatever it is given.

# %% [markdown]
# ## 7. Positions as a bias on the scores: ALiBi and T5
#
# The third way leaves the queries, keys and embeddings alone and **adds a number to each score**
# that depends on the offset `i - j`: exactly a float mask, one `(L, L)` pattern per head, which
# the course's modules already take (per-head masks in chapter 04, float masks in chapter 05).
# Two recipes:
#
# - **ALiBi** (BLOOM, MPT): `bias[h, i, j] = -m_h · |i - j|`, a penalty that grows with the
#   distance, with a fixed slope per head from the geometric sequence `2^(-8/H), 2^(-16/H), …`:
#   some heads look far, others near. Nothing is learned. The paper defines it for decoders
#   (keys `j ≤ i`); `|i - j|` extends it to keys after the query, for encoders.
# - **T5** (an encoder–decoder): 32 buckets of offsets. Its encoder (bidirectional) gives 16 to
#   keys before the query and 16 to keys after; its decoder, causal, needs only keys before, so
#   all 32 go to one side. Small offsets get a bucket each (0 to 7 in a bidirectional half, 0 to
#   15 one-sided); past them, the buckets' boundaries form a geometric sequence from 8 (16
#   one-sided) towards 128, each boundary √2 times the last (2^(3/16) ≈ 1.14 one-sided), rounded up,
#   so the widths grow geometrically too; and the last bucket takes everything from its own start
#   on: from 91 bidirectional, from 113 one-sided, not from 128. Each head *learns* one
#   number per bucket, and the table is learned once and shared by every layer.
#
# `mha_lib.alibi_bias(H, L)` and `mha_lib.relative_position_buckets(L)` build them; first, where
# each of T5's buckets starts (the smallest distance `i - j` to a key before the query that falls in it):

# %%
from mha_lib import alibi_bias, relative_position_buckets

distance = torch.arange(200)  # keys 0..199 before a query at 199
for bidirectional in (True, False):
    bucket_of = relative_position_buckets(200, bidirectional=bidirectional)[199].flip(0)  # (200,): by distance
    starts = [int(distance[bucket_of == b].min()) for b in bucket_of.unique()]
    print(f"{'encoder (bidirectional)' if bidirectional else 'decoder (one-sided)':24s} bucket starts:", starts)
    assert starts[-1] == (91 if bidirectional else 113)

L_bias = 10
alibi = alibi_bias(H, L_bias)  # (H, L, L) float
print("ALiBi slopes per head:", [f"{m:.4f}" for m in (-alibi[:, 1, 0]).tolist()])
torch.manual_seed(0)
buckets = relative_position_buckets(L_bias)  # (L, L) int: the bucket of key j's offset from query i
t5_table = nn.Embedding(32, H)  # one learned scalar per bucket and head (random here)
t5_bias = t5_table(buckets).permute(2, 0, 1).detach()  # (H, L, L) float
print("T5 buckets, query 9, keys 0..9:", buckets[9].tolist())
for name, bias in (("ALiBi", alibi), ("T5", t5_bias)):
    assert torch.equal(bias[:, 1:, 1:], bias[:, :-1, :-1])  # constant along every diagonal
    print(f"{name:5s} bias {tuple(bias.shape)}: depends on i - j only (constant diagonals)")

# %% [markdown]
# What does the bias do on its own? Where the queries and keys give every key the same score,
# the weights are the softmax of the bias alone. With a causal mask, as in the decoders that
# use ALiBi (`-inf` above the diagonal, the penalty below), each head's slope sets how fast its
# weight falls off with the distance. With 8 heads (slopes 1/2 to 1/256) and 32 tokens, the
# last query's weight on each earlier key:

# %%
H_alibi, L_alibi = 8, 32
alibi_8 = alibi_bias(H_alibi, L_alibi)  # (8, 32, 32)
causal = causal_mask(L_alibi)
causal_alibi = alibi_8.masked_fill(~causal, float("-inf"))  # (H, L, L): a float mask for any module
bias_only = torch.softmax(causal_alibi, dim=-1)  # the weights when all scores are equal
last = bias_only[:, -1].flip(-1)  # (H, L): the last query's weight by distance 0..31
fig, ax = plt.subplots(figsize=(7, 3.6))
for h in range(H_alibi):
    ax.plot(range(L_alibi), last[h], marker=".", ms=3, label=f"head {h}: slope 1/{round(-1 / alibi_8[h, 1, 0].item())}")
ax.axhline(1 / L_alibi, color="grey", lw=0.8, ls="--", label="uniform, 1/32")
ax.set(yscale="log", ylim=(1e-4, 1), xlabel="distance i - j to the key", ylabel="weight of the last query",
       title="ALiBi alone, causal, 8 heads: near heads and far heads")
ax.legend(fontsize=7, ncol=2)
plt.tight_layout()
plt.show()
own, near = bias_only[:, -1, -1], last[:, :4].sum(-1)  # weight on itself; on the 4 nearest keys
print("weight on itself:     ", [f"{w:.2f}" for w in own.tolist()], "(uniform 0.03)")
print("weight on 4 nearest:  ", [f"{w:.2f}" for w in near.tolist()])
assert torch.all(own[:-1] > own[1:]) and own[0] > 0.35 and own[-1] < 0.04  # from near to almost uniform
x_bias = torch.randn(1, L_alibi, d_model).to(device)  # (B, L, d_model)
with torch.no_grad():  # the modules take the bias as it is, as a per-head float mask
    out_alibi = MultiHeadAttention(d_model, H_alibi).to(device).eval()(x_bias, x_bias, x_bias, causal_alibi.to(device))
print("MultiHeadAttention with the ALiBi mask:", tuple(x_bias.shape), "->", tuple(out_alibi.shape))

# %% [markdown]
# The first head puts 0.39 of its weight on the token itself and 0.86 on the four nearest; the
# last is close to uniform. A trained model learns queries and keys that add their own
# preferences on top of these fixed slopes.
#
# **What a dense bias costs.** Handed over as an `(H, L, L)` float mask, the bias takes
# `H · L²` numbers: 8 heads at 4096 tokens are 134 M floats, 512 MiB in float32, per call. That
# undoes part of ALiBi's point, a bias computed from `m_h · (i - j)` at no memory cost: fused
# kernels (FlashAttention's `alibi_slopes`, PyTorch's `flex_attention` with a `score_mod`) take
# the slopes and compute each bias where the score is computed. T5 is similar: its learned table
# is tiny (`32 × H` numbers, shared by every layer), but the `(H, L, L)` bias it is looked up into is not.
#
# A fourth answer is **no positions at all** (NoPE): a causal decoder can infer positions from
# the mask alone, since token `i` sees exactly `i + 1` tokens. Kazemnejad et al. (2023) found
# that such models generalised to longer inputs *better* than ones with sinusoidal, rotary,
# ALiBi or T5 positions, on their small reasoning and arithmetic tasks. An encoder, whose tokens
# all see each other, has no such cue.

# %% [markdown]
# ## 8. RoPE's base, and longer contexts
#
# RoPE's angles are `m · θ_i` with `θ_i = base^(-2i/d_k)`: the base (10 000 in the paper; 500 000
# in LLaMA 3) sets the slowest frequency, `base^(-(d_k-2)/d_k)`, and so the distance over which
# the slowest pair has not yet turned once. A model trained on 4096 tokens has seen the slow
# pairs' angles only up to `4096 · θ_i`; at 16 384 tokens they reach angles it never saw.
# Three ways to stretch a model by a factor `s` (here 4):
#
# - **Position interpolation** divides the positions by `s`, so a longer text reuses the trained
#   range of angles, squeezed: every pair, fast or slow, turns `s` times slower.
# - **NTK-aware scaling** (named after the neural tangent kernel) raises the base instead, to
#   `base · s^(d_k/(d_k-2))`: the fastest pair is untouched and only the slowest one is slowed by
#   exactly `s`; the pairs between are slowed by less, so most slow pairs still pass the angles
#   they were trained on (measured below).
# - **YaRN** (Peng et al., 2023; "NTK-by-parts" plus a temperature) decides pair by pair from
#   `r = trained length / wavelength` (the number of turns in the trained length, wavelength
#   `2π / θ_i`): pairs with `r > β = 32` are left alone, pairs with `r < α = 1` (a wavelength
#   longer than the trained text) are interpolated, `θ_i / s`, and a linear ramp in `r` blends
#   the two between. It also sharpens the softmax: the scores are multiplied by `1/t` with
#   `√(1/t) = 0.1 ln s + 1` (1.139 for `s = 4`, so `1/t = 1.296`).
#
# In the plot, pairs above the grey line turned at least once within the trained length and
# have seen every angle; only the pairs below it meet new angles when the text grows.

# %%
d_rope, trained, stretch = 128, 4096, 4
pairs = torch.arange(d_rope // 2, dtype=torch.float64)
theta = 10000.0 ** (-2 * pairs / d_rope)  # (64,)
theta_ntk = (10000.0 * stretch ** (d_rope / (d_rope - 2))) ** (-2 * pairs / d_rope)
turns = trained * theta / (2 * math.pi)  # r: turns within the trained length = trained length / wavelength
ramp = ((turns - 1) / (32 - 1)).clamp(0, 1)  # YaRN's γ: 0 below α = 1 turn, 1 above β = 32 turns
theta_yarn = (1 - ramp) * theta / stretch + ramp * theta  # interpolated, blended, or left alone
longest = trained * stretch
reach = {"trained, 4096 tokens": trained * theta, "no change, 16 384 tokens": longest * theta,
         "interpolated positions": longest / stretch * theta, "NTK-aware base": longest * theta_ntk,
         "YaRN (NTK-by-parts)": longest * theta_yarn}
fig, ax = plt.subplots(figsize=(8, 3.6))
for (name, angle), style in zip(reach.items(), ("k-", "r--", "b:", "g-.", "m:")):
    ax.plot(pairs, angle, style, label=name)
ax.set(yscale="log", xlabel="pair i (fast to slow)", ylabel="largest angle m·θ_i (radians)",
       title="The angles a longer context reaches, and three ways to stretch RoPE")
ax.axhline(2 * math.pi, color="grey", lw=0.5, label="one full turn (2π)")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()
assert torch.allclose(reach["interpolated positions"], reach["trained, 4096 tokens"])
slowest = d_rope // 2 - 1
print(f"slowest pair: {reach['trained, 4096 tokens'][slowest]:.3f} rad trained, "
      f"{reach['no change, 16 384 tokens'][slowest]:.3f} unchanged, {reach['NTK-aware base'][slowest]:.3f} with NTK")
print(f"fastest pair with NTK / unchanged: {theta_ntk[0] / theta[0]:.2f} (untouched); "
      f"slowest: {theta_ntk[slowest] / theta[slowest]:.2f} (= 1/{stretch})")
assert abs(theta_ntk[slowest] * stretch - theta[slowest]) < 1e-12
slow = turns < 1  # the pairs that had not turned once within 4096 tokens
past = reach["NTK-aware base"][slow] > reach["trained, 4096 tokens"][slow] * (1 + 1e-9)
ratio = (reach["NTK-aware base"] / reach["trained, 4096 tokens"])[slow]
print(f"slow pairs (under one turn in 4096 tokens): {int(slow.sum())} of {d_rope // 2}, pairs {int(pairs[slow][0])}..{slowest}")
print(f"NTK-aware at 16 384 tokens: {int(past.sum())} of them pass their trained angle, by up to {ratio.max():.2f}x")
yarn_past = reach["YaRN (NTK-by-parts)"] > reach["trained, 4096 tokens"] * (1 + 1e-9)
print(f"YaRN: {int((turns > 32).sum())} pairs left alone, {int(((turns >= 1) & (turns <= 32)).sum())} on the ramp, "
      f"{int(slow.sum())} interpolated; slow pairs past their trained angle: {int(yarn_past[slow].sum())}")
print(f"YaRN's temperature for s = {stretch}: sqrt(1/t) = {0.1 * math.log(stretch) + 1:.3f}, "
      f"scores x {(0.1 * math.log(stretch) + 1) ** 2:.3f}")
assert int(slow.sum()) == 18 and int(past.sum()) == 17 and not yarn_past[slow].any()

# %% [markdown]
# So NTK-aware scaling does **not** keep a longer context's angles in the trained range: 17 of
# the 18 slow pairs still reach angles up to 1.45 times beyond anything seen in training; only
# the slowest is brought back exactly. Its gain is elsewhere: the fast pairs (fine local order)
# are left almost as trained, where interpolation squeezes them too. Interpolation keeps every
# angle in the trained range but squeezes neighbouring positions closer (a model needs a little
# fine-tuning to read them apart). YaRN takes the best of both per pair: the fast pairs exactly as
# trained, the slow ones interpolated back into range. All three change only `θ`, the positions
# and (YaRN) a scale on the scores, never the weights.

# %% [markdown]
# ## Recap
#
# - Self-attention is **permutation-equivariant**: `MHA(P x) = P MHA(x)`. Order has to be put
#   in from outside.
# - **Added positions**: a vector per position summed into the embeddings, either the
#   **sinusoidal** table of Vaswani et al. (pairs of sin and cos at frequencies
#   $10000^{-2i/d}$, computed for any length) or a **learned** table (`nn.Embedding(max_len, d)`,
#   the trained models of chapters 07 and 08). The scores then depend on the absolute positions `i` and `j`.
# - **RoPE** rotates each head's queries and keys, pair of features by pair of features, by
#   `position · θ_i`. The score depends on the **offset `i - j` only**; shifting every position by
#   a constant changes nothing; lengths are kept; the values are **never** rotated.
# - `mha_lib.apply_rotary(x, positions=None)` uses the **half-split** pairing `(i, i + d_k/2)`
#   (GPT-NeoX, Hugging Face LLaMA); RoFormer's and GPT-J's interleaved pairing
#   (`interleaved=True`, `rope_interleaved=True` in the modules) is the same rotation on
#   reordered features (`rotary_permutation(d_k)`): weights carry over only after permuting the
#   rows of `W_q` and `W_k`, head by head.
# - `MultiHeadAttention(d_model, H, rotary=True)` (and the efficient module) apply it after
#   `split_heads`.
# - **A bias on the scores**: ALiBi (`-m_h · |i - j|`, fixed slopes per head, from near heads to
#   almost uniform ones) and T5 (a learned number per head and offset bucket, one table for all
#   layers; bidirectional in the encoder, one-sided in the decoder, the last bucket from 91) are
#   float masks `(H, L, L)` (`mha_lib.alibi_bias`, `mha_lib.relative_position_buckets`), which
#   cost `H · L²` numbers where fused kernels compute the bias on the fly; a causal decoder can
#   also do without positions (NoPE).
# - RoPE's **base** sets its slowest frequency (`MultiHeadAttention(..., rope_base=...)`);
#   `forward(..., positions=...)` takes each sequence's positions, `(L,)` or `(B, L)` (left
#   padding). To stretch a context by `s`: position interpolation keeps every angle in the
#   trained range by slowing every pair; NTK-aware scaling slows mostly the slow pairs but does
#   not bring them back in range (17 of 18 still pass their trained angle at d 128, 4096 → 16 384);
#   YaRN leaves the fast pairs, interpolates those whose wavelength exceeds the trained length,
#   ramps between, and sharpens the softmax by `1/t`, with `√(1/t) = 0.1 ln s + 1`.
#
# ## Exercises
#
# Practise what this chapter built in `exercises/06_positions_inside_attention.ipynb`: write
# `apply_rotary` yourself, then one rotary attention step, then ALiBi's bias `alibi_bias` with
# the paper's slopes; each exercise checks itself and tells you what is wrong. See the README for
# how to start your own copy.
#
# ## What comes next
#
# **Chapter 07** puts multi-head attention to work: an encoder layer, a small sentiment model
# trained in seconds on sentences full of negations ("not bad"), with the learned position table
# of this chapter, and what each of its heads learned to attend to, measured over many seeds.
# **Chapter 08** stacks two layers and shows heads that work *together*: induction heads.
