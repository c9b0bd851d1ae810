"""The model: an attention-only transformer, and tools to take its heads apart.

:class:`AttentionOnlyTransformer` is the model of Elhage et al. (2021): token embeddings
(+ positions), layers of :class:`~mha_lib.MultiHeadAttention` that add their output to a
residual stream, ``x = x + attn(x)``, with a causal mask, and a linear unembedding. No MLP,
no LayerNorm: every head's output is a term of a sum that the next layers and the
unembedding read, and the sum can be taken apart head by head.

- :meth:`AttentionOnlyTransformer.head_outputs`: what each head writes into the stream,
  ``(B, H, L, D)`` per layer, its slice of ``W_o`` applied to its output.
- ``forward(..., remove_from=...)``: subtract chosen heads' outputs from a later layer's
  query, key or value input only (Q-, K-, V-composition), or from the unembedding's input;
  ``subtract=...`` does the same with any tensor, e.g. one part of a head's output
  (:mod:`~mha_lib.induction.circuits`).
- :func:`~mha_lib.silence_heads` on ``model.layers[l]`` removes a head from everything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

from ..masks import causal_mask
from ..multi_head import MultiHeadAttention
from ..positions import sinusoidal_positions
from ..validation import as_index, check_flag, check_heads, check_positive_int

__all__ = ["POSITIONS", "AttentionOnlyTransformer", "HeadRef"]

POSITIONS = ("learned", "sinusoidal", "rotary")  # how the model knows where a token sits
INPUTS = ("q", "k", "v", "out")  # what remove_from can remove a head's output from
HeadRef = tuple[int, int]  # (layer, head)


class AttentionOnlyTransformer(nn.Module):
    """Embeddings -> ``num_layers`` residual attention layers (no MLP) -> linear unembedding.

    Args:
        vocab_size: number of token ids ``V``.
        d_model: width ``D`` of the residual stream.
        num_heads: heads per layer ``H``; must divide ``d_model``.
        num_layers: attention layers.
        max_len: longest input.
        positions: ``"learned"`` (a trained ``(max_len, D)`` table added to the tokens),
            ``"sinusoidal"`` (a fixed table, :func:`~mha_lib.sinusoidal_positions`) or
            ``"rotary"`` (RoPE inside every head, nothing added). None is refused: with a
            causal mask and no positions a head can't tell the previous token from any
            earlier one, and finding "the token after the earlier occurrence" needs that.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        max_len: int = 32,
        positions: str = "learned",
    ) -> None:
        super().__init__()
        self.vocab_size = check_positive_int(vocab_size, "vocab_size")
        self.max_len = check_positive_int(max_len, "max_len")
        num_layers = check_positive_int(num_layers, "num_layers")
        d_model, num_heads, _ = check_heads(d_model, num_heads)  # before the embeddings are made
        if positions not in POSITIONS:
            why = (" A model without positions can't find the token before another one, which induction needs."
                   if positions is None else "")
            raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}.{why}")
        self.positions = positions
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        if positions == "learned":
            self.position_embedding = nn.Parameter(torch.randn(max_len, d_model))  # N(0, 1), like nn.Embedding
        elif positions == "sinusoidal":
            self.register_buffer("position_embedding", sinusoidal_positions(max_len, d_model), persistent=False)
        else:
            self.position_embedding = None
        self.layers = nn.ModuleList(
            MultiHeadAttention(d_model, num_heads, rotary=positions == "rotary") for _ in range(num_layers)
        )
        self.unembed = nn.Linear(d_model, vocab_size)
        self.d_model, self.num_heads, self.num_layers = d_model, self.layers[0].num_heads, num_layers

    def _check_tokens(self, tokens: Tensor) -> None:
        if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.int64, torch.int32) or tokens.dim() != 2:
            what = f"dtype {tokens.dtype}, shape {tuple(tokens.shape)}" if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"tokens must be a (B, L) tensor of token ids (torch.long), got {what}")
        if tokens.size(1) == 0 or tokens.size(1) > self.max_len:
            raise ValueError(f"inputs must hold 1 to max_len={self.max_len} tokens, got {tokens.size(1)}")
        if tokens.device != self.unembed.weight.device:
            raise ValueError(f"tokens are on {tokens.device} but the model is on {self.unembed.weight.device}")
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got ids from "
                             f"{tokens.min().item()} to {tokens.max().item()} in tokens")

    def _check_remove(self, remove_from: Mapping[str, Iterable[HeadRef]] | None) -> dict[str, list[HeadRef]]:
        remove = {name: [] for name in INPUTS}
        for name, heads in (remove_from or {}).items():
            if name not in INPUTS:
                raise ValueError(f"remove_from keys must be among {INPUTS} (query, key, value input of the later "
                                 f"layers, the unembedding's input), got {name!r}")
            for ref in heads:
                pair = [as_index(i) for i in ref] if isinstance(ref, tuple) and len(ref) == 2 else [None, None]
                ok = (None not in pair and 0 <= pair[0] < self.num_layers and 0 <= pair[1] < self.num_heads)
                if not ok:
                    raise ValueError(f"remove_from[{name!r}] must list (layer, head) pairs with layer in "
                                     f"[0, {self.num_layers}) and head in [0, {self.num_heads}), got {ref!r}")
                remove[name].append(tuple(pair))
        return remove

    def embed(self, tokens: Tensor) -> Tensor:
        """The residual stream before the first layer, ``(B, L, D)``."""
        self._check_tokens(tokens)
        x = self.token_embedding(tokens)  # (B, L, D)
        if self.position_embedding is not None:
            x = x + self.position_embedding[: tokens.size(1)]
        return x

    def _split_by_head(self, layer: MultiHeadAttention, concatenated: Tensor) -> Tensor:
        """``(B, L, H * d_k)`` head outputs side by side -> ``(B, H, L, D)``, each through its slice of W_o."""
        B, L, _ = concatenated.shape
        heads = concatenated.reshape(B, L, layer.num_heads, layer.d_k)  # (B, L, H, d_k)
        W_o = layer.W_o.weight.reshape(layer.d_model, layer.num_heads, layer.d_k)  # (D, H, d_k)
        return torch.einsum("blhk,dhk->bhld", heads, W_o)  # (B, H, L, D); W_o's bias belongs to no head

    def _check_subtract(self, subtract: Mapping[str, Tensor] | None, tokens: Tensor) -> dict[str, Tensor]:
        checked = {}
        for name, term in (subtract or {}).items():
            if name not in INPUTS:
                raise ValueError(f"subtract keys must be among {INPUTS} (query, key, value input of the later "
                                 f"layers, the unembedding's input), got {name!r}")
            shape = (*tokens.shape, self.d_model)
            if not isinstance(term, Tensor) or not term.is_floating_point() or tuple(term.shape) != shape:
                what = tuple(term.shape) if isinstance(term, Tensor) else type(term).__name__
                raise ValueError(f"subtract[{name!r}] must be a float tensor (B, L, D) = {shape}, got {what}")
            checked[name] = term
        return checked

    def _run(self, tokens: Tensor, remove_from: Mapping[str, Iterable[HeadRef]] | None, keep_heads: bool,
             subtract: Mapping[str, Tensor] | None = None):
        remove = self._check_remove(remove_from)
        x = self.embed(tokens)  # (B, L, D); checks the tokens
        extra = self._check_subtract(subtract, tokens)
        mask = causal_mask(tokens.size(1), device=tokens.device)  # (L, L)
        weights, per_head = [], []
        need_heads = keep_heads or any(remove.values())

        def removed(name: str, upto: int) -> Tensor | int:
            """The sum of the outputs to remove from input ``name`` of a layer that reads layers ``< upto``."""
            terms = [per_head[l][:, h] for l, h in remove[name] if l < upto]
            if name in extra and upto >= 1:  # the later layers' inputs and the unembedding's
                terms.append(extra[name])
            return sum(terms) if terms else 0

        for i, layer in enumerate(self.layers):
            captured = []
            hook = layer.W_o.register_forward_pre_hook(lambda m, args: captured.append(args[0])) if need_heads else None
            try:
                q, k, v = x - removed("q", i), x - removed("k", i), x - removed("v", i)
                out, w = layer(q, k, v, mask, return_weights=True)  # (B, L, D), (B, H, L, L)
            finally:
                if hook is not None:
                    hook.remove()
            if need_heads:
                per_head.append(self._split_by_head(layer, captured[0]))
            weights.append(w)
            x = x + out
        logits = self.unembed(x - removed("out", self.num_layers))  # (B, L, V)
        return logits, weights, per_head

    def forward(
        self,
        tokens: Tensor,
        return_weights: bool = False,
        *,
        remove_from: Mapping[str, Iterable[HeadRef]] | None = None,
        subtract: Mapping[str, Tensor] | None = None,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Next-token logits for every position.

        Args:
            tokens: ``(B, L)`` long ids, ``L <= max_len``.
            return_weights: also return each layer's attention weights.
            remove_from: heads whose output to subtract from some inputs only, e.g.
                ``{"k": [(0, 2)]}``: layer 0's head 2 is removed from the *key* input of every
                later layer, and nothing else changes (a K-composition test). Keys: ``"q"``,
                ``"k"``, ``"v"`` (the later layers' query, key, value inputs) and ``"out"`` (the
                unembedding's input). Removing a head from all four equals
                :func:`~mha_lib.silence_heads` on its layer.
            subtract: ``{input: tensor (B, L, D)}``, subtracted from that input of every layer
                after the first (same keys as ``remove_from``): any part of what the first
                layer wrote, e.g. the position part of one head's output
                (:func:`~mha_lib.induction.circuits.remove_parts`).

        Returns:
            logits ``(B, L, V)`` (position ``t`` predicts token ``t + 1``), or
            ``(logits, weights)`` with ``weights`` a list of ``(B, H, L, L)``, one per layer.
        """
        return_weights = check_flag(return_weights, "return_weights")
        logits, weights, _ = self._run(tokens, remove_from, keep_heads=False, subtract=subtract)
        return (logits, weights) if return_weights else logits

    def head_outputs(
        self, tokens: Tensor, *, remove_from: Mapping[str, Iterable[HeadRef]] | None = None
    ) -> list[Tensor]:
        """What every head writes into the residual stream: a list of ``(B, H, L, D)``, one per layer.

        Head ``h``'s term is its output ``(B, L, d_k)`` times its slice of ``W_o``; the layer's
        output is the sum over heads plus ``W_o``'s bias.
        """
        return self._run(tokens, remove_from, keep_heads=True)[2]

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, max_len={self.max_len}, positions={self.positions!r}"
