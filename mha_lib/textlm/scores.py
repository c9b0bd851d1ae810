"""What a head of the language model does, scored before looking, each next to a baseline.

Every score is the mean attention weight a head puts on the keys a role names, over the
queries where the role applies, and every score has the value a head that spreads its
weight **uniformly** over the visible keys would get. A head "has" a role when its score is
at least :func:`role_threshold` of that baseline (fixed in advance, as in chapter 08):

- **previous token** (on held-out text): query ``t`` -> key ``t - 1``;
- **self** (on held-out text): query ``t`` -> key ``t``, the token itself;
- **local** (on held-out text): query ``t`` -> the :data:`LOCAL_WINDOW` keys ``t - 3 ... t``, over
  the queries that see more keys than that (a head that reads the last few tokens, whatever
  they are: a *positional* role, as previous token and self are);
- **first token** (on held-out text): query ``t`` -> key 0, where many heads park weight
  they don't need (an "attention sink", Xiao et al. 2024);
- **newline** (on held-out text): query ``t`` -> the keys that are newlines, against their
  share of the visible keys; **quote** the same for the keys that hold a quote mark (``'`` or
  ``"``), the delimiters of strings. Exercise 9.1's roles **indent** and **punctuation**
  (:data:`CLASS_ROLES`) are scored this way too, with the study, for its solution; the chapter
  leaves them to the learner;
- **induction** and **duplicate token** (on random tokens with a repeated segment, chapter
  08's :func:`~mha_lib.induction.repeated_segments`): from the second copy to the token after
  the earlier occurrence, or to the earlier occurrence itself.

Chapter 08's score functions are reused, not copied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ..induction.data import RepeatBatch, repeated_segments
from ..induction.scores import (
    _check_weights,
    duplicate_token_score,
    induction_score,
    previous_token_score,
    self_score,
    uniform_induction_score,
    uniform_previous_token_score,
)
from ..induction.run import role_threshold  # halfway from the uniform baseline to 1, as in chapter 08
from ..validation import check_positive_int
from .ablation import CLASSES, vocab_classes
from .model import TextTransformer
from .tokenizer import Tokenizer

__all__ = ["CLASS_ROLES", "LOCAL_WINDOW", "ROLES", "delimiter_keys", "first_token_score", "key_class_score",
           "local_score", "role_threshold", "head_scores", "repeat_batch", "uniform_first_token_score",
           "uniform_key_class_score", "uniform_local_score"]

ROLES = ("previous", "self", "local", "first", "newline", "quote", "induction", "duplicate")
CLASS_ROLES = ("indent", "punctuation")  # exercise 9.1's, recorded by the study for its solution
LOCAL_WINDOW = 4  # the local role's keys: the current token and the three before it


def first_token_score(weights: Tensor) -> Tensor:
    """``(H,)``: mean weight from query ``t`` to key 0, over ``t >= 1`` and the batch."""
    return weights[:, :, 1:, 0].mean(dim=(0, 2))


def uniform_first_token_score(seq_len: int) -> float:
    """Uniform attention's first-token score: the previous-token baseline, mean of ``1 / (t + 1)``."""
    return uniform_previous_token_score(seq_len)


def _local_keys(seq_len: int, window: int) -> tuple[Tensor, Tensor]:
    """``(keys (L, L), queries (L,))`` bool: keys ``t - window + 1 ... t``, queries ``t >= window``."""
    t = torch.arange(seq_len)
    gap = t[:, None] - t[None, :]  # query minus key
    return (gap >= 0) & (gap < window), t >= window


def local_score(weights: Tensor, window: int = LOCAL_WINDOW) -> Tensor:
    """``(H,)``: mean total weight from query ``t`` to keys ``t - window + 1 ... t``, over the
    queries ``t >= window`` (which see more keys than the window) and the batch.

    Args:
        weights: ``(B, H, L, L)``, ``L > window``.
    """
    _, _, L = _check_weights(weights)
    window = check_positive_int(window, "window")
    if L <= window:
        raise ValueError(f"the local score needs sequences longer than its window ({window}), got {L} tokens")
    keys, queries = _local_keys(L, window)
    picked = (weights * keys.to(weights.device, weights.dtype)).sum(-1)  # (B, H, L)
    return picked[:, :, queries.to(weights.device)].mean(dim=(0, 2))


def uniform_local_score(seq_len: int, window: int = LOCAL_WINDOW) -> float:
    """Uniform attention's :func:`local_score`: the mean of ``window / (t + 1)`` over ``t = window ... L - 1``."""
    seq_len, window = check_positive_int(seq_len, "seq_len"), check_positive_int(window, "window")
    if seq_len <= window:
        raise ValueError(f"the local score needs sequences longer than its window ({window}), got {seq_len}")
    return sum(window / (t + 1) for t in range(window, seq_len)) / (seq_len - window)


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


def delimiter_keys(tokenizer: Tokenizer, text_ids: Tensor) -> dict[str, Tensor]:
    """``{"quote", "indent", "punctuation": (B, L) bool}``: where ``text_ids`` hold a token with a quote
    mark (``'`` or ``"``), and tokens of chapter 09's classes indent and punctuation
    (:func:`~.ablation.vocab_classes`, exercise 9.1's keys)."""
    strings = tokenizer.tokens(range(len(tokenizer)))
    has_quote = torch.tensor(["'" in s or '"' in s for s in strings])
    classes = vocab_classes(tokenizer)
    ids = text_ids.cpu()
    return {"quote": has_quote[ids], **{role: classes[ids] == CLASSES.index(role) for role in CLASS_ROLES}}


@torch.no_grad()
def head_scores(model: TextTransformer, text_ids: Tensor, newline_id: int | None, repeats: RepeatBatch,
                delimiters: Mapping[str, Tensor] | None = None) -> dict:
    """Every role's score for every head: ``{role: [[score per head] per layer]}`` and ``"uniform"``.

    Args:
        text_ids: ``(B, L)`` windows of held-out text.
        newline_id: the newline's token id (None: no newline score).
        repeats: a :func:`repeat_batch`.
        delimiters: ``{role: (B, L) bool}``, the keys of more roles scored like newline
            (:func:`delimiter_keys`: quote, indent, punctuation); roles not given are not scored.
    """
    device = model.unembed.weight.device
    _, text_weights = model(text_ids.to(device), return_weights=True)
    _, repeat_weights = model(repeats.tokens.to(device), return_weights=True)
    is_newline = text_ids == newline_id if newline_id is not None else torch.zeros_like(text_ids, dtype=torch.bool)
    for role, keys in (delimiters or {}).items():
        if not isinstance(keys, Tensor) or keys.dtype != torch.bool or keys.shape != text_ids.shape:
            got = f"{keys.dtype} {tuple(keys.shape)}" if isinstance(keys, Tensor) else type(keys).__name__
            raise ValueError(f"delimiters[{role!r}] must be a bool tensor shaped like text_ids "
                             f"{tuple(text_ids.shape)}, True at the role's keys; got {got}")
    key_sets = {"newline": is_newline.cpu(), **{role: keys.cpu() for role, keys in (delimiters or {}).items()}}
    text_roles = {
        "previous": previous_token_score, "self": self_score, "local": local_score, "first": first_token_score,
        **{role: (lambda w, keys=keys: key_class_score(w, keys)) for role, keys in key_sets.items()},
    }
    scores: dict = {role: [] for role in text_roles}
    scores["induction"], scores["duplicate"] = [], []
    for w_text, w_rep in zip(text_weights, repeat_weights):
        w_text, w_rep = w_text.float().cpu(), w_rep.float().cpu()
        for role, score in text_roles.items():
            scores[role].append(score(w_text).tolist())
        scores["induction"].append(induction_score(w_rep, repeats).tolist())
        scores["duplicate"].append(duplicate_token_score(w_rep, repeats).tolist())
    L = text_ids.size(1)
    scores["uniform"] = {
        "previous": uniform_previous_token_score(L), "self": uniform_previous_token_score(L),
        "local": uniform_local_score(L), "first": uniform_first_token_score(L),
        **{role: uniform_key_class_score(keys) for role, keys in key_sets.items()},
        "induction": uniform_induction_score(repeats), "duplicate": uniform_induction_score(repeats),
    }
    return scores


def roles(scores: dict) -> dict[str, list[tuple[int, int]]]:
    """The ``(layer, head)`` pairs whose score reaches :func:`role_threshold` of the role's baseline."""
    found = {}
    for role in (r for r in ROLES + CLASS_ROLES if r in scores):
        bar = role_threshold(scores["uniform"][role])
        found[role] = [(l, h) for l, row in enumerate(scores[role]) for h, s in enumerate(row) if s >= bar]
    return found


def describe_heads(scores: dict, labels: Sequence[str] = ROLES) -> str:
    """A table: one row per head (``L1.h0``: layer 1, head 0), its score for every role; then
    the uniform baseline (``unif.``) and the threshold a head has the role from (``bar``)."""
    width = [max(10, len(r) + 2) for r in labels]
    lines = ["head  " + "".join(f"{r:>{w}}" for r, w in zip(labels, width))]
    for l, row in enumerate(scores[labels[0]]):
        for h in range(len(row)):
            lines.append(f"L{l + 1}.h{h} " + "".join(f"{scores[r][l][h]:{w}.2f}" for r, w in zip(labels, width)))
    lines.append("unif. " + "".join(f"{scores['uniform'][r]:{w}.2f}" for r, w in zip(labels, width)))
    lines.append("bar   " + "".join(f"{role_threshold(scores['uniform'][r]):{w}.2f}" for r, w in zip(labels, width)))
    return "\n".join(lines)
