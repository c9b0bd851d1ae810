"""What a head of the language model does, scored before looking, each next to a baseline.

Every score is the mean attention weight a head puts on the keys a role names, over the
queries where the role applies, and every score has the value a head that spreads its
weight **uniformly** over the visible keys would get. A head "has" a role when its score is
at least :func:`role_threshold` of that baseline (fixed in advance, as in chapter 08):

- **previous token** (on held-out text): query ``t`` -> key ``t - 1``;
- **first token** (on held-out text): query ``t`` -> key 0, where many heads park weight
  they don't need (an "attention sink", Xiao et al. 2024);
- **newline** (on held-out text): query ``t`` -> the keys that are newlines, against their
  share of the visible keys (exercise 9.1 scores indentation and punctuation the same way);
- **induction** and **duplicate token** (on random tokens with a repeated segment, chapter
  08's :func:`~mha_lib.induction.repeated_segments`): from the second copy to the token after
  the earlier occurrence, or to the earlier occurrence itself.

Chapter 08's score functions are reused, not copied.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..induction.data import RepeatBatch, repeated_segments
from ..induction.scores import (
    duplicate_token_score,
    induction_score,
    previous_token_score,
    uniform_induction_score,
    uniform_previous_token_score,
)
from ..induction.run import role_threshold  # halfway from the uniform baseline to 1, as in chapter 08
from .model import TextTransformer

__all__ = ["ROLES", "first_token_score", "key_class_score", "role_threshold", "head_scores", "repeat_batch",
           "uniform_first_token_score", "uniform_key_class_score"]

ROLES = ("previous", "first", "newline", "induction", "duplicate")


def first_token_score(weights: Tensor) -> Tensor:
    """``(H,)``: mean weight from query ``t`` to key 0, over ``t >= 1`` and the batch."""
    return weights[:, :, 1:, 0].mean(dim=(0, 2))


def uniform_first_token_score(seq_len: int) -> float:
    """Uniform attention's first-token score: the previous-token baseline, mean of ``1 / (t + 1)``."""
    return uniform_previous_token_score(seq_len)


def key_class_score(weights: Tensor, is_class: Tensor) -> Tensor:
    """``(H,)``: mean total weight from query ``t >= 1`` to the keys of a class.

    Args:
        weights: ``(B, H, L, L)``.
        is_class: ``(B, L)`` bool, True at the keys in the class (e.g. newlines).
    """
    picked = (weights * is_class[:, None, None, :].to(weights.dtype)).sum(-1)  # (B, H, L)
    return picked[:, :, 1:].mean(dim=(0, 2))


def uniform_key_class_score(is_class: Tensor) -> float:
    """Uniform attention's :func:`key_class_score`: the class's share of keys ``0..t``, averaged."""
    seen = is_class.double().cumsum(-1)  # (B, L)
    t = torch.arange(is_class.size(1), dtype=torch.float64)
    return (seen / (t + 1))[:, 1:].mean().item()


def repeat_batch(vocab_size: int, seq_len: int, batch_size: int = 64, seed: int = 0) -> RepeatBatch:
    """Random tokens with a segment of 10-20 tokens repeated later (chapter 08's task), for the copying scores."""
    generator = torch.Generator().manual_seed(seed)
    longest = min(20, seq_len // 2)
    return repeated_segments(batch_size, seq_len, vocab_size, (min(10, longest), longest), generator=generator)


@torch.no_grad()
def head_scores(model: TextTransformer, text_ids: Tensor, newline_id: int | None, repeats: RepeatBatch) -> dict:
    """Every role's score for every head: ``{role: [[score per head] per layer]}`` and ``"uniform"``.

    Args:
        text_ids: ``(B, L)`` windows of held-out text.
        newline_id: the newline's token id (None: no newline score).
        repeats: a :func:`repeat_batch`.
    """
    device = model.unembed.weight.device
    _, text_weights = model(text_ids.to(device), return_weights=True)
    _, repeat_weights = model(repeats.tokens.to(device), return_weights=True)
    scores: dict = {role: [] for role in ROLES}
    is_newline = text_ids == newline_id if newline_id is not None else torch.zeros_like(text_ids, dtype=torch.bool)
    for w_text, w_rep in zip(text_weights, repeat_weights):
        w_text, w_rep = w_text.float().cpu(), w_rep.float().cpu()
        scores["previous"].append(previous_token_score(w_text).tolist())
        scores["first"].append(first_token_score(w_text).tolist())
        scores["newline"].append(key_class_score(w_text, is_newline).tolist())
        scores["induction"].append(induction_score(w_rep, repeats).tolist())
        scores["duplicate"].append(duplicate_token_score(w_rep, repeats).tolist())
    L = text_ids.size(1)
    scores["uniform"] = {
        "previous": uniform_previous_token_score(L), "first": uniform_first_token_score(L),
        "newline": uniform_key_class_score(is_newline), "induction": uniform_induction_score(repeats),
        "duplicate": uniform_induction_score(repeats),
    }
    return scores


def roles(scores: dict) -> dict[str, list[tuple[int, int]]]:
    """The ``(layer, head)`` pairs whose score reaches :func:`role_threshold` of the role's baseline."""
    found = {}
    for role in ROLES:
        bar = role_threshold(scores["uniform"][role])
        found[role] = [(l, h) for l, row in enumerate(scores[role]) for h, s in enumerate(row) if s >= bar]
    return found


def describe_heads(scores: dict, labels: Sequence[str] = ROLES) -> str:
    """A table: one row per head (``L1.h0``: layer 1, head 0), its score for every role; then
    the uniform baseline (``unif.``) and the threshold a head has the role from (``bar``)."""
    lines = ["head  " + "".join(f"{r:>10}" for r in labels)]
    for l, row in enumerate(scores[labels[0]]):
        for h in range(len(row)):
            lines.append(f"L{l + 1}.h{h} " + "".join(f"{scores[r][l][h]:10.2f}" for r in labels))
    lines.append("unif. " + "".join(f"{scores['uniform'][r]:10.2f}" for r in labels))
    lines.append("bar   " + "".join(f"{role_threshold(scores['uniform'][r]):10.2f}" for r in labels))
    return "\n".join(lines)
