"""What only the teaching MultiHeadAttention (chapter 03) promises: each head is its own slice of
W_q, W_k, W_v; its options sinks (a learned logit per head) and qk_norm (per-head RMSNorm of q, k).

What it promises together with EfficientMultiHeadAttention (nn.MultiheadAttention's output and
weights, masks, causality, dropout, gradients, errors) is tested on both modules in
test_attention_modules.py.
"""

from __future__ import annotations

import pytest
import torch

from mha_lib import (EfficientMultiHeadAttention, MultiHeadAttention, apply_rotary, causal_mask, combine_heads,
                     repeat_kv, scaled_dot_product_attention, split_heads)


def test_each_head_sees_its_own_slice():
    """Zeroing W_q's rows of head 1 makes head 1 attend uniformly, leaving head 0 alone."""
    D, H, L = 8, 2, 5
    mha = MultiHeadAttention(D, H).double()
    x = torch.randn(1, L, D, dtype=torch.float64)
    _, before = mha(x, x, x, return_weights=True)
    with torch.no_grad():
        mha.W_q.weight[4:] = 0
        mha.W_q.bias[4:] = 0
    _, after = mha(x, x, x, return_weights=True)
    torch.testing.assert_close(after[:, 0], before[:, 0])
    torch.testing.assert_close(after[:, 1], torch.full((1, L, L), 1 / L, dtype=torch.float64))
    assert not torch.allclose(before[:, 1], after[:, 1])


def test_sinks_are_a_learned_logit_per_head():
    D, H, L = 8, 2, 5
    mha = MultiHeadAttention(D, H, sinks=True).double().eval()
    assert mha.sinks.shape == (H,) and torch.equal(mha.sinks, torch.zeros(H, dtype=torch.float64))
    assert "sinks=True" in repr(mha) and MultiHeadAttention(D, H).sinks is None
    with torch.no_grad():
        mha.sinks.copy_(torch.tensor([1.0, -30.0]))  # head 0 gives some weight away, head 1 almost none
    x = torch.randn(2, L, D, dtype=torch.float64)
    out, weights = mha(x, x, x, causal_mask(L), return_weights=True)
    plain = MultiHeadAttention(D, H).double().eval()
    plain.load_state_dict({name: p for name, p in mha.state_dict().items() if name != "sinks"})
    plain_out, plain_weights = plain(x, x, x, causal_mask(L), return_weights=True)
    q, k, v = (split_heads(W(x), H) for W in (mha.W_q, mha.W_k, mha.W_v))
    heads, expected = scaled_dot_product_attention(q, k, v, causal_mask(L), sinks=mha.sinks[:, None, None])
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(out, mha.W_o(combine_heads(heads)))
    assert (weights[:, 0].sum(-1) < 0.99).all()  # the first head's rows sum to less than 1
    torch.testing.assert_close(weights[:, 1], plain_weights[:, 1], atol=1e-12, rtol=0)  # exp(-30) ≈ 1e-13
    assert not torch.allclose(out, plain_out)
    out.sum().backward()
    assert mha.sinks.grad is not None and mha.sinks.grad[0] != 0


def test_fused_module_refuses_sinks_rather_than_ignoring_them():
    with pytest.raises(ValueError, match="sinks=True: EfficientMultiHeadAttention .*takes no sink logits"):
        EfficientMultiHeadAttention(8, 2, sinks=True)
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="sinks must be True or False"):
            MultiHeadAttention(8, 2, sinks=bad)


@pytest.mark.parametrize("kind", ["teaching", "efficient"])
def test_qk_norm_normalises_each_heads_queries_and_keys_before_rope(kind):
    D, H, H_kv, L = 16, 4, 2, 6
    cls = MultiHeadAttention if kind == "teaching" else EfficientMultiHeadAttention
    mha = cls(D, H, num_kv_heads=H_kv, rotary=True, qk_norm=True).double().eval()
    assert mha.q_norm.weight.shape == (D // H,) and "qk_norm=True" in repr(mha)
    with torch.no_grad():  # gains that differ per feature, so that the order of norm and RoPE shows
        mha.q_norm.weight.copy_(torch.linspace(0.5, 2.0, D // H))
        mha.k_norm.weight.copy_(torch.linspace(1.5, 0.2, D // H))
    x = torch.randn(2, L, D, dtype=torch.float64)
    q, k, v = mha.project(x, x, x)  # (B, H, L, d_k), (B, H_kv, L, d_k) x 2

    def rms_norm(t, gain):  # RMSNorm written out: t / sqrt(mean(t²) + eps) · gain
        return t / (t.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * gain

    def forward(q, k):
        heads, _ = scaled_dot_product_attention(q, repeat_kv(k, H // H_kv), repeat_kv(v, H // H_kv), causal_mask(L))
        return mha.W_o(combine_heads(heads))

    q_n, k_n = rms_norm(q, mha.q_norm.weight), rms_norm(k, mha.k_norm.weight)
    torch.testing.assert_close(mha(x, x, x, causal_mask(L)), forward(apply_rotary(q_n), apply_rotary(k_n)))
    rotated_first = forward(rms_norm(apply_rotary(q), mha.q_norm.weight), rms_norm(apply_rotary(k), mha.k_norm.weight))
    assert not torch.allclose(mha(x, x, x, causal_mask(L)), rotated_first)


def test_qk_norm_bounds_the_scores_however_large_the_inputs():
    """|q · k| / √d_k ≤ |q| |k| / √d_k = √d_k for unit gains: inputs 1000 times larger move no score past it."""
    D, H, L = 32, 4, 8
    torch.manual_seed(1)
    normed, plain = MultiHeadAttention(D, H, qk_norm=True).double(), MultiHeadAttention(D, H).double()
    plain.load_state_dict({n: p for n, p in normed.state_dict().items() if "norm" not in n})
    x = torch.randn(2, L, D, dtype=torch.float64)

    def largest_score(module, inputs):
        q, k, _ = module.project(inputs, inputs, inputs)
        if module.qk_norm:
            q, k = module.q_norm(q), module.k_norm(k)
        return (q @ k.transpose(-2, -1) / (D // H) ** 0.5).abs().max().item()

    for scale in (1.0, 1000.0):
        assert largest_score(normed, scale * x) <= (D // H) ** 0.5 + 1e-9
    assert largest_score(plain, 1000.0 * x) > 1e5 * largest_score(plain, x)  # about 1000² times larger
    _, weights = plain(1000.0 * x, 1000.0 * x, 1000.0 * x, return_weights=True)
    assert weights.max(-1).values.min() > 0.999  # without the norm, every row is one-hot
    for bad in ("rms", 1, None):
        with pytest.raises(ValueError, match="qk_norm must be True or False"):
            MultiHeadAttention(8, 2, qk_norm=bad)
