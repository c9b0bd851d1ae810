"""The language model: pre-norm transformer blocks made of the course's own parts.

Each block is ``x = x + attn(norm(x))`` then, when the model has MLPs,
``x = x + mlp(norm(x))`` (GPT-2's "pre-norm" order), with ``attn`` the course's
:class:`~mha_lib.MultiHeadAttention` under a causal mask and ``mlp`` two linear maps with a
GELU between them, four times as wide as the stream. A last LayerNorm and a linear
unembedding turn the stream into next-token logits.

:func:`~mha_lib.silence_heads` on ``model.blocks[l].attn`` removes a head (zero ablation).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..masks import causal_mask
from ..multi_head import MultiHeadAttention
from ..validation import check_flag, check_heads, check_positive_int

__all__ = ["Block", "ModelConfig", "TextTransformer"]

POSITIONS = ("learned", "rotary")


@dataclass(frozen=True)
class ModelConfig:
    """The sizes of a :class:`TextTransformer`; saved with every checkpoint."""

    vocab_size: int
    d_model: int = 128
    num_heads: int = 4
    num_layers: int = 2
    max_len: int = 128
    mlp: bool = True
    positions: str = "rotary"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Block(nn.Module):
    """``x + attn(norm(x))``, then ``x + mlp(norm(x))`` when ``mlp``; ``(B, L, D) -> (B, L, D)``."""

    def __init__(self, d_model: int, num_heads: int, mlp: bool = True, rotary: bool = True) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, num_heads, rotary=rotary)
        self.norm2 = nn.LayerNorm(d_model) if mlp else None
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)) if mlp else None

    def forward(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """The new stream ``(B, L, D)`` and this block's attention weights ``(B, H, L, L)``."""
        h = self.norm1(x)
        out, weights = self.attn(h, h, h, mask, return_weights=True)
        x = x + out
        if self.mlp is not None:
            x = x + self.mlp(self.norm2(x))
        return x, weights


class TextTransformer(nn.Module):
    """Token ids ``(B, L)`` -> next-token logits ``(B, L, V)``; position ``t`` predicts token ``t + 1``.

    Args:
        config: the sizes (:class:`ModelConfig`); ``positions="rotary"`` rotates queries and
            keys inside every head (chapter 06), ``"learned"`` adds a trained table to the tokens.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        check_positive_int(config.vocab_size, "vocab_size")
        check_positive_int(config.num_layers, "num_layers")
        check_positive_int(config.max_len, "max_len")
        check_heads(config.d_model, config.num_heads)
        if config.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {config.positions!r}")
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = (nn.Parameter(0.02 * torch.randn(config.max_len, config.d_model))
                                   if config.positions == "learned" else None)
        self.blocks = nn.ModuleList(Block(config.d_model, config.num_heads, config.mlp, config.positions == "rotary")
                                    for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.unembed = nn.Linear(config.d_model, config.vocab_size)

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    def _check_tokens(self, tokens: Tensor) -> None:
        if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.int64, torch.int32) or tokens.dim() != 2:
            what = f"dtype {tokens.dtype}, shape {tuple(tokens.shape)}" if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"tokens must be a (B, L) tensor of token ids (torch.long), got {what}")
        if not 1 <= tokens.size(1) <= self.config.max_len:
            raise ValueError(f"inputs must hold 1 to max_len={self.config.max_len} tokens, got {tokens.size(1)}")
        if tokens.device != self.unembed.weight.device:
            raise ValueError(f"tokens are on {tokens.device} but the model is on {self.unembed.weight.device}")
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.config.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size}), got ids from "
                             f"{tokens.min().item()} to {tokens.max().item()}")

    def forward(self, tokens: Tensor, return_weights: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Logits ``(B, L, V)``, or ``(logits, weights)`` with one ``(B, H, L, L)`` per block."""
        return_weights = check_flag(return_weights, "return_weights")
        self._check_tokens(tokens)
        x = self.token_embedding(tokens)  # (B, L, D)
        if self.position_embedding is not None:
            x = x + self.position_embedding[: tokens.size(1)]
        mask = causal_mask(tokens.size(1), device=tokens.device)  # (L, L)
        weights = []
        for block in self.blocks:
            x, w = block(x, mask)
            weights.append(w)
        logits = self.unembed(self.norm(x))
        return (logits, weights) if return_weights else logits

    @torch.no_grad()
    def generate(self, tokens: Tensor, new_tokens: int, temperature: float = 1.0,
                 generator: torch.Generator | None = None) -> Tensor:
        """Append ``new_tokens`` sampled tokens to ``tokens`` ``(B, L)``; ``temperature=0`` takes the likeliest."""
        check_positive_int(new_tokens, "new_tokens")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        for _ in range(new_tokens):
            context = tokens[:, -self.config.max_len :]
            logits = self(context)[:, -1]  # (B, V)
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(tokens.device)
            tokens = torch.cat([tokens, nxt], dim=1)
        return tokens

    def extra_repr(self) -> str:
        c = self.config
        return f"vocab_size={c.vocab_size}, max_len={c.max_len}, mlp={c.mlp}, positions={c.positions!r}"
