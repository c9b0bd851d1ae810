"""Multi-head attention as a module: project, split, attend, combine, project.

The attribute names ``W_q, W_k, W_v, W_o`` follow the listing in
*Transformers in Action* (listing 2.4), with its bug fixed: the listing splits
the values with ``self.d_v``, which it never defines. Every head's keys and
values have the same size here, ``d_k = d_model // num_heads``.

``forward`` is chapter 03's five steps (``project`` runs steps 1 and 2, calling ``split`` for step 2),
with the places where later chapters hook in: QK-norm (chapter 04) and positions inside each
head (RoPE, chapter 06) between splitting and attending, and a key/value cache (chapter 11) just
before attending. A learned sink per head (chapter 04) joins the softmax in ``attend``.
:class:`~mha_lib.EfficientMultiHeadAttention` (chapter 10) overrides two methods only:
``project`` (one fused matrix, whose output is cut into every head at once) and ``attend``
(a fused kernel).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .attention import scaled_dot_product_attention
from .heads import _split_heads, combine_heads
from .inference import KVCache, repeat_kv
from .positions import apply_rotary
from .validation import check_base, check_flag, check_forward, check_heads, check_num_kv_heads, check_rotary

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head attention with ``num_heads`` heads of size ``d_model // num_heads``.

    Args:
        d_model: width of the inputs and of the output.
        num_heads: number of heads ``H``; must divide ``d_model``.
        dropout: dropout on the attention weights, active in training mode only.
        bias: whether the four projections have a bias.
        num_kv_heads: number of key/value heads ``H_kv``; must divide ``num_heads`` (default:
            ``num_heads``). Each group of ``num_heads // num_kv_heads`` consecutive query heads
            shares one key/value head (grouped-query attention; ``1`` is multi-query attention),
            and ``W_k``, ``W_v`` map to ``num_kv_heads * d_k`` features only.
        rotary: rotate each head's queries and keys by their positions (RoPE,
            :func:`~mha_lib.apply_rotary`) after :func:`~mha_lib.split_heads`; needs an even ``d_k``.
        rope_base: RoPE's base (default 10000, as in the paper; 500000 in LLaMA 3, Hugging
            Face's ``rope_theta``); only with ``rotary=True``.
        rope_interleaved: RoPE pairs neighbour features ``(2i, 2i + 1)`` (RoFormer, GPT-J)
            instead of halves ``(i, i + d_k/2)`` (GPT-NeoX, Hugging Face LLaMA); only with
            ``rotary=True``. :func:`~mha_lib.rotary_permutation` converts weights between them.
        qk_norm: normalise each head's queries and keys (RMSNorm over its ``d_k`` features, with
            a learned gain shared by the heads: ``q_norm``, ``k_norm``) before RoPE, as in
            Gemma 3 and Qwen 3 (OLMo-2 normalises the whole projection): a score is then at most
            ``gain² · √d_k`` in size, however large the inputs grow.
        sinks: a learned logit per head (``sinks``, ``(H,)``, starting at 0) that joins every
            row's softmax without a key (gpt-oss): a head can put weight nowhere, and its
            weights then sum to less than 1 (:func:`~mha_lib.scaled_dot_product_attention`).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        num_kv_heads: int | None = None,
        rotary: bool = False,
        rope_base: float | None = None,
        rope_interleaved: bool = False,
        qk_norm: bool = False,
        sinks: bool = False,
    ) -> None:
        super().__init__()
        self.d_model, self.num_heads, self.dropout = check_heads(d_model, num_heads, dropout)
        self.d_k = self.d_model // self.num_heads  # per head; the paper's d_k = d_v = d_model / h
        self.num_kv_heads = check_num_kv_heads(self.num_heads, num_kv_heads)  # H_kv
        self.rotary = check_flag(rotary, "rotary")
        self.rope_base = 10000.0 if rope_base is None else check_base(rope_base, "rope_base")
        self.rope_interleaved = check_flag(rope_interleaved, "rope_interleaved")
        if self.rotary:
            check_rotary(self.d_k)
        elif rope_base is not None or self.rope_interleaved:
            given = "rope_base" if rope_base is not None else "rope_interleaved"
            raise ValueError(f"{given} is a setting of RoPE: pass rotary=True too (this module has rotary=False)")
        self.make_projections(check_flag(bias, "bias"))
        self.qk_norm = check_flag(qk_norm, "qk_norm")
        if self.qk_norm:  # one gain per feature of a head, shared by the heads
            self.q_norm = nn.RMSNorm(self.d_k, eps=1e-6)
            self.k_norm = nn.RMSNorm(self.d_k, eps=1e-6)
        self.sinks = nn.Parameter(torch.zeros(self.num_heads)) if check_flag(sinks, "sinks") else None  # (H,)
        if self.sinks is not None and type(self).attend is not MultiHeadAttention.attend:
            raise ValueError(f"sinks=True: {type(self).__name__} attends with its own kernel, which takes no sink "
                             "logits; use MultiHeadAttention")

    def make_projections(self, bias: bool) -> None:
        """``W_q``: ``d_model → d_model``; ``W_k``, ``W_v``: ``d_model → H_kv·d_k``; ``W_o``: ``d_model → d_model``."""
        kv_features = self.num_kv_heads * self.d_k
        self.W_q = nn.Linear(self.d_model, self.d_model, bias=bias)
        self.W_k = nn.Linear(self.d_model, kv_features, bias=bias)
        self.W_v = nn.Linear(self.d_model, kv_features, bias=bias)
        self.W_o = nn.Linear(self.d_model, self.d_model, bias=bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        return_weights: bool = False,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``(B, Lq, d_model)``.
            key: ``(B, Lk, d_model)``.
            value: ``(B, Lk, d_model)``. For self-attention pass the same tensor
                three times; for cross-attention ``Lq`` may differ from ``Lk``.
            mask: optional, broadcastable to the scores ``(B, H, Lq, Lk)``; bool
                ``True`` = may attend, or float added to the scores (0/-inf or a
                bias; 0s and 1s are refused: use ``.bool()``). Aligned from the
                right: ``(Lq, Lk)`` applies to everything (``causal_mask``),
                ``(H, Lq, Lk)`` per head, ``(B, 1, 1, Lk)`` per sequence's keys
                (:func:`~mha_lib.padding_mask`), ``(B, 1, Lq, Lk)`` per sequence.
                A 2-D mask is always ``(Lq, Lk)`` and a 3-D one ``(H, Lq, Lk)``,
                also when ``B == Lq`` or ``B == H`` (:mod:`mha_lib.validation`).
            return_weights: also return the attention weights.
            cache: a :class:`~mha_lib.KVCache` for decoding (self-attention only, one cache
                per layer). The ``n`` new tokens' keys and values are appended to the ``T``
                cached ones, the new queries attend to all ``T + n`` positions and causally
                among themselves (``mask``, if given, must broadcast to ``(B, H, n, T + n)``
                and is combined with that), and RoPE positions continue at ``T``. Token by
                token or in chunks, this equals the full forward with :func:`~mha_lib.causal_mask`.
            positions: RoPE's positions of the tokens (``rotary=True``, self-attention): an
                integer tensor ``(L,)`` (or ``(1, L)``), or ``(B, L)`` per sequence, on the input's device, e.g.
                ``(real.long().cumsum(-1) - 1).clamp(min=0)`` for a left-padded batch whose
                ``(B, L)`` bool ``real`` marks the real tokens (Hugging Face's ``position_ids``).
                Default: ``arange(T, T + L)``, after the ``T`` cached tokens. With a cache, give
                the new tokens' positions.

        Returns:
            output ``(B, Lq, d_model)``, or ``(output, weights)`` with weights
            ``(B, H, Lq, Lk)`` (``Lk = T + n`` with a cache) when ``return_weights`` is True.
        """
        past = check_forward(self, query, key, value, mask, cache, return_weights, positions)  # once; T cached
        q, k, v = self.project(query, key, value)  # 1) project, 2) split: (B, H, Lq, d_k), (B, H_kv, Lk, d_k) x 2
        if self.qk_norm:  # each head's queries and keys to a fixed size (chapter 04)
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary:  # positions inside each head (chapter 06)
            q, k = self.rotate(q, k, start=past, positions=positions)
        if cache is not None:  # decoding (chapter 11): the cached keys and values, and the new ones
            k, v, mask = cache.extend(k, v, mask)  # (B, H_kv, T + n, d_k) x 2
        heads, weights = self.attend(q, k, v, mask, return_weights)  # 3) (B, H, Lq, d_k)
        output = self.W_o(combine_heads(heads))  # 4) combine, 5) project: (B, Lq, d_model)
        return (output, weights) if return_weights else output

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Steps 1 and 2: ``W_q query``, ``W_k key``, ``W_v value``, each split into its heads."""
        q, k, v = self.W_q(query), self.W_k(key), self.W_v(value)  # 1) (B, Lq, d_model), (B, Lk, H_kv·d_k) x 2
        return self.split(q, k, v)  # 2) (B, H, Lq, d_k), (B, H_kv, Lk, d_k) x 2

    def split(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Step 2: ``H`` query heads, ``H_kv`` key/value heads, of ``d_k`` features each."""
        return _split_heads(q, self.num_heads), _split_heads(k, self.num_kv_heads), _split_heads(v, self.num_kv_heads)

    def rotate(self, q: Tensor, k: Tensor, start: int, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """RoPE: rotate queries and keys by ``positions`` ``(L,)``, ``(1, L)`` or ``(B, L)``, by default
        ``start, start + 1, ...`` (never the values)."""
        if positions is None:
            q_positions = torch.arange(start, start + q.size(-2), device=q.device)
            k_positions = torch.arange(start, start + k.size(-2), device=k.device)
        else:
            q_positions = k_positions = positions
        base, interleaved = self.rope_base, self.rope_interleaved
        return apply_rotary(q, q_positions, base, interleaved), apply_rotary(k, k_positions, base, interleaved)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
               return_weights: bool) -> tuple[Tensor, Tensor | None]:
        """Step 3: every head attends on its own, in one batched call; a group of ``H // H_kv``
        query heads shares each key/value head. Returns the heads ``(B, H, Lq, d_k)`` and the
        weights ``(B, H, Lq, Lk)``."""
        n_rep = self.num_heads // self.num_kv_heads
        dropout_p = self.dropout if self.training else 0.0
        sinks = None if self.sinks is None else self.sinks.view(-1, 1, 1)  # (H, 1, 1): one logit per head and row
        return scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask, dropout_p, sinks)

    def extra_repr(self) -> str:
        grouped = f", num_kv_heads={self.num_kv_heads}" if self.num_kv_heads != self.num_heads else ""
        rotary = ", rotary=True" if self.rotary else ""  # the defaults stay unsaid
        if self.rotary and self.rope_base != 10000.0:
            rotary += f", rope_base={self.rope_base:g}"
        rotary += ", rope_interleaved=True" if self.rope_interleaved else ""
        rotary += ", qk_norm=True" if self.qk_norm else ""
        rotary += ", sinks=True" if self.sinks is not None else ""
        return f"d_model={self.d_model}, num_heads={self.num_heads}{grouped}, d_k={self.d_k}, dropout={self.dropout}{rotary}"
