"""What only EfficientMultiHeadAttention (chapter 10) promises: the teaching MultiHeadAttention's
function, outputs, weights and gradients, with one fused projection W_qkv (whose gradient is the
three stacked) and a fused kernel that never stores the (Lq, Lk) weights; from_module.

What both modules promise (nn.MultiheadAttention's output and weights, masks, causality,
dropout, fully masked rows, gradchecks, errors) is tested on both in test_attention_modules.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import TOLERANCES, make_inputs, make_mask, randn, rows_that_see_nothing, weight_shaped_inputs
from mha_lib import EfficientMultiHeadAttention, MultiHeadAttention, causal_mask

DTYPES = [torch.float64, torch.float32, torch.bfloat16]


def twin_modules(d_model, num_heads, dtype, device, bias=True, dropout=0.0):
    """The teaching module and its fused copy, holding the same weights."""
    teaching = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias).to(device, dtype).eval()
    return teaching, EfficientMultiHeadAttention.from_module(teaching)


CASES = [  # (inputs, B, Lq, Lk, d_model, H)
    ("self", 2, 5, 5, 16, 4),
    ("self", 3, 9, 9, 24, 3),
    ("memory", 2, 4, 7, 16, 2),
    ("distinct", 3, 6, 3, 12, 1),
    ("distinct", 1, 1, 6, 8, 8),
]
MASKS = ["none", "causal", "padding", "per_head", "float"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "{}_B{}_Lq{}_Lk{}_D{}_H{}".format(*c))
def test_matches_teaching_module(case, mask_kind, dtype, device):
    kind, B, Lq, Lk, D, H = case
    teaching, fused = twin_modules(D, H, dtype, device)
    query, key, value = make_inputs(kind, B, Lq, Lk, D, device, dtype)
    mask = make_mask(mask_kind, B, H, Lq, Lk, device)

    expected, expected_weights = teaching(query, key, value, mask, return_weights=True)
    out = fused(query, key, value, mask)
    out_w, weights = fused(query, key, value, mask, return_weights=True)

    assert out.shape == (B, Lq, D) and out.dtype == dtype and weights.shape == (B, H, Lq, Lk)
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])
    torch.testing.assert_close(out_w, expected, **TOLERANCES[dtype])
    torch.testing.assert_close(weights, expected_weights, **TOLERANCES[dtype])


def leaf_copies(inputs):
    """Fresh leaves that keep the aliasing of ``inputs`` (query is key is value stays so)."""
    copies: dict[int, torch.Tensor] = {}
    for x in inputs:
        copies.setdefault(id(x), x.detach().clone().requires_grad_(True))
    return [copies[id(x)] for x in inputs]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("kind", ["self", "memory", "distinct"])
def test_gradients_match_teaching_module(kind, dtype, device):
    """The same input gradients, and the fused projection's gradient is W_q's, W_k's and W_v's stacked."""
    B, Lq, Lk, D, H = 2, 5, 7 if kind != "self" else 5, 16, 4
    teaching, fused = twin_modules(D, H, dtype, device)
    inputs = make_inputs(kind, B, Lq, Lk, D, device, dtype)
    inputs, inputs_fused = leaf_copies(inputs), leaf_copies(inputs)
    mask = make_mask("padding", B, H, Lq, Lk, device)
    upstream = randn(B, Lq, D, device=device, dtype=dtype)

    (teaching(*inputs, mask) * upstream).sum().backward()
    (fused(*inputs_fused, mask) * upstream).sum().backward()

    tol = TOLERANCES[dtype]
    assert (inputs_fused[0] is inputs_fused[2]) == (kind == "self")
    for x, y in zip(inputs, inputs_fused):
        torch.testing.assert_close(y.grad, x.grad, **tol)
    W_qkv_grad = torch.cat([teaching.W_q.weight.grad, teaching.W_k.weight.grad, teaching.W_v.weight.grad])
    b_qkv_grad = torch.cat([teaching.W_q.bias.grad, teaching.W_k.bias.grad, teaching.W_v.bias.grad])
    torch.testing.assert_close(fused.W_qkv.weight.grad, W_qkv_grad, **tol)
    torch.testing.assert_close(fused.W_qkv.bias.grad, b_qkv_grad, **tol)
    torch.testing.assert_close(fused.W_o.weight.grad, teaching.W_o.weight.grad, **tol)
    torch.testing.assert_close(fused.W_o.bias.grad, teaching.W_o.bias.grad, **tol)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_fully_masked_rows_match_teaching_module(mask_dtype, device):
    """A query that may attend to nothing: the fused kernel's row is unblocked, then zeroed; the
    outputs and gradients are the teaching module's. (That both give zeros, not NaN:
    test_attention_modules.py.)"""
    B, Lq, Lk, D, H = 2, 4, 6, 16, 4
    teaching, fused = twin_modules(D, H, torch.float32, device)
    query, memory, _ = make_inputs("memory", B, Lq, Lk, D, device, torch.float32)
    allowed, mask = rows_that_see_nothing(B, Lq, Lk, mask_dtype, device)  # queries (0, 1) and (1, 3)

    q1 = query.clone().requires_grad_(True)
    q2 = query.clone().requires_grad_(True)
    expected = teaching(q1, memory, memory, mask)
    out = fused(q2, memory, memory, mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, **TOLERANCES[torch.float32])
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(q2.grad, q1.grad, **TOLERANCES[torch.float32])


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_fully_masked_rows_do_not_rely_on_the_kernel(mask_dtype, monkeypatch):
    """Some devices' fused kernels give NaN for a query that sees no key (pytorch/pytorch#110213);
    the CPU's gives zeros. With a kernel that gives NaN, the module still outputs W_o's bias there."""
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def nan_for_empty_rows(q, k, v, attn_mask=None, **kwargs):
        out = real_sdpa(q, k, v, attn_mask=attn_mask, **kwargs)
        if attn_mask is None:
            return out
        allowed = attn_mask if attn_mask.dtype == torch.bool else ~torch.isneginf(attn_mask)
        return out.masked_fill(~allowed.any(-1, keepdim=True), float("nan"))

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", nan_for_empty_rows)
    _, fused = twin_modules(16, 4, torch.float32, "cpu")
    query, memory, _ = make_inputs("memory", 2, 4, 6, 16, "cpu", torch.float32)
    allowed = torch.ones(2, 1, 4, 6, dtype=torch.bool)
    allowed[0, 0, 1] = False
    mask = allowed if mask_dtype == torch.bool else torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    assert torch.isnan(torch.nn.functional.scaled_dot_product_attention(  # the fake kernel does give NaN
        query.view(2, 1, 4, 16), memory.view(2, 1, 6, 16), memory.view(2, 1, 6, 16), attn_mask=mask)).any()
    out = fused(query, memory, memory, mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0, 1], fused.W_o.bias, atol=1e-6, rtol=0)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "no tokens", "no sequences"])
def test_self_attention_projects_once_and_cuts_every_head_as_a_view(num_kv_heads, layout):
    """Self-attention: one call of W_qkv, and q, k, v are views of its output, equal to the heads
    that splitting q, k and v apart first would give (the teaching module's split)."""
    mha = EfficientMultiHeadAttention(16, 4, num_kv_heads=num_kv_heads)
    x = {"contiguous": torch.randn(2, 5, 16), "strided": torch.randn(5, 2, 32)[:, :, ::2].transpose(0, 1),
         "no tokens": torch.randn(2, 0, 16), "no sequences": torch.randn(0, 5, 16)}[layout]
    B, L, _ = x.shape
    outputs = []
    mha.W_qkv.register_forward_hook(lambda module, inputs, output: outputs.append(output))
    with torch.no_grad():
        q, k, v = mha.project(x, x, x)
        assert mha(x, x, x).shape == x.shape
    assert len(outputs) == 2
    assert q.shape == (B, 4, L, 4) and k.shape == v.shape == (B, num_kv_heads, L, 4)
    if x.numel():  # an empty tensor may hold no storage at all
        assert all(t.untyped_storage().data_ptr() == outputs[0].untyped_storage().data_ptr() for t in (q, k, v))
    one_by_one = mha.split(*outputs[0].split(mha.qkv_sizes, dim=-1))
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), one_by_one))


def test_from_module_copies_everything(device):
    teaching = MultiHeadAttention(16, 4, dropout=0.25, bias=True).to(device, torch.float64).train()
    fused = EfficientMultiHeadAttention.from_module(teaching)
    assert (fused.d_model, fused.num_heads, fused.d_k, fused.dropout) == (16, 4, 4, 0.25)
    assert fused.training and fused.W_qkv.weight.dtype == torch.float64
    assert fused.W_qkv.weight.device.type == torch.device(device).type
    assert fused.W_qkv.weight.shape == (48, 16)
    torch.testing.assert_close(fused.W_qkv.weight[16:32], teaching.W_k.weight, atol=0, rtol=0)
    # a copy, not a view: training one module leaves the other alone
    with torch.no_grad():
        teaching.W_v.weight.zero_()
    assert fused.W_qkv.weight[32:].abs().sum() > 0
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in teaching.parameters())


def test_from_module_refuses_other_modules():
    with pytest.raises(TypeError, match=r"from_module expects a mha_lib.MultiHeadAttention \(with W_q, W_k, W_v\), "
                                        r"got MultiheadAttention"):
        EfficientMultiHeadAttention.from_module(nn.MultiheadAttention(8, 2))


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal"])
def test_never_materialises_the_weights_on_cpu(mask_kind):
    """The point of the module: forward and backward create no (B, H, Lq, Lk) tensor.
    (The teaching module, checked the same way, does; so does the fused one where the CPU
    kernel falls back to PyTorch's explicit one, for dropout in training.)"""
    B, Lq, Lk, D, H = 2, 37, 37, 32, 4
    teaching, fused = twin_modules(D, H, torch.float32, "cpu")
    fused.train()  # training mode with dropout 0: the kernel must not save the weights either
    x = torch.randn(B, Lq, D)
    mask = make_mask(mask_kind, B, H, Lq, Lk, "cpu")

    def weight_shaped(module):
        return weight_shaped_inputs(lambda: module(x, x, x, mask).sum().backward(), Lq, Lk)

    assert weight_shaped(teaching), "the check itself must catch the teaching module"
    assert weight_shaped(EfficientMultiHeadAttention(D, H, dropout=0.5).train()), "and the fallback kernel"
    assert weight_shaped(fused) == []


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_pytorch_cpu_kernel_itself_gives_zeros_for_fully_masked_rows(mask_dtype):
    """Chapter 10 says so: on the CPU, torch 2.13's F.scaled_dot_product_attention itself returns
    zeros, not NaN, for a query that sees no key. (The module's guard does not rely on it.)"""
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    allowed = torch.ones(3, 5, dtype=torch.bool)
    allowed[1] = False
    mask = allowed if mask_dtype == torch.bool else torch.zeros(3, 5).masked_fill(~allowed, float("-inf"))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.isfinite(out).all() and (out[:, :, 1] == 0).all() and (out[:, :, 0] != 0).any()


def backward_ops(out: torch.Tensor) -> set[str]:
    """The names of every node of ``out``'s autograd graph: the fused kernel leaves its own backward."""
    names, stack, seen = set(), [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(node.name())
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


FLASH_CPU = "ScaledDotProductFlashAttentionForCpuBackward0"


def halves(L: int) -> torch.Tensor:
    """Chapter 12's mask: head 0 sees keys [0, L // 2), head 1 keys [L // 2, L); bool (2, L, L)."""
    first = torch.arange(L) < L // 2  # (L,)
    return torch.stack([first, ~first])[:, None, :].expand(2, L, L)


def per_head_masks(H: int, L: int) -> dict[str, torch.Tensor]:
    from mha_lib import alibi_bias, causal_mask

    alibi = alibi_bias(H, L)  # (H, L, L) float
    return {
        "halves (2, L, L) bool": halves(L) if H == 2 else halves(L).repeat(H // 2, 1, 1),  # heads 0, 1, 0, 1, ...
        "random (H, L, L) bool": (torch.rand(H, L, L) < 0.5) | torch.eye(L, dtype=torch.bool),
        "ALiBi (H, L, L) float": alibi,
        "causal ALiBi (H, L, L) float": alibi.masked_fill(~causal_mask(L), float("-inf")),
        "ALiBi (1, H, L, L) float": alibi[None],
        "causal (L, L) bool": causal_mask(L),
        "padding (L,) bool": torch.arange(L) < L - 3,
    }


@pytest.mark.parametrize("H", [2, 4])
@pytest.mark.parametrize("mask_name", list(per_head_masks(2, 4)))
def test_per_head_masks_and_biases_run_the_fused_cpu_kernel(H, mask_name):
    """A 3-D (H, Lq, Lk) mask sends the CPU's F.scaled_dot_product_attention to its math kernel
    (which stores the weights); the module passes every mask as 4-D, which the fused kernel takes.
    The autograd graph names the kernel that ran; the outputs and gradients are the teaching module's."""
    mask = per_head_masks(H, 24)[mask_name]
    torch.manual_seed(0)
    teaching, fused = twin_modules(32, H, torch.float32, "cpu")
    x = torch.randn(2, 24, 32)
    x_fused, x_teaching = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = fused(x_fused, x_fused, x_fused, mask)
    assert FLASH_CPU in backward_ops(out), sorted(backward_ops(out))
    expected = teaching(x_teaching, x_teaching, x_teaching, mask)
    torch.testing.assert_close(out, expected, **TOLERANCES[torch.float32])
    upstream = torch.randn_like(out)
    out.backward(upstream)
    expected.backward(upstream)
    torch.testing.assert_close(x_fused.grad, x_teaching.grad, **TOLERANCES[torch.float32])


def test_the_kernel_check_sees_the_math_kernel():
    """The check above can fail: a 3-D mask given to F.scaled_dot_product_attention itself, or
    dropout in training, leaves no fused kernel in the graph."""
    q, k, v = (torch.randn(1, 2, 24, 8, requires_grad=True) for _ in range(3))
    mask = halves(24)
    assert FLASH_CPU not in backward_ops(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert FLASH_CPU in backward_ops(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[None]))
    dropping = EfficientMultiHeadAttention(16, 2, dropout=0.5).train()
    x = torch.randn(1, 24, 16, requires_grad=True)
    assert FLASH_CPU not in backward_ops(dropping(x, x, x, mask))


@pytest.mark.parametrize("options", [{"rotary": True, "rope_base": 100.0}, {"rotary": True, "rope_interleaved": True},
                                     {"qk_norm": True}, {"rotary": True, "qk_norm": True, "rope_interleaved": True}])
def test_from_module_keeps_the_rope_and_qk_norm_options(options) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, **options).eval()
    if options.get("qk_norm"):
        with torch.no_grad():  # gains other than the initial ones, so that a lost copy would show
            mha.q_norm.weight.uniform_(0.5, 2.0)
            mha.k_norm.weight.uniform_(0.5, 2.0)
    fused = EfficientMultiHeadAttention.from_module(mha)
    x = torch.randn(2, 7, 32)
    mask = causal_mask(7)
    torch.testing.assert_close(fused(x, x, x, mask), mha(x, x, x, mask), atol=1e-5, rtol=1e-5)


def test_from_module_refuses_a_module_with_sinks() -> None:
    with pytest.raises(ValueError, match="sinks"):
        EfficientMultiHeadAttention.from_module(MultiHeadAttention(32, 4, sinks=True))
