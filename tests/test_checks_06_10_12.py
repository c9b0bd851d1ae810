"""Named mistakes of the checks of exercises 6.3, 10.1, 10.2, 11.4, 12.1 and 12.2 (issue 34): each wrong
answer fails with its own hint, and the right answers written in other ways keep passing."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mha_lib import checks

from conftest import expect_fail, expect_pass


# ------------------------------------------------------------------ 6.3: ALiBi's slopes


def _bias(slopes, L, device):
    pos = torch.arange(L, device=device)
    return -torch.tensor(slopes, device=device)[:, None, None] * (pos[:, None] - pos[None, :]).abs()


def _recipe(H):
    n = 2 ** (H.bit_length() - 1)
    return [2 ** (-8 * (h + 1) / n) for h in range(n)] + [2 ** (-8 * (h + 1) / (2 * n)) for h in range(2 * n)][0::2][: H - n]


def alibi_reads_slopes_back(num_heads, seq_len, device=None):
    m = torch.tensor(_recipe(num_heads), device=device)
    assert len(m.tolist()) == num_heads  # reads numbers back: fine on a GPU, impossible on the meta device
    pos = torch.arange(seq_len, device=device)
    return -m[:, None, None] * (pos[:, None] - pos[None, :]).abs()


def alibi_next_power_of_two(num_heads, seq_len, device=None):
    n = 1
    while n < num_heads:
        n *= 2
    return _bias([2 ** (-8 * (h + 1) / n) for h in range(n)][:num_heads], seq_len, device)


def alibi_repeated_slopes(num_heads, seq_len, device=None):
    n = 2 ** (num_heads.bit_length() - 1)
    own = [2 ** (-8 * (h + 1) / n) for h in range(n)]
    return _bias((own * 2)[:num_heads][::-1] if num_heads != n else own, seq_len, device)


def alibi_sorted(num_heads, seq_len, device=None):
    return _bias(sorted(_recipe(num_heads), reverse=True), seq_len, device)


def test_alibi_device_careful_answer_that_reads_numbers_back_passes():
    result = checks.check_alibi_bias(alibi_reads_slopes_back)
    expect_pass(result)
    assert "correct on 10 cases" in str(result) and "reads numbers back" in str(result)


def test_alibi_slopes_of_another_count_are_not_told_wrong_order():
    for fn in (alibi_next_power_of_two, alibi_repeated_slopes):
        result = checks.check_alibi_bias(fn)
        assert not result and "wrong order" not in str(result), result
    expect_fail(checks.check_alibi_bias(alibi_repeated_slopes), "different slopes", "repeat")
    expect_fail(checks.check_alibi_bias(alibi_sorted), "wrong order", "steep to flat")


# ------------------------------------------------------------------ 10.1: the fused projection


def fuse_right(mha):
    w = mha.W_q.weight
    layer = nn.Linear(mha.d_model, 3 * mha.d_model, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.cat([mha.W_q.weight, mha.W_k.weight, mha.W_v.weight]))
        layer.bias.copy_(torch.cat([mha.W_q.bias, mha.W_k.bias, mha.W_v.bias]))
    return layer


def fuse_as_parameters(mha):
    layer = nn.Linear(mha.d_model, 3 * mha.d_model).to(mha.W_q.weight)
    layer.weight = nn.Parameter(torch.cat([mha.W_q.weight, mha.W_k.weight, mha.W_v.weight]).detach().clone())
    layer.bias = nn.Parameter(torch.cat([mha.W_q.bias, mha.W_k.bias, mha.W_v.bias]).detach().clone())
    return layer


def fuse_float32(mha):
    layer = nn.Linear(mha.d_model, 3 * mha.d_model)
    with torch.no_grad():
        layer.weight.copy_(torch.cat([mha.W_q.weight, mha.W_k.weight, mha.W_v.weight]))
        layer.bias.copy_(torch.cat([mha.W_q.bias, mha.W_k.bias, mha.W_v.bias]))
    return layer


def fuse_on_the_cpu(mha):
    layer = nn.Linear(mha.d_model, 3 * mha.d_model, dtype=mha.W_q.weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.cat([mha.W_q.weight, mha.W_k.weight, mha.W_v.weight]))
        layer.bias.copy_(torch.cat([mha.W_q.bias, mha.W_k.bias, mha.W_v.bias]))
    return layer


def make_cached_fuse():
    cache = {}

    def fuse(mha):
        if mha.d_model not in cache:
            cache[mha.d_model] = fuse_right(mha)
        return cache[mha.d_model]
    return fuse


def fuse_in_eval_mode(mha):
    mha.eval()
    return fuse_right(mha)


def fuse_freezing(mha):
    for p in mha.parameters():
        p.requires_grad_(False)
    return fuse_right(mha)


def fuse_clearing_hooks(mha):
    mha._forward_pre_hooks.clear()
    return fuse_right(mha)


def test_fused_projection_right_answers_pass():
    for fn in (fuse_right, fuse_as_parameters):
        result = checks.check_fused_projection(fn)
        expect_pass(result)
        assert "on 3 calls" in str(result)


def test_fused_projection_names_each_slip():
    expect_fail(checks.check_fused_projection(fuse_float32), "not made in the module's dtype", "dtype=")
    expect_fail(checks.check_fused_projection(fuse_on_the_cpu), "made on the cpu", "device=", status="error")
    expect_fail(checks.check_fused_projection(make_cached_fuse()), "old weights", "cache nothing")
    expect_fail(checks.check_fused_projection(fuse_in_eval_mode), "changed the mode", "model.train(was_training)")
    expect_fail(checks.check_fused_projection(fuse_freezing), "requires_grad")
    expect_fail(checks.check_fused_projection(fuse_clearing_hooks), "removed a hook")


# ------------------------------------------------------------------ 10.2: one block at a time


def blockwise_by_broadcasting(query, key, value, block_size):
    scale = 1 / math.sqrt(query.size(-1))
    m = torch.full((*query.shape[:-1], 1), float("-inf"), dtype=query.dtype, device=query.device)
    total = torch.zeros_like(m)
    out = torch.zeros(*query.shape[:-1], value.size(-1), dtype=query.dtype, device=query.device)
    for start in range(0, key.size(-2), block_size):
        k_block, v_block = key[..., start:start + block_size, :], value[..., start:start + block_size, :]
        scores = (query[..., :, None, :] * k_block[..., None, :, :]).sum(-1) * scale  # one block, by hand
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        p, factor = torch.exp(scores - m_new), torch.exp(m - m_new)
        total, out, m = total * factor + p.sum(-1, keepdim=True), out * factor + p @ v_block, m_new
    return out / total


def blockwise_in_one_reshaped_product(query, key, value, block_size):
    Lk = key.size(-2)
    n = -(-Lk // block_size)
    k = F.pad(key, (0, 0, 0, n * block_size - Lk))
    v = F.pad(value, (0, 0, 0, n * block_size - Lk))
    k_blocks = k.reshape(*k.shape[:-2], n, block_size, k.size(-1))  # (..., n, b, d_k)
    v_blocks = v.reshape(*v.shape[:-2], n, block_size, v.size(-1))
    scores = query.unsqueeze(-3) @ k_blocks.transpose(-2, -1) / math.sqrt(query.size(-1))  # (..., n, Lq, b)
    real = torch.arange(n * block_size, device=key.device).reshape(n, 1, block_size) < Lk
    scores = scores.masked_fill(~real, float("-inf"))
    p = torch.exp(scores - scores.amax(-1, keepdim=True).amax(-3, keepdim=True))
    return (p @ v_blocks).sum(-3) / p.sum(-1, keepdim=True).sum(-3)


def test_blockwise_blocks_in_one_reshaped_product_are_named():
    result = checks.check_blockwise_attention(blockwise_by_broadcasting)
    expect_pass(result)
    assert "on 7 cases" in str(result)
    expect_fail(checks.check_blockwise_attention(blockwise_in_one_reshaped_product), "not blockwise",
                "several blocks", "reshaped", "loop over the blocks")


# ------------------------------------------------------------------ 11.4: absorb the up-projections


def absorb_right(mla):
    H, d_k, d_latent = mla.num_heads, mla.d_k, mla.d_latent
    W_uv = mla.W_uv.weight.view(H, d_k, d_latent)
    return mla.W_uk.weight.view(H, d_k, d_latent), torch.einsum("mhk,hkc->mhc", mla.W_o.weight.view(-1, H, d_k), W_uv)


def absorb_with_reshape(mla):
    H = mla.num_heads
    W_uk = mla.W_uk.weight.reshape(H, -1, mla.W_uk.in_features)
    W_uv = mla.W_uv.weight.reshape(H, -1, mla.W_uv.in_features)
    W_o = mla.W_o.weight.reshape(mla.W_o.out_features, H, -1)
    return W_uk.clone(), (W_o.permute(1, 0, 2) @ W_uv).permute(1, 0, 2)


def absorb_with_the_examples_sizes(mla):
    W_uv = mla.W_uv.weight.view(3, 4, 7)
    return mla.W_uk.weight.view(3, 4, 7), torch.einsum("mhk,hkc->mhc", mla.W_o.weight.view(12, 3, 4), W_uv)


def make_cached_absorb():
    cache = {}

    def absorb(mla):
        key = (mla.d_model, mla.num_heads, mla.d_latent)
        if key not in cache:
            cache[key] = tuple(t.detach().clone() for t in absorb_right(mla))
        return cache[key]
    return absorb


def absorb_in_eval_mode(mla):
    mla.eval()
    return absorb_right(mla)


def absorb_freezing(mla):
    for p in mla.parameters():
        p.requires_grad_(False)
    return absorb_right(mla)


def test_absorb_right_answers_pass_and_count_the_calls():
    for fn in (absorb_right, absorb_with_reshape):
        result = checks.check_absorb_up_projections(fn)
        expect_pass(result)
        assert "on 5 calls" in str(result)


def test_absorb_names_each_slip():
    result = checks.check_absorb_up_projections(absorb_with_the_examples_sizes)
    expect_fail(result, "taken from the example, not from the module", "mla.num_heads", "would not help")
    assert "Call .contiguous() before" not in str(result)
    expect_fail(checks.check_absorb_up_projections(make_cached_absorb()), "earlier call", "keep no result")
    expect_fail(checks.check_absorb_up_projections(absorb_in_eval_mode), "changed the mode")
    expect_fail(checks.check_absorb_up_projections(absorb_freezing), "requires_grad")


# ------------------------------------------------------------------ 12.1 and 12.2: the halves


def halves(L, device=None):
    first = torch.arange(L, device=device) < L // 2
    return torch.stack([first, ~first])[:, None, :].expand(2, L, L)


def restricted_right(mha, x):
    return mha(x, x, x, mask=halves(x.size(1), x.device), return_weights=True)


def restricted_by_hand(mha, x, *, w_o=True, swap=False, causal=False, shift=0.0):
    B, L, D = x.shape
    H, d_k = mha.num_heads, D // mha.num_heads
    q, k, v = (layer(x).view(B, L, H, d_k).transpose(1, 2) for layer in (mha.W_q, mha.W_k, mha.W_v))
    mask = halves(L, x.device)
    if causal:
        mask = mask & torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
    weights = (q @ k.transpose(-2, -1) / math.sqrt(d_k)).masked_fill(~mask, float("-inf")).softmax(-1).nan_to_num(0.0)
    heads = weights @ v  # (B, H, L, d_k)
    if swap:
        heads = heads.flip(1)
    concat = heads.transpose(1, 2).reshape(B, L, D)
    out = mha.W_o(concat) if w_o else concat
    if shift:
        out = out + shift * (torch.arange(L, device=x.device) == 1)[None, :, None]
    return out, weights


def restricted_in_eval_mode(mha, x):
    mha.eval()
    return restricted_right(mha, x)


def restricted_leaving_a_hook(mha, x):
    mha.register_forward_hook(lambda module, args, output: None)
    return restricted_right(mha, x)


def test_restricted_attention_right_answers_pass():
    for fn in (restricted_right, restricted_by_hand):
        result = checks.check_restricted_attention(fn)
        expect_pass(result)
        assert "correct on 3 inputs" in str(result)


def test_restricted_attention_names_each_mistake():
    check = checks.check_restricted_attention
    expect_fail(check(lambda m, x: restricted_by_hand(m, x, w_o=False)), "w_o is missing")
    expect_fail(check(lambda m, x: restricted_by_hand(m, x, swap=True)), "heads' outputs were swapped")
    expect_fail(check(lambda m, x: restricted_by_hand(m, x, causal=True)), "causal mask was added")
    expect_fail(check(lambda m, x: restricted_by_hand(m, x, shift=0.1)), "position 1 differs",
                "the weights you returned are right")
    expect_fail(check(restricted_in_eval_mode), "changed the mode")
    expect_fail(check(restricted_leaving_a_hook), "left a hook")
    out_weights_swapped = lambda m, x: (restricted_right(m, x)[0], restricted_right(m, x)[1].flip(1))  # noqa: E731
    expect_fail(check(out_weights_swapped), "two heads swapped")


def test_halves_mask_names_a_causal_mask_and_one_mask_for_both_heads():
    expect_pass(checks.check_halves_mask(halves))
    expect_fail(checks.check_halves_mask(lambda L: halves(L) & torch.ones(L, L, dtype=torch.bool).tril()),
                "causal mask was combined")
    expect_fail(checks.check_halves_mask(lambda L: halves(L)[[0, 0]]), "same mask")


# ------------------------------------------------------------------ exercises: no empty markdown cells


def test_generator_leaves_out_markdown_cells_left_empty():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from make_exercises import make_exercise

    solution = "\n".join([
        "# %% [markdown]", "# # Solutions · Chapter 09 · Test", "",
        "# %%", "x = 1", "",
        "# %% [markdown]", "# <!-- BEGIN SOLUTION -->", "# **Discussion.** Only in the solutions.",
        "# <!-- END SOLUTION -->", "",
        "# %% [markdown]", "# ## Next", "",
    ])
    exercise = make_exercise(solution)
    assert "Discussion" not in exercise and "## Next" in exercise
    cells = exercise.split("# %%")[1:]
    assert all(line.strip() not in ("", "#") for cell in cells if cell.startswith(" [markdown]")
               for line in cell.splitlines()[1:2]), exercise
    assert exercise.count("# %% [markdown]") == 2


# ------------------------------------------------------------------ held-out gallery of issues 32/34: more named slips


def make_alibi_cached_on_heads():
    cache = {}

    def alibi(num_heads, seq_len, device=None):  # keyed on num_heads only: stale for another length
        if num_heads not in cache:
            cache[num_heads] = _bias(_recipe(num_heads), seq_len, device)
        return cache[num_heads]
    return alibi


def make_alibi_cached_without_device():
    cache = {}

    def alibi(num_heads, seq_len, device=None):  # keyed on the sizes, not the device
        if (num_heads, seq_len) not in cache:
            cache[num_heads, seq_len] = _bias(_recipe(num_heads), seq_len, device)
        return cache[num_heads, seq_len]
    return alibi


def make_alibi_cached_on_every_argument():
    import functools

    @functools.lru_cache(maxsize=None)
    def alibi(num_heads, seq_len, device=None):
        return _bias(_recipe(num_heads), seq_len, device)
    return alibi


def test_alibi_names_a_result_kept_from_an_earlier_call():
    expect_fail(checks.check_alibi_bias(make_alibi_cached_on_heads()), "bias of an earlier call", "num_heads alone")
    expect_fail(checks.check_alibi_bias(make_alibi_cached_without_device()), "earlier call", "kept without its device",
                "device included")
    result = checks.check_alibi_bias(make_alibi_cached_on_every_argument())
    expect_pass(result)
    assert "correct on 10 cases" in str(result)


def absorb_transposed_then_blocks(mla):
    H, d_k, d_latent = mla.num_heads, mla.d_k, mla.d_latent
    return mla.W_uk.weight.T.reshape(H, d_latent, d_k).transpose(1, 2), absorb_right(mla)[1]


def absorb_with_sizes_typed_in(mla):  # another example's sizes: wrong from the first module on
    W_uv = mla.W_uv.weight.view(4, 16, 32)
    return mla.W_uk.weight.view(4, 16, 32), torch.einsum("mhk,hkc->mhc", mla.W_o.weight.view(64, 4, 16), W_uv)


def make_absorb_cached_on_the_class():
    cache = {}

    def absorb(mla):  # a key that every module shares
        if type(mla) not in cache:
            cache[type(mla)] = tuple(t.detach().clone() for t in absorb_right(mla))
        return cache[type(mla)]
    return absorb


def test_absorb_names_sizes_typed_in_on_the_first_module_and_a_shared_cache():
    expect_fail(checks.check_absorb_up_projections(absorb_transposed_then_blocks), "transposed before being cut")
    result = checks.check_absorb_up_projections(absorb_with_sizes_typed_in)
    expect_fail(result, "sizes written as numbers (4, 16, 32)", "mla.num_heads", "would not help")
    assert "Call .contiguous() before" not in str(result)
    expect_fail(checks.check_absorb_up_projections(make_absorb_cached_on_the_class()), "shape of an earlier call",
                "keep no result")
    for fn in (absorb_right, absorb_with_reshape):
        expect_pass(checks.check_absorb_up_projections(fn))


def make_halves_cached():
    kept = []

    def halves_mask(seq_len):
        if not kept:
            kept.append(halves(seq_len))
        return kept[0]
    return halves_mask


def test_halves_mask_names_a_length_typed_in_a_cache_and_another_split():
    check = checks.check_halves_mask
    expect_fail(check(lambda L: halves(8)), "a mask for seq_len=8", "length typed in")
    expect_fail(check(make_halves_cached()), "shape of an earlier call's (seq_len=4)", "nothing from one call")

    def split_at_zero(L):  # head 0 gets no key, head 1 every key
        first = torch.zeros(L, dtype=torch.bool)
        return torch.stack([first, ~first])[:, None, :].expand(2, L, L)
    expect_fail(check(split_at_zero), "split at key 0, not at L//2 = 2")
    expect_fail(check(lambda L: halves(L).permute(1, 2, 0)), "the head axis comes last", ".permute(2, 0, 1)")
    expect_pass(check(halves))


def make_restricted_with_a_kept_mask():
    kept = []

    def restricted(mha, x):
        if not kept:
            kept.append(halves(x.size(1), x.device))
        return mha(x, x, x, mask=kept[0], return_weights=True)
    return restricted


def restricted_unscaled(mha, x):
    B, L, D = x.shape
    H = mha.num_heads
    q, k, v = (layer(x).view(B, L, H, -1).transpose(1, 2) for layer in (mha.W_q, mha.W_k, mha.W_v))
    weights = (q @ k.transpose(-2, -1)).masked_fill(~halves(L, x.device), float("-inf")).softmax(-1)
    return mha.W_o((weights @ v).transpose(1, 2).reshape(B, L, D)), weights


def restricted_split_at_the_batch_size(mha, x):
    L = x.size(1)
    first = torch.arange(L, device=x.device) < x.size(0) // 2
    return mha(x, x, x, mask=torch.stack([first, ~first])[:, None, :].expand(2, L, L), return_weights=True)


def test_restricted_attention_names_more_slips():
    check = checks.check_restricted_attention
    expect_fail(check(restricted_unscaled), "not scaled by 1/sqrt(d_k)")
    expect_fail(check(lambda m, x: restricted_right(m, x)[::-1]), "returned (weights, output)", "swapped")
    expect_fail(check(restricted_split_at_the_batch_size), "split at another key than L // 2")
    expect_fail(check(make_restricted_with_a_kept_mask()), "the call before, with L = 4, passed", "kept from an "
                "earlier call", status="error")
    expect_pass(check(restricted_right))
