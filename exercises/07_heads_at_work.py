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
# # Exercises · Chapter 07 · Heads at work
#
# Two exercises: the forward pass of a pre-norm encoder layer, and head ablation, the tool
# chapter 07 used to find out what each head is for.
#
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=07`, or `.venv/bin/python -m mha_course start 07`; see the README), so that
# updates to the course never overwrite your work.

# %%
import torch
from torch import nn

from mha_lib import MultiHeadAttention, combine_heads, scaled_dot_product_attention, split_heads
from mha_lib.checks import check_encoder_layer, check_head_ablation

# %% [markdown]
# ## Exercise 7.1 · The encoder layer's forward pass
#
# The `__init__` below is complete. Write `forward(x, mask=None)` for the **pre-norm** layer of
# chapter 07:
#
# 1. `h = norm1(x)`; `x = x + self_attn(h, h, h, mask=mask)` (self-attention, with a residual);
# 2. `x = x + feed_forward(norm2(x))` (the position-wise network, with a residual);
# 3. return `x`, shape `(B, L, d_model)`.
#
# (Chapter 07's `mha_lib.EncoderLayer` also has dropout; it is left out here.)
#
# <details><summary>Hint</summary>
#
# The residual adds the sublayer's output to `x` itself, not to its normalized copy `h`.
# </details>

# %%
class EncoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.feed_forward = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x, mask=None):
        raise NotImplementedError  # your code here


# %%
check_encoder_layer(EncoderLayer)

# %% [markdown]
# ## Exercise 7.2 · Silence one head
#
# To learn what a head is for, switch it off and see what breaks. Write
# `silence_head(mha, x, head)` returning the output of self-attention of `x (B, L, d_model)`
# through the `MultiHeadAttention` `mha`, with head `head`'s output replaced by zeros **just
# before** the output projection `W_o`. Leave `mha`'s weights unchanged.
#
# <details><summary>Hint 1</summary>
#
# Redo the module's steps with `split_heads`, `scaled_dot_product_attention` and `combine_heads`,
# and zero the head's output in between.
# </details>
# <details><summary>Hint 2</summary>
#
# Why not zero the head's slice of the final output instead? Because `W_o` mixes every head into
# every output feature.
# </details>

# %%
def silence_head(mha, x, head):
    raise NotImplementedError  # your code here


# %%
check_head_ablation(silence_head)

# %% [markdown]
# ## Done?
#
# Compare with `solutions/07_heads_at_work.ipynb`, then go on to chapter 08.
