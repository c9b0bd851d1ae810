"""Multi-head attention the way production code writes it (chapter 10).

:class:`EfficientMultiHeadAttention` is :class:`~mha_lib.MultiHeadAttention` (same arguments,
forward, checks, RoPE and cache) with two of its methods replaced:

1. **project** (steps 1 and 2): ``W_q, W_k, W_v`` stacked into one ``(D + 2·H_kv·d_k, D)`` weight
   ``W_qkv`` (``(3·D, D)`` without grouped heads), so that self-attention projects with one
   matrix multiplication (nanoGPT's ``c_attn``, ``nn.MultiheadAttention``'s ``in_proj_weight``)
   and cuts its output into the heads of ``q``, ``k`` and ``v`` at once (a view, a transpose and a
   split: views, no copies);
2. **attend**: :func:`torch.nn.functional.scaled_dot_product_attention`, which picks a flash /
   memory-efficient kernel where the device has one; such a kernel never stores the
   ``(B, H, Lq, Lk)`` weights, and reads each key/value head for its group of query heads
   (``enable_gqa``) without copies. Where no fused kernel takes the inputs, PyTorch falls back
   to its explicit "math" kernel, which does store them: on the CPU (PyTorch 2.13) for dropout
   > 0 in training, for a float mask that requires grad, and for a mask of 3 dimensions (the
   CPU's fused kernel takes a mask of 2 or 4). So the module gives the kernel every mask with 4
   dimensions (``(H, Lq, Lk)`` as ``(1, H, Lq, Lk)``, a view): per-head masks and biases such as
   ALiBi's run the fused kernel (``tests/test_efficient.py`` reads the kernel from the autograd graph,
   ``tests/test_bench.py`` measures the memory). ``return_weights=True`` takes the teaching
   module's explicit path, which must store them.

:func:`blockwise_attention` is the fused kernel's idea written out in PyTorch (chapter 10,
section 7): the scores in tiles of ``block × block``, an online softmax, FlashAttention-2's loop
order, and **tile skipping**: a tile that the mask (or ``causal=True``) blocks entirely is
never computed, and a tile that it allows entirely is computed without the mask. It returns the
output and :class:`TileCounts`, how many tiles it computed and skipped.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .multi_head import MultiHeadAttention
from .validation import broadcast_shapes, check_attention_inputs, check_flag, check_positive_int, same_tensor

__all__ = ["EfficientMultiHeadAttention", "TileCounts", "blockwise_attention"]


class EfficientMultiHeadAttention(MultiHeadAttention):
    """Multi-head attention with one fused input projection and a fused attention kernel.

    Takes the arguments of :class:`~mha_lib.MultiHeadAttention` and computes the same function.

    Attributes:
        W_qkv: ``nn.Linear(d_model, d_model + 2 * num_kv_heads * d_k)``; its weight is
            ``cat([W_q.weight, W_k.weight, W_v.weight])`` of the teaching module.
        W_o: ``nn.Linear(d_model, d_model)``, the output projection.
    """

    def make_projections(self, bias: bool) -> None:
        kv_features = self.num_kv_heads * self.d_k
        self.qkv_sizes = [self.d_model, kv_features, kv_features]  # the rows of W_q, W_k, W_v in W_qkv
        self.qkv_heads = [self.num_heads, self.num_kv_heads, self.num_kv_heads]  # the same rows, in heads of d_k
        self.W_qkv = nn.Linear(self.d_model, sum(self.qkv_sizes), bias=bias)
        self.W_o = nn.Linear(self.d_model, self.d_model, bias=bias)

    @classmethod
    def from_module(cls, mha: MultiHeadAttention) -> EfficientMultiHeadAttention:
        """A copy of ``mha``'s weights (dtype, device, train/eval mode and head counts too), fused.

        Both modules then compute the same function: ``new(q, k, v, mask) == mha(q, k, v, mask)``
        up to rounding.
        """
        if not isinstance(mha, MultiHeadAttention) or isinstance(mha, EfficientMultiHeadAttention):
            raise TypeError(f"from_module expects a mha_lib.MultiHeadAttention (with W_q, W_k, W_v), "
                            f"got {type(mha).__name__}")
        if getattr(mha, "sinks", None) is not None:
            raise ValueError("from_module: this module has learned sinks (sinks=True), which the fused kernel cannot "
                             "take; keep the teaching module for it")
        bias = mha.W_q.bias is not None
        rope = {"rope_base": mha.rope_base, "rope_interleaved": mha.rope_interleaved} if mha.rotary else {}
        new = cls(mha.d_model, mha.num_heads, dropout=mha.dropout, bias=bias,
                  num_kv_heads=mha.num_kv_heads, rotary=mha.rotary, qk_norm=mha.qk_norm, **rope)
        new.to(device=mha.W_q.weight.device, dtype=mha.W_q.weight.dtype)
        with torch.no_grad():
            if mha.qk_norm:
                new.q_norm.load_state_dict(mha.q_norm.state_dict())
                new.k_norm.load_state_dict(mha.k_norm.state_dict())
            new.W_qkv.weight.copy_(torch.cat([mha.W_q.weight, mha.W_k.weight, mha.W_v.weight]))
            new.W_o.weight.copy_(mha.W_o.weight)
            if bias:
                new.W_qkv.bias.copy_(torch.cat([mha.W_q.bias, mha.W_k.bias, mha.W_v.bias]))
                new.W_o.bias.copy_(mha.W_o.bias)
        return new.train(mha.training)

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Steps 1 and 2. Self-attention: one matrix multiplication, whose output is cut into all
        ``H + 2·H_kv`` heads at once (three operations where separating ``q, k, v`` first and then
        splitting each takes seven). Otherwise: three slices of ``W_qkv``, then :meth:`split`."""
        if same_tensor(query, key) and same_tensor(key, value):
            B, L, _ = query.shape
            heads = self.W_qkv(query).view(B, L, sum(self.qkv_heads), self.d_k).transpose(1, 2)  # (B, H + 2·H_kv, L, d_k)
            # views (B, H, L, d_k), (B, H_kv, L, d_k) x 2; split_with_sizes is .split's op without its 2 µs of Python
            return heads.split_with_sizes(self.qkv_heads, dim=1)
        weights = self.W_qkv.weight.split(self.qkv_sizes)  # (D, D), (H_kv·d_k, D) x 2
        biases = [None] * 3 if self.W_qkv.bias is None else self.W_qkv.bias.split(self.qkv_sizes)
        q, k, v = (F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases))
        return self.split(q, k, v)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
               return_weights: bool) -> tuple[Tensor, Tensor | None]:
        """Step 3: one call of the fused kernel (the explicit path when the weights are wanted).

        A query that may attend to no key gets a zero output, as in the teaching module: the
        fused kernels' online softmax can turn such a row into NaN on some devices
        (pytorch/pytorch#110213), so the row is unblocked for the kernel and zeroed after.
        """
        if return_weights:
            return super().attend(q, k, v, mask, return_weights)
        blocked = None
        if mask is not None:
            # (B, H, Lq, Lk), a view: the CPU's fused kernel takes a 2-D or a 4-D mask only, and sends a
            # 3-D (H, Lq, Lk) one to the math kernel, which stores the weights; a (Lk,) mask applies to every query
            mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
            if mask.dtype == torch.bool:
                blocked = ~mask.any(dim=-1, keepdim=True)  # (..., Lq, 1)
                mask = mask | blocked
            else:
                blocked = torch.isneginf(mask).all(dim=-1, keepdim=True)  # (..., Lq, 1)
                mask = mask.to(q.dtype).masked_fill(blocked, 0.0)
        grouped = self.num_kv_heads != self.num_heads  # the kernel reads each key/value head for its group
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped,
                                               dropout_p=self.dropout if self.training else 0.0)
        return (heads if blocked is None else heads.masked_fill(blocked, 0.0)), None  # (B, H, Lq, d_k)


class TileCounts(NamedTuple):
    """The tiles of the scores that one :func:`blockwise_attention` call computed and skipped.

    Counted over every (batch, head) slice: ``computed + skipped = N · ⌈Lq/block⌉ · ⌈Lk/block⌉``
    for ``N`` slices. ``masked`` counts the computed tiles that needed the mask (some of their
    scores blocked, or a float mask with non-zero entries); the others ran without it.
    """

    computed: int
    skipped: int
    masked: int


def _tile_map(mask: Tensor | None, causal: bool, lead: torch.Size, Lq: int, Lk: int,
              block: int) -> tuple[Tensor, Tensor]:
    """``(need, full)``, bool ``(N, nq, nk)`` for the ``N = prod(lead)`` slices: whether each tile has a
    score that may attend, and whether it needs no mask at all. ``causal`` alone is read from the
    tile's corners, without an ``(Lq, Lk)`` mask; any other mask tile by tile."""
    nq, nk = -(-Lq // block), -(-Lk // block)
    if mask is None:
        if not causal:
            need = torch.ones(nq, nk, dtype=torch.bool)
            return need.expand(*lead, nq, nk).reshape(-1, nq, nk), need.expand(*lead, nq, nk).reshape(-1, nq, nk)
        first_q = torch.arange(nq)[:, None] * block  # (nq, 1) the first query of each block
        last_q = torch.clamp(first_q + block, max=Lq) - 1  # (nq, 1)
        first_k = torch.arange(nk)[None, :] * block  # (1, nk)
        last_k = torch.clamp(first_k + block, max=Lk) - 1  # (1, nk)
        need, full = first_k <= last_q, last_k <= first_q  # (nq, nk): query i may see keys 0 … i
        return need.expand(*lead, nq, nk).reshape(-1, nq, nk), full.expand(*lead, nq, nk).reshape(-1, nq, nk)
    allowed = mask if mask.dtype == torch.bool else ~torch.isneginf(mask)
    free = allowed if mask.dtype == torch.bool else mask == 0  # no effect on the scores
    pad = (0, nk * block - Lk, 0, nq * block - Lq)  # the last tiles may be cut short: pad them
    allowed = F.pad(allowed.expand(*allowed.shape[:-2], Lq, Lk), pad, value=False)
    free = F.pad(free.expand(*free.shape[:-2], Lq, Lk), pad, value=True)
    tiles = allowed.shape[:-2] + (nq, block, nk, block)
    need = allowed.reshape(tiles).any(dim=-1).any(dim=-2)  # (..., nq, nk)
    full = free.reshape(tiles).all(dim=-1).all(dim=-2)  # (..., nq, nk)
    return need.expand(*lead, nq, nk).reshape(-1, nq, nk), full.expand(*lead, nq, nk).reshape(-1, nq, nk)


def blockwise_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None, *,
                        causal: bool = False, block: int = 128, skip: bool = True) -> tuple[Tensor, TileCounts]:
    """Attention tile by tile with an online softmax, skipping the tiles that the mask blocks entirely.

    Computes what :func:`~mha_lib.scaled_dot_product_attention` (and
    ``F.scaled_dot_product_attention``) computes, without the ``(Lq, Lk)`` scores: for each block
    of ``block`` queries, the blocks of keys and values stream past (FlashAttention-2's order),
    and a running max ``m``, sum ``l`` and unnormalised output ``o`` per query are rescaled
    whenever the max grows; ``o / l`` at the end. Every (batch, head) slice walks its own list of
    the key tiles to compute (FlexAttention's ``kv_indices``), all slices in step.

    Args:
        query: ``(..., Lq, d_k)``; key ``(..., Lk, d_k)``; value ``(..., Lk, d_v)``, as for
            :func:`~mha_lib.scaled_dot_product_attention` (leading dimensions broadcast).
        mask: optional, broadcastable to the scores ``(..., Lq, Lk)``: bool (True = may attend)
            or float (added to the scores, ``-inf`` = blocked).
        causal: query ``i`` may attend to keys ``0 … i`` (top-left aligned, as
            ``F.scaled_dot_product_attention(..., is_causal=True)`` when ``Lq != Lk``), read from
            the tiles' positions without building a mask; combined with ``mask`` by "and".
        block: the tile's side: queries per block and keys per block.
        skip: ``False`` computes every tile, the blocked ones too (masked to ``-inf``): the
            same output, the baseline that shows what skipping saves.

    Returns:
        ``(output, tiles)``: output ``(..., Lq, d_v)`` in the inputs' dtype (bfloat16 and float16
        accumulate in float32), and :class:`TileCounts`. A query that may attend to no key gets
        a zero output, as in :func:`~mha_lib.scaled_dot_product_attention`.
    """
    check_attention_inputs(query, key, value, mask)
    causal, skip = check_flag(causal, "causal"), check_flag(skip, "skip")
    block = check_positive_int(block, "block")
    Lq, Lk, d_k, d_v = query.size(-2), key.size(-2), query.size(-1), value.size(-1)
    lead = broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    if mask is not None and causal:  # one explicit mask that says both
        below = torch.ones(Lq, Lk, dtype=torch.bool, device=mask.device).tril()  # (Lq, Lk)
        mask = mask & below if mask.dtype == torch.bool else mask.masked_fill(~below, float("-inf"))
        causal = False
    work = torch.promote_types(query.dtype, torch.float32)  # the running m, l, o: float32 at least
    nq, nk = -(-Lq // block), -(-Lk // block)
    pad = nk * block - Lk  # the last key tile may be cut short: pad it (the padded keys are blocked)
    q, k, v = (x.expand(*lead, *x.shape[-2:]).reshape(-1, *x.shape[-2:]).to(work) for x in (query, key, value))
    q = q / math.sqrt(d_k)  # (N, Lq, d_k), scaled once
    k_tiles = F.pad(k, (0, 0, 0, pad)).view(-1, nk, block, d_k)  # (N, nk, block, d_k)
    v_tiles = F.pad(v, (0, 0, 0, pad)).view(-1, nk, block, d_v)  # (N, nk, block, d_v)
    N = q.size(0)
    need, full = _tile_map(None if mask is None else mask.cpu(), causal, lead, Lq, Lk, block)  # (N, nq, nk)
    if not skip:
        need = torch.ones_like(need)
    if mask is not None:
        mask = mask.expand(*lead, Lq, Lk).reshape(N, Lq, Lk)  # a view where the mask is shared
        mask = mask if mask.dtype == torch.bool else mask.to(work)
        if pad:  # (a copy; without padding the view stays shared)
            mask = F.pad(mask, (0, pad), value=False if mask.dtype == torch.bool else float("-inf"))
        mask = mask.view(N, Lq, nk, block)  # the key axis in tiles
    key_offsets = torch.arange(block, device=q.device)  # (block,)
    output = q.new_zeros(N, Lq, d_v)
    computed = masked = 0
    for i in range(nq):
        qs = slice(i * block, min((i + 1) * block, Lq))
        q_tile = q[:, qs]  # (N, bq, d_k)
        m = q.new_full((N, q_tile.size(1), 1), float("-inf"))  # running max
        l = q.new_zeros(N, q_tile.size(1), 1)  # running sum of exp(score - m)
        o = q.new_zeros(N, q_tile.size(1), d_v)  # running sum of exp(score - m) · value
        # each slice's own list of key tiles to compute, in order (FlexAttention's kv_indices)
        counts = need[:, i].sum(dim=-1)  # (N,)
        order = need[:, i].to(torch.uint8).argsort(dim=-1, descending=True, stable=True)  # (N, nk)
        for t in range(int(counts.max())):
            rows = None if bool((counts > t).all()) else (counts > t).nonzero().squeeze(1)  # the slices still going
            j = order[:, t] if rows is None else order[rows, t]  # (n,) the key tile of each
            shared = rows is None and bool((j == j[0]).all())  # one tile for every slice: views, no copies
            at = (slice(None), int(j[0])) if shared else (torch.arange(N) if rows is None else rows, j)
            s = (q_tile if rows is None else q_tile[rows]) @ k_tiles[at].transpose(-2, -1)  # (n, bq, block)
            partial = ~full[at[0], i, at[1]]  # (n,) the slices whose tile needs the mask
            computed, masked = computed + len(partial), masked + int(partial.sum())
            if mask is not None and bool(partial.any()):
                tile = mask[at[0], qs, at[1]]  # (n, bq, block)
                s = s.masked_fill(~tile, float("-inf")) if tile.dtype == torch.bool else s + tile
            elif bool(partial.any()) or (pad and bool((j == nk - 1).any())):  # causal, or the padded keys
                keys = j.to(q.device)[:, None, None] * block + key_offsets  # (n, 1, block) positions
                blocked = keys >= Lk
                if causal:
                    blocked = blocked | (torch.arange(qs.start, qs.stop, device=q.device)[:, None] < keys)
                s = s.masked_fill(blocked, float("-inf"))
            m_old = m if rows is None else m[rows]  # (n, bq, 1)
            m_new = torch.maximum(m_old, s.amax(dim=-1, keepdim=True))
            m_safe = m_new.masked_fill(torch.isneginf(m_new), 0.0)  # a row that has seen only blocked keys
            p = torch.exp(s - m_safe)  # (n, bq, block)
            rescale = torch.exp(m_old - m_safe)  # the old terms were summed against the old max
            l_new = rescale * (l if rows is None else l[rows]) + p.sum(dim=-1, keepdim=True)
            o_new = rescale * (o if rows is None else o[rows]) + p @ v_tiles[at]  # (n, bq, d_v)
            if rows is None:
                m, l, o = m_new, l_new, o_new
            else:
                m[rows], l[rows], o[rows] = m_new, l_new, o_new
        output[:, qs] = torch.where(l > 0, o / l, 0.0)  # a query that saw no key: zero output
    tiles = TileCounts(computed=computed, skipped=N * nq * nk - computed, masked=masked)
    return output.to(query.dtype).reshape(*lead, Lq, d_v), tiles
