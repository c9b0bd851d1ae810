"""Checks for chapter 09's exercises: a score for a head role of the learner's choosing (9.1) and
the heads that mean-ablation says matter for one token class (9.2).

**9.1.** A role names, for every query, the keys a head with that role attends to and the queries
where it applies (:data:`ROLES`):

- ``"same token"``: from query ``t`` to the *earlier* keys ``s < t`` that hold the same token as
  ``t``, over the queries that have one;
- ``"punctuation"``, ``"indent"``: from query ``t >= 1`` to the visible keys ``s <= t`` whose
  token is of that class (chapter 09's classes, :func:`mha_lib.textlm.ablation.token_classes`).

The score of a head is its total weight on those keys, pooled over those queries and the
batch; uniform attention's score (the baseline) puts ``1 / (t + 1)`` on each visible key. The
class roles' references are :mod:`mha_lib.textlm.scores`' ``key_class_score`` and
``uniform_key_class_score``; the same-token reference is written here. The inputs are windows
of a short text written for the check, tokenized with the shipped tokenizer and with one trained
here on that text (other ids), and rows built for the corners: no earlier same token at all,
the first position's token repeated, a token seen three times, windows of other lengths.

**9.2.** The reference is :func:`mha_lib.textlm.ablation.ablation_losses` (``"increase"``, one
class), on small untrained :class:`~mha_lib.textlm.TextTransformer` s with seeded weights; the
learner's function is called more than once, the model handed over in training or evaluation
mode with gradients on, and must be left as found. The known mistakes are recomputed here with
forward pre-hooks on ``W_o`` (:func:`_ablated`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..textlm import ablation as _ablation
from ..textlm import scores as _scores
from ..textlm.corpus import TOKENIZER_FILE
from ..textlm.model import ModelConfig, TextTransformer
from ..textlm.tokenizer import Tokenizer
from ._core import (CheckResult, Mistake, Verdict, call, check_device_care, check_unchanged, cloned, close, diagnose,
                    expect_tensor, fail, gen, on_meta, randn, run_check)
from ._sentiment import call_leaving_model_alone

__all__ = ["ROLES", "check_class_ablation", "check_role_baseline", "check_role_score"]

ROLES = ("same token", "punctuation", "indent")

# ---------------------------------------------------------------- 9.1: the roles, their keys and queries

# A short text in the corpus's style (a test module), written for the check: indentation, punctuation,
# newlines, and names that come back.
_TEXT = '''import unittest
from test import support


class CounterTests(unittest.TestCase):

    def setUp(self):
        self.counter = {}
        self.words = ["spam", "eggs", "spam", "ham"]

    def test_count(self):
        for word in self.words:
            self.counter[word] = self.counter.get(word, 0) + 1
        self.assertEqual(self.counter["spam"], 2)
        self.assertEqual(self.counter["eggs"], 1)

    def test_empty(self):
        counter = {}
        self.assertEqual(len(counter), 0)
        self.assertFalse(counter)

    def test_keys(self):
        keys = sorted(self.counter)
        self.assertEqual(keys, [])
        with self.assertRaises(KeyError):
            self.counter["ham"]


if __name__ == "__main__":
    unittest.main()
'''


@lru_cache(maxsize=1)
def _tokenizers() -> tuple[Tokenizer, Tokenizer]:
    """(the shipped tokenizer, one trained on :data:`_TEXT` alone, whose ids mean other tokens)."""
    return Tokenizer.load(TOKENIZER_FILE), Tokenizer.train(_TEXT, 70)


def _role(role: Any) -> str:
    """The role's name from the menu (case, ``-`` and ``_`` don't matter), or a verdict listing the menu."""
    name = " ".join(str(role).lower().replace("-", " ").replace("_", " ").split()) if isinstance(role, str) else None
    if name not in ROLES:
        raise fail(f"the check knows no role {role!r}", f"Pick one of {', '.join(map(repr, ROLES))}: "
                                                        "check_role_score(role_score, role=ROLE).")
    return name


def _class_of_vocab(tokenizer: Tokenizer) -> Tensor:
    """``(V,)``: each token's class, an index into ``CLASSES`` (:func:`mha_lib.textlm.ablation.vocab_classes`)."""
    return _ablation.vocab_classes(tokenizer)


def _is_class(tokens: Tensor, tokenizer: Tokenizer, cls: int) -> Tensor:
    """``(B, L)`` bool: True where the token is of class ``cls``."""
    return _class_of_vocab(tokenizer)[tokens.cpu()] == cls


def _earlier(L: int, diagonal: int = -1) -> Tensor:
    return torch.ones(L, L, dtype=torch.bool).tril(diagonal)


def role_keys(role: str, tokens: Tensor, tokenizer: Tokenizer) -> tuple[Tensor, Tensor]:
    """``(keys (B, L, L), queries (B, L))``, both bool, on the CPU: ``keys[b, t, s]`` is True where key ``s`` is one
    the role names for query ``t``; ``queries[b, t]`` where the role applies to query ``t``."""
    tokens = tokens.cpu()
    B, L = tokens.shape
    if role == "same token":
        keys = (tokens[:, :, None] == tokens[:, None, :]) & _earlier(L)  # key s < t holds the token of query t
        return keys, keys.any(-1)
    is_key = _is_class(tokens, tokenizer, _ablation.CLASSES.index(role))  # (B, L)
    keys = is_key[:, None, :] & _earlier(L, 0)  # the visible keys s <= t of the class
    queries = (torch.arange(L) >= 1).expand(B, L)  # query 0 sees only itself
    return keys, queries


def _pooled(w: Tensor, keys: Tensor, queries: Tensor) -> Tensor:
    """``(H,)``: the weight on ``keys`` summed per query, pooled over ``queries`` and the batch."""
    picked = (w * keys[:, None].to(w.dtype)).sum(-1)  # (B, H, L)
    return (picked * queries[:, None].to(w.dtype)).sum(dim=(0, 2)) / queries.sum()


def reference_score(role: str, weights: Tensor, tokens: Tensor, tokenizer: Tokenizer) -> Tensor:
    """The role's score ``(H,)`` (float64, CPU); the class roles by :func:`mha_lib.textlm.scores.key_class_score`."""
    w = weights.detach().to("cpu", torch.float64)
    if role == "same token":
        keys, queries = role_keys(role, tokens, tokenizer)
        return _pooled(w, keys, queries)
    return _scores.key_class_score(w, _is_class(tokens, tokenizer, _ablation.CLASSES.index(role)))


def reference_baseline(role: str, tokens: Tensor, tokenizer: Tokenizer) -> float:
    """Uniform attention's score for the role; the class roles by ``uniform_key_class_score``."""
    if role == "same token":
        keys, queries = role_keys(role, tokens, tokenizer)
        t = torch.arange(tokens.size(1), dtype=torch.float64)
        return (keys.sum(-1) / (t + 1))[queries].mean().item()
    return _scores.uniform_key_class_score(_is_class(tokens, tokenizer, _ablation.CLASSES.index(role)))


SCORE_DEFINITION = {
    "same token": ("role_score(weights, tokens, tokenizer)[h] is the weight of head h from query t on the earlier "
                   "keys s < t that hold the same token as t, summed over those keys, and averaged over the queries "
                   "that have at least one such key, all of the batch's such queries pooled (their sum / their "
                   "number)."),
    "class": ("role_score(weights, tokens, tokenizer)[h] is the weight of head h from query t on the keys s <= t "
              "whose token is of the class, summed over those keys, and averaged over the queries t = 1 ... L - 1 "
              "and the batch."),
}
BASELINE_DEFINITION = {
    "same token": ("role_baseline(tokens, tokenizer) is the score of uniform attention (1 / (t + 1) on each of the "
                   "keys 0 ... t): the number of earlier keys s < t holding the token of t, divided by t + 1, "
                   "averaged over the queries that have at least one, all of the batch's pooled."),
    "class": ("role_baseline(tokens, tokenizer) is the score of uniform attention (1 / (t + 1) on each of the keys "
              "0 ... t): the number of keys s <= t of the class divided by t + 1, averaged over the queries "
              "t = 1 ... L - 1 and the batch."),
}
DEVICE_HINT = ("Make every tensor you create on the weights' (and tokens') device: torch.arange(L, device="
               "tokens.device), and .to(tokens.device) for what a CPU function returns (token_classes does): the "
               "notebook calls this on the model's device.")


def _definition(table: dict[str, str], role: str) -> str:
    return table["same token" if role == "same token" else "class"]


def _row_tokens(role: str, tokenizer: Tokenizer, L: int, g: torch.Generator) -> Tensor:
    """``(3, L)`` ids of the tokenizer, for the corners: for "same token", a row of distinct tokens (no query has
    an earlier same token), one whose first token comes back, one with a token seen three times; for a class, a
    row without the class, one with it at position 0 only, one with it everywhere in its second half."""
    classes = _class_of_vocab(tokenizer)
    V = len(tokenizer)
    distinct = torch.randperm(V, generator=g)[:L]
    if role == "same token":
        first = distinct[torch.randperm(L, generator=g)]
        first[[L // 2, L - 1]] = int(first[0])
        thrice = torch.randperm(V, generator=g)[:L]
        thrice[[1, L // 3, L - 2]] = int(thrice[1])
        return torch.stack([distinct, first, thrice])
    cls = _ablation.CLASSES.index(role)
    members, others = (classes == cls).nonzero().flatten(), (classes != cls).nonzero().flatten()
    pick = lambda pool, n: pool[torch.randint(len(pool), (n,), generator=g)]  # noqa: E731
    without = pick(others, L)
    at_zero = pick(others, L)
    at_zero[0] = pick(members, 1)[0]
    half = pick(others, L)
    half[L // 2:] = pick(members, L - L // 2)
    return torch.stack([without, at_zero, half])


def _windows(tokenizer: Tokenizer, count: int, L: int, g: torch.Generator) -> Tensor:
    ids = torch.tensor(tokenizer.encode(_TEXT))
    starts = torch.randint(ids.numel() - L, (count,), generator=g).tolist()
    return torch.stack([ids[s:s + L] for s in starts])


def _causal_weights(g: torch.Generator, B: int, H: int, L: int, scale: float = 2.0) -> Tensor:
    """Random causal attention weights ``(B, H, L, L)`` in float64: each row sums to 1 over the keys ``<= t``."""
    return randn(g, B, H, L, L, scale=scale).masked_fill(~_earlier(L, 0), float("-inf")).softmax(-1)


def _uniform_weights(B: int, H: int, L: int) -> Tensor:
    tril = _earlier(L, 0).double()
    return (tril / tril.sum(-1, keepdim=True)).expand(B, H, L, L).clone()


def _on_role_keys(keys: Tensor, H: int) -> Tensor:
    """A head that spreads its weight evenly over the role's keys, and looks at itself where there are none."""
    B, L, _ = keys.shape
    w = keys.double()
    w[~keys.any(-1)] = torch.eye(L, dtype=torch.float64).expand(B, L, L)[~keys.any(-1)]
    return (w / w.sum(-1, keepdim=True))[:, None].expand(B, H, L, L).clone()


def _score_cases(role: str) -> list[tuple[Tensor, Tensor, Tokenizer, str, str]]:
    """``(weights, tokens, tokenizer, what the weights are, what the tokens are)`` for every case."""
    shipped, small = _tokenizers()
    g = gen(91)
    text16, text11 = _windows(shipped, 4, 16, g), _windows(small, 3, 11, g)
    corners = _row_tokens(role, shipped, 9, g)
    short = torch.tensor([[5, 5], [7, 8]]) if role == "same token" else _row_tokens(role, small, 2, g)[1:]
    keys16, _ = role_keys(role, text16, shipped)
    on_text16 = "4 windows of 16 tokens of text"
    corner_rows = ("rows built for the corners (one without any repeated token, one whose first token comes back, "
                   "one with a token seen three times)" if role == "same token" else
                   f"rows built for the corners (one without {role}, one with it at position 0 only, one with it in "
                   "its second half)")
    cases = [
        (_causal_weights(g, 4, 3, 16), text16, shipped, "random causal weights (4, 3, 16, 16)", on_text16),
        (_causal_weights(g, 3, 2, 11).float(), text11, small, "random causal weights (3, 2, 11, 11), float32",
         "3 windows of 11 tokens of text, by another tokenizer (other ids)"),
        (_causal_weights(g, 3, 4, 9), corners, shipped, "random causal weights (3, 4, 9, 9)", corner_rows),
        (_causal_weights(g, 2, 3, 2), short, small, "random causal weights (2, 3, 2, 2)", "2 rows of 2 tokens"),
        (_uniform_weights(4, 2, 16), text16, shipped, "uniform causal attention, which scores the uniform baseline "
                                                      f"{reference_baseline(role, text16, shipped):.4f},", on_text16),
        (_on_role_keys(keys16, 2), text16, shipped, "a head that attends only to the role's keys", on_text16),
        (_causal_weights(g, 4, 3, 16), text16, shipped, "other random causal weights of the first input's shape",
         on_text16),
    ]
    for _, tokens, tokenizer, _, _ in cases:
        assert role_keys(role, tokens, tokenizer)[1].any(), "every case has a query where the role applies"
    return cases


def _same_token_mistakes(w: Tensor, tokens: Tensor) -> list[Mistake]:
    B, H, L, _ = w.shape
    same = tokens[:, :, None] == tokens[:, None, :]
    keys = same & _earlier(L)
    queries = keys.any(-1)
    t = torch.arange(L)
    every, not_first = torch.ones(B, L, dtype=torch.bool), (t >= 1).expand(B, L)
    with_self = same & _earlier(L, 0)
    last = keys & (keys.long().cumsum(-1) == keys.long().sum(-1, keepdim=True))  # the latest earlier occurrence
    first = keys & (keys.long().cumsum(-1) == 1)  # the earliest
    anywhere = (same & ~torch.eye(L, dtype=torch.bool)).any(-1)  # another occurrence, earlier or later
    picked = (w * keys[:, None].double()).sum(-1) * queries[:, None]  # (B, H, L)
    per_row = queries.sum(-1)[:, None]
    return [
        ("the key t itself is counted (every token holds the same token as itself)",
         lambda: [_pooled(w, with_self, q) for q in (queries, every, not_first)],
         "Only the earlier keys, s < t: torch.ones(L, L, dtype=torch.bool).tril(-1) (the diagonal below the main "
         "one) and with it."),
        ("the queries without an earlier occurrence are averaged in too (each adds 0)",
         lambda: [_pooled(w, keys, every), _pooled(w, keys, not_first)],
         "Average over the queries that have at least one earlier same token only: queries = keys.any(-1), then "
         "sum / queries.sum()."),
        ("only the latest earlier occurrence is scored, not every earlier one", lambda: _pooled(w, last, queries),
         "A token seen three times has two earlier occurrences: sum the weight on all of them."),
        ("only the first occurrence is scored, not every earlier one", lambda: _pooled(w, first, queries),
         "A token seen three times has two earlier occurrences: sum the weight on all of them."),
        ("the queries are those with another occurrence anywhere, a later one too",
         lambda: _pooled(w, keys, anywhere),
         "The role's queries have an *earlier* key with the same token: keys s < t only."),
        ("queries and keys are swapped (the weights read as [b, h, key, query])",
         lambda: [_pooled(w.transpose(-2, -1), keys, queries), _pooled(w, keys.transpose(1, 2), queries),
                  _pooled(w, keys.transpose(1, 2), keys.transpose(1, 2).any(-1))],
         "weights[b, h, t, s]: rows (dim -2) are queries, columns (dim -1) keys. Broadcast the (B, L, L) mask over "
         "the heads as keys[:, None] and sum over the last axis."),
        ("each sequence was averaged first, then the sequences",
         lambda: [(picked.sum(2)[per_row[:, 0] > 0] / per_row[per_row[:, 0] > 0]).mean(0),
                  (picked.sum(2) / per_row.clamp(min=1)).mean(0)],
         "Pool every scored query of the batch: sum their weights and divide by their number."),
        ("a sum instead of a mean", lambda: [picked.sum(dim=(0, 2)), picked.sum(2).mean(0)],
         "Divide by the number of scored queries, queries.sum(), so that a head that looks only at earlier "
         "occurrences scores 1."),
    ]


def _class_mistakes(role: str, w: Tensor, tokens: Tensor, tokenizer: Tokenizer) -> list[Mistake]:
    B, H, L, _ = w.shape
    cls = _ablation.CLASSES.index(role)
    is_key = _is_class(tokens, tokenizer, cls)
    keys = is_key[:, None, :] & _earlier(L, 0)
    t = torch.arange(L)
    not_first, every = (t >= 1).expand(B, L), torch.ones(B, L, dtype=torch.bool)
    seen = keys.any(-1) & not_first
    others = [(name, c) for c, name in enumerate(_ablation.CLASSES) if c != cls]
    picked = (w * keys[:, None].double()).sum(-1)[:, :, 1:]  # (B, H, L - 1)
    return [
        ("query 0 is counted too (it sees only itself)", lambda: _pooled(w, keys, every),
         "Average over the queries t = 1 ... L - 1: query 0 has no choice but itself."),
        ("only the queries that see a key of the class are averaged", lambda: _pooled(w, keys, seen),
         "Every query t = 1 ... L - 1 counts, also one that sees no key of the class (it scores 0, and so does "
         "the baseline there)."),
        ("the key t itself is left out (keys s < t only)",
         lambda: [_pooled(w, keys & _earlier(L), not_first), _pooled(w, keys & _earlier(L), keys.any(-1))],
         "Key t is visible to query t: count the keys s <= t (the weights are 0 after t anyway)."),
        ("the class marks the queries instead of the keys",
         lambda: [_pooled(w, is_key[:, :, None].expand(B, L, L) & _earlier(L, 0), not_first),
                  _pooled(w.transpose(-2, -1), keys, not_first)],
         "weights[b, h, t, s]: the class is a property of the key s, the last axis: multiply by is_key[:, None, "
         "None, :] and sum over dim -1."),
        *[(f"the keys of another class, {name!r}, not {role!r}",
           (lambda c=c: _pooled(w, _is_class(tokens, tokenizer, c)[:, None, :] & _earlier(L, 0), not_first)),
           f"Mark the keys whose class is CLASSES.index({role!r}) = {cls}.") for name, c in others],
        ("a sum instead of a mean", lambda: [picked.sum(dim=(0, 2)), picked.sum(2).mean(0)],
         "Average over the queries t = 1 ... L - 1 and the batch (.mean)."),
    ]


def _same_token_baseline_mistakes(tokens: Tensor) -> list[Mistake]:
    B, L = tokens.shape
    keys = (tokens[:, :, None] == tokens[:, None, :]) & _earlier(L)
    queries = keys.any(-1)
    count = keys.sum(-1).double()
    t = torch.arange(L, dtype=torch.float64)
    every = torch.ones(B, L, dtype=torch.bool)
    rows = [r for r in range(B) if queries[r].any()]
    return [
        ("the count is divided by L, not by t + 1, the number of keys query t sees",
         lambda: [(count / L)[queries].mean(), (count / L)[queries].sum() / B],
         "Uniform attention spreads over the t + 1 keys 0 ... t that query t sees, so each gets 1 / (t + 1)."),
        ("the key t itself is counted as an occurrence (the diagonal): (count + 1) / (t + 1)",
         lambda: [((count + 1) / (t + 1))[queries].mean(), ((count + 1) / (t + 1)).mean()],
         "Count the earlier keys s < t holding the token of t; key t itself is not an occurrence."),
        ("the count is divided by t, as if query t did not see itself",
         lambda: (count / t.clamp(min=1))[queries].mean(),
         "Query t sees t + 1 keys (0 ... t, itself included): uniform attention gives each 1 / (t + 1)."),
        ("every query is averaged in, also those without an earlier occurrence",
         lambda: [(count / (t + 1)).mean(), (count / (t + 1))[:, 1:].mean()],
         "Average over the queries that have at least one earlier same token, as the score does."),
        ("one earlier occurrence is assumed per query: 1 / (t + 1)",
         lambda: (1 / (t + 1)).expand(B, L)[queries].mean(),
         "A query can have several earlier occurrences: count them, keys.sum(-1)."),
        ("each sequence was averaged first, then the sequences",
         lambda: torch.stack([(count[r] / (t + 1))[queries[r]].mean() for r in rows]).mean(),
         "Pool every scored query of the batch, as the score does."),
    ]


def _class_baseline_mistakes(role: str, tokens: Tensor, tokenizer: Tokenizer) -> list[Mistake]:
    B, L = tokens.shape
    cls = _ablation.CLASSES.index(role)
    is_key = _is_class(tokens, tokenizer, cls).double()
    seen = is_key.cumsum(-1)  # (B, L): keys of the class among 0 ... t
    t = torch.arange(L, dtype=torch.float64)
    others = [(name, c) for c, name in enumerate(_ablation.CLASSES) if c != cls]
    return [
        ("the count is divided by L, not by t + 1, the number of keys query t sees",
         lambda: [(seen / L)[:, 1:].mean(), (seen / L).mean()],
         "Uniform attention spreads over the t + 1 keys 0 ... t that query t sees."),
        ("query 0 is counted too", lambda: (seen / (t + 1)).mean(),
         "Average over the queries t = 1 ... L - 1, as the score does."),
        ("the class's share of the whole sequence, not of the keys each query sees",
         lambda: [is_key.mean(), is_key[:, 1:].mean()],
         "A causal query sees only keys 0 ... t: its share is (number of them of the class) / (t + 1), "
         "is_key.cumsum(-1) / (t + 1)."),
        ("the key t itself is left out", lambda: [((seen - is_key) / t.clamp(min=1))[:, 1:].mean(),
                                                  ((seen - is_key) / (t + 1))[:, 1:].mean()],
         "Key t is visible to query t: the keys 0 ... t, t + 1 of them."),
        *[(f"the keys of another class, {name!r}, not {role!r}",
           (lambda c=c: _scores.uniform_key_class_score(_is_class(tokens, tokenizer, c))),
           f"Mark the keys whose class is CLASSES.index({role!r}) = {cls}.") for name, c in others],
    ]


def _score_shape(out: Any, B: int, H: int) -> None:
    """Name the shapes that show which axes were averaged."""
    if not isinstance(out, Tensor):
        return
    shape = tuple(out.shape)
    if shape == () or (shape == (1,) and H != 1):
        raise fail(f"the scores are one number for all heads, expected one per head ({H},)",
                   "Keep the head axis (dim 1 of the weights): average over the batch and the queries only.")
    if shape == (B,) and B != H:
        raise fail(f"the scores have shape {shape}: one per sequence (averaged over the heads), expected one per "
                   f"head ({H},)", "Keep the head axis (dim 1 of the weights): average over the batch and the "
                                   "queries only.")
    if shape in ((B, H), (H, B)) and B != H:
        raise fail(f"the scores have shape {shape}: one per sequence and head, expected one per head ({H},)",
                   "Pool the batch too: one score per head.")


def check_role_score(fn: Callable[[Tensor, Tensor, Tokenizer], Any], role: str = "same token") -> CheckResult:
    """Check ``fn(weights, tokens, tokenizer) -> (H,)`` for a role of :data:`ROLES`: for one layer's attention weights
    ``(B, H, L, L)`` on token ids ``(B, L)``, each head's total weight on the keys the role names, pooled over the
    queries where it applies and the batch (see the module's docstring); the weights' dtype kept."""

    def body() -> str:
        name = _role(role)
        earlier: list[Tensor] = []
        cases = _score_cases(name)
        for w, tokens, tokenizer, weights_label, tokens_label in cases:
            label = f"{weights_label} on {tokens_label}"
            B, H, L, _ = w.shape
            arg, given = w.clone(), tokens.clone()
            out = call(fn, arg, given, tokenizer, what=f"your function ({label})",
                       forbidden=[_scores.key_class_score])
            check_unchanged(["weights", "tokens"], [w, tokens], [arg, given], "your function")
            _score_shape(out, B, H)
            if isinstance(out, Tensor) and out.is_floating_point() and out.dtype != w.dtype:
                raise fail(f"the scores have dtype {out.dtype} for weights of dtype {w.dtype} ({label})",
                           "Keep the weights' dtype: turn a bool mask into numbers with .to(weights.dtype), and "
                           "don't call .float() / .double() or build the result with torch.tensor([...]).")
            out = expect_tensor(out, f"the scores for {label}", (H,), dtype=w.dtype, explain=", one score per head")
            expected = reference_score(name, w, tokens, tokenizer)
            if not close(out, expected):
                shown = ", ".join(f"{v:.3f}" for v in out.double().tolist())
                w64 = w.double()
                mistakes = (_same_token_mistakes(w64, tokens) if name == "same token"
                            else _class_mistakes(name, w64, tokens, tokenizer))
                stale = ("an earlier call's scores came back (a result kept from call to call)", lambda: list(earlier),
                         "Keep nothing from one call to the next: compute from this call's weights, every time.")
                raise diagnose(out, mistakes + [stale], f"wrong {name} scores for {label} (yours: {shown})",
                               _definition(SCORE_DEFINITION, name), expected=expected, dim=0, axis="head")
            earlier.append(out)
        w, tokens, tokenizer, _, _ = cases[0]
        check_device_care(fn, on_meta(w), on_meta(tokens), tokenizer, what="your function", hint=DEVICE_HINT)
        return (f"right for the {name!r} role on {len(cases)} inputs (corners, two tokenizers, float32 and float64, "
                "uniform attention and a head on the role's keys included), and on another device")

    return run_check("role score", body)


def _number(value: Any, what: str) -> float:
    """A Python float from a real number or a one-element tensor, or a verdict saying what came back."""
    import numbers

    if value is None:
        raise Verdict("not implemented", f"not implemented yet ({what} is None)",
                      "Does your function end with a return statement?")
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise fail(f"{what} is a tensor of shape {tuple(value.shape)}; expected one number",
                       "Average over every query of the batch that the role scores: one number for the whole batch "
                       "(then .item() gives a Python float).")
        if not value.is_floating_point():
            raise fail(f"{what} is a tensor of dtype {value.dtype}; expected a floating-point number",
                       "A share is a fraction: divide as floats (a bool or integer count .double() first).")
        return float(value.detach().to("cpu", torch.float64))
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise fail(f"{what} is {type(value).__name__}; expected one number, a float")
    return float(value)


def check_role_baseline(fn: Callable[[Tensor, Tokenizer], Any], role: str = "same token") -> CheckResult:
    """Check ``fn(tokens, tokenizer) -> float``: uniform causal attention's score for a role of :data:`ROLES` on
    token ids ``(B, L)`` (a Python float or a one-element tensor)."""

    def body() -> str:
        name = _role(role)
        cases = [(tokens, tokenizer, label) for _, tokens, tokenizer, _, label in _score_cases(name)[:4]]
        for tokens, tokenizer, label in cases:
            given = tokens.clone()
            out = call(fn, given, tokenizer, what=f"your function ({label})")
            check_unchanged(["tokens"], [tokens], [given], "your function")
            value = _number(out, f"the baseline for {label}")
            expected = reference_baseline(name, tokens, tokenizer)
            if abs(value - expected) > 1e-5:
                mistakes = (_same_token_baseline_mistakes(tokens) if name == "same token"
                            else _class_baseline_mistakes(name, tokens, tokenizer))
                for what, compute, hint in mistakes:
                    try:
                        candidates = compute()
                    except Exception:  # noqa: BLE001 - a mistake that can't happen on these tokens
                        continue
                    candidates = candidates if isinstance(candidates, list) else [candidates]
                    if any(abs(value - float(c)) <= 1e-5 for c in candidates):
                        raise fail(f"wrong {name} baseline for {label} (yours: {value:.4f}): it looks like {what}",
                                   hint)
                raise fail(f"wrong {name} baseline for {label} (yours: {value:.4f})",
                           _definition(BASELINE_DEFINITION, name))
        tokens, tokenizer, _ = cases[0]
        check_device_care(fn, on_meta(tokens), tokenizer, what="your function", hint=DEVICE_HINT)
        return f"right for the {name!r} role on {len(cases)} batches (corners and two tokenizers included)"

    return run_check("role baseline", body)


# ---------------------------------------------------------------- 9.2: mean-ablation by token class


def _untrained_lm(seed: int, V: int, D: int, H: int, layers: int, L: int, mlp: bool, positions: str,
                  dtype: torch.dtype) -> TextTransformer:
    """A small language model with seeded random weights, large enough that every head changes the loss."""
    torch.manual_seed(seed)
    model = TextTransformer(ModelConfig(vocab_size=V, d_model=D, num_heads=H, num_layers=layers, max_len=L, mlp=mlp,
                                        positions=positions))
    g = gen(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                continue  # LayerNorm: weight 1, bias 0
            if "embedding" in name:
                p.copy_(randn(g, *p.shape))
            elif p.dim() > 1:
                p.copy_(randn(g, *p.shape, scale=1.5 * p.shape[1] ** -0.5))
            else:
                p.copy_(randn(g, *p.shape, scale=0.2))
    return model.to(dtype).eval()


def _text_batch(g: torch.Generator, B: int, L: int, V: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(inputs, targets, classes)``, each ``(B, L)``: windows of a random sequence and a class per target,
    every class present."""
    seq = torch.randint(V, (B, L + 1), generator=g)
    classes = torch.randint(len(_ablation.CLASSES), (B, L), generator=g)
    classes.view(-1)[: len(_ablation.CLASSES)] = torch.arange(len(_ablation.CLASSES))
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous(), classes


def reference_ablation(model: TextTransformer, inputs: Tensor, targets: Tensor, classes: Tensor, cls: int) -> Tensor:
    """``(layers, heads)``, float64: :func:`mha_lib.textlm.ablation.ablation_losses`' increase on class ``cls``."""
    return _ablation.ablation_losses(model, inputs, targets, classes)["increase"][:, :, cls]


@torch.no_grad()
def _w_o_inputs(model: TextTransformer, inputs: Tensor) -> list[Tensor]:
    """Every layer's input to ``W_o`` ``(B, L, D)`` in the intact model."""
    got: list[Tensor] = []
    hooks = [b.attn.W_o.register_forward_pre_hook(lambda m, args: got.append(args[0].detach().clone()))
             for b in model.blocks]
    try:
        model(inputs)
    finally:
        for h in hooks:
            h.remove()
    return got


@torch.no_grad()
def _ablated(model: TextTransformer, inputs: Tensor, targets: Tensor, classes: Tensor, cls: int, *,
             value: Callable[[Tensor, slice], Tensor], heads: Callable[[int, int], list[tuple[int, int]]],
             loss: Callable[[Tensor], Tensor], increase: bool = True, columns: str = "block") -> Tensor:
    """``(layers, heads)``: ``loss(logits)`` (minus the intact model's, with ``increase``) with the heads that
    ``heads(l, h)`` names replaced by ``value(x, cols)`` (``x``: that layer's intact input to ``W_o``)."""
    H, d_k = model.num_heads, model.config.d_model // model.num_heads
    stream = _w_o_inputs(model, inputs)

    def cols(h: int) -> slice | Tensor:
        return slice(h * d_k, (h + 1) * d_k) if columns == "block" else torch.arange(h, H * d_k, H)

    clean = loss(model(inputs))
    out = torch.zeros(model.num_layers, H, dtype=torch.float64)
    for l in range(model.num_layers):
        for h in range(H):
            by_layer: dict[int, list[int]] = {}
            for layer, head in heads(l, h):
                by_layer.setdefault(layer, []).append(head)

            def hook_for(layer: int, chosen: list[int]):
                def hook(module, args):
                    x = args[0].clone()
                    for head in chosen:
                        c = cols(head)
                        x[..., c] = value(stream[layer], c).to(x.dtype)
                    return (x,)
                return hook

            handles = [model.blocks[layer].attn.W_o.register_forward_pre_hook(hook_for(layer, chosen))
                       for layer, chosen in by_layer.items()]
            try:
                ablated = loss(model(inputs))
            finally:
                for handle in handles:
                    handle.remove()
            out[l, h] = ablated - clean if increase else ablated
    return out


CLASS_ABLATION_DEFINITION = ("Entry [l, h] is the mean cross-entropy on the targets of class cls with head h of layer "
                             "l mean-ablated (its d_k columns of the input to model.blocks[l].attn.W_o replaced by "
                             "their mean over the batch and the positions of the intact model), minus the intact "
                             "model's mean cross-entropy on the same targets.")


def _ablation_mistakes(model: TextTransformer, inputs: Tensor, targets: Tensor, classes: Tensor, cls: int,
                       expected: Tensor) -> list[Mistake]:
    H, L = model.num_heads, model.num_layers
    picked = classes == cls

    def ce(logits: Tensor, where: Tensor | None = picked, shift: int = 0) -> Tensor:
        loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, L)
        if shift:
            loss = F.cross_entropy(logits[:, :-1].transpose(1, 2), targets[:, 1:], reduction="none")
            return loss[classes[:, 1:] == cls].double().mean()
        return loss.double().mean() if where is None else loss[where].double().mean()

    mean_all = lambda x, c: x[..., c].mean(dim=(0, 1))  # noqa: E731
    one = lambda l, h: [(l, h)]  # noqa: E731
    table = lambda **kw: lambda: _ablated(model, inputs, targets, classes, cls, **{  # noqa: E731
        "value": mean_all, "heads": one, "loss": ce, **kw})
    return [
        ("the loss decrease (intact minus ablated): the sign is flipped", lambda: -expected,
         "Ablated minus intact: a head the class needs gives a positive increase."),
        ("the ablated loss itself, not its increase over the intact model's", table(increase=False),
         "Subtract the intact model's loss on the same targets of the class."),
        ("zero-ablation (the head's output set to 0), not mean-ablation",
         table(value=lambda x, c: torch.zeros_like(x[..., c])),
         "Replace the head's columns by their mean over the batch and the positions, taken from the intact model's "
         "input to W_o on these inputs: x[..., cols].mean(dim=(0, 1))."),
        ("the mean over the batch only (one mean per position)", table(value=lambda x, c: x[..., c].mean(0)),
         "Average over the batch *and* the positions, dims (0, 1): one (d_k,) vector per head."),
        ("the mean over the positions only (one mean per sequence)",
         table(value=lambda x, c: x[..., c].mean(1, keepdim=True)),
         "Average over the batch *and* the positions, dims (0, 1): one (d_k,) vector per head."),
        ("every entry ablates all heads of its layer at once",
         table(heads=lambda l, h: [(l, k) for k in range(H)]),
         "Ablate one head at a time: only the columns h * d_k : (h + 1) * d_k of head h."),
        ("every entry ablates all heads of the model at once",
         table(heads=lambda l, h: [(m, k) for m in range(L) for k in range(H)]),
         "Ablate one head at a time, in one layer: register the hook on model.blocks[l].attn.W_o only, for head h."),
        ("the ablated heads add up: entry [l, h] ablates heads 0 ... h of layer l together",
         table(heads=lambda l, h: [(l, k) for k in range(h + 1)]),
         "Ablate one head at a time (a fresh hook for each entry, removed before the next)."),
        ("every row ablates the heads of layer 0 (model.blocks[0] instead of model.blocks[l])",
         table(heads=lambda l, h: [(0, h)]), "Row l ablates the heads of model.blocks[l]."),
        ("the loss over all targets, not only those of the class", table(loss=lambda z: ce(z, None)),
         "Average the per-token cross-entropy (reduction='none') over the targets where classes == cls only."),
        ("the loss over the targets of the other classes", table(loss=lambda z: ce(z, ~picked)),
         "Average over the targets where classes == cls."),
        ("the logits scored against the next target (shifted once more): the targets are already one token later",
         table(loss=lambda z: ce(z, shift=1)),
         "logits[:, t] predicts targets[:, t]: F.cross_entropy(logits.transpose(1, 2), targets, reduction='none')."),
        ("head h's columns taken as h, h + H, h + 2H, ... instead of the block h * d_k : (h + 1) * d_k",
         table(columns="interleaved"), "The heads sit side by side in W_o's input: head h is columns "
                                       "h * d_k : (h + 1) * d_k (combine_heads puts them there)."),
        ("the rows and columns are swapped (entry [h, l])", lambda: expected.T,
         "One row per layer, one column per head: out[l, h]."),
    ]


def _call(fn: Callable[..., Any], model: TextTransformer, inputs: Tensor, targets: Tensor, classes: Tensor, cls: int,
          what: str) -> Any:
    """Call ``fn`` on copies of the data; the model must come back as it was handed over."""
    given = cloned(inputs, targets, classes)
    # the undecorated functions: every @torch.no_grad() function shares its wrapper's code object
    forbidden = [f.__wrapped__ for f in (_ablation.ablation_losses, _ablation.class_losses, _ablation.head_means,
                                         _ablation.mean_ablated)]
    try:
        out = call_leaving_model_alone(fn, model, *given, cls, what=what, forbidden=forbidden)
    except Verdict as verdict:
        if "left a hook registered" in verdict.message:
            raise fail("your function left a hook on the model: every later forward pass still ablates a head",
                       "Keep the handle that register_forward_pre_hook returns and call handle.remove() in a "
                       "`finally:` block, right after the ablated forward pass.") from None
        raise
    check_unchanged(["inputs", "targets", "classes"], [inputs, targets, classes], given, "your function")
    return out


def check_class_ablation(fn: Callable[[TextTransformer, Tensor, Tensor, Tensor, int], Any]) -> CheckResult:
    """Check ``fn(model, inputs, targets, classes, cls) -> (layers, heads)``: entry ``[l, h]`` is how much the mean
    cross-entropy on the targets of class ``cls`` rises (nats) when head ``h`` of layer ``l`` alone is mean-ablated
    (its output replaced by its mean over the batch and the positions), as
    :func:`mha_lib.textlm.ablation.ablation_losses`; in the model's dtype; the model left as found (mode,
    ``requires_grad``, weights, no hook), a second call gives the same, and a third after the weights change the
    new model's."""

    def body() -> str:
        cases = [
            dict(seed=95, V=23, D=16, H=2, layers=2, L=12, B=6, mlp=True, positions="rotary", dtype=torch.float32,
                 cls=2, train=True),
            dict(seed=96, V=19, D=12, H=3, layers=2, L=10, B=5, mlp=False, positions="learned", dtype=torch.float64,
                 cls=4, train=False),
            dict(seed=97, V=17, D=16, H=4, layers=3, L=9, B=4, mlp=True, positions="rotary", dtype=torch.float32,
                 cls=0, train=True),
        ]
        calls = 0
        for number, c in enumerate(cases):
            model = _untrained_lm(c["seed"], c["V"], c["D"], c["H"], c["layers"], c["L"], c["mlp"], c["positions"],
                                  c["dtype"])
            if c["train"]:
                model.train()  # handed over in training mode, gradients on: both must come back as they were
            else:
                model.token_embedding.weight.requires_grad_(False)  # must come back False, not all True
            layers, H, cls = c["layers"], c["H"], c["cls"]
            inputs, targets, classes = _text_batch(gen(c["seed"]), c["B"], c["L"], c["V"])
            label = (f"a {layers}-layer model with {H} heads per layer, {str(c['dtype']).replace('torch.', '')}, "
                     f"class {cls} ({_ablation.CLASSES[cls]!r})")
            expected = reference_ablation(model, inputs, targets, classes, cls)
            out = _call(fn, model, inputs, targets, classes, cls, f"your function ({label})")
            calls += 1
            what = f"the loss increases for {label}"
            if isinstance(out, Tensor) and tuple(out.shape) == (H, layers) and H != layers:
                raise fail(f"{what} have shape {(H, layers)}: transposed, expected (layers, heads) = {(layers, H)}",
                           "One row per layer, one column per head: out[l, h].")
            if isinstance(out, Tensor) and tuple(out.shape) == (layers * H,):
                raise fail(f"{what} have shape {(layers * H,)}, expected (layers, heads) = {(layers, H)}",
                           "One row per layer: torch.stack the rows, or .reshape(layers, heads).")
            if isinstance(out, Tensor) and out.dim() == 3 and tuple(out.shape[:2]) == (layers, H):
                raise fail(f"{what} have shape {tuple(out.shape)}: one number per class, expected only class cls's, "
                           f"(layers, heads) = {(layers, H)}", "Average the loss over the targets where "
                                                               "classes == cls only.")
            if isinstance(out, Tensor) and out.is_floating_point() and out.dtype != c["dtype"]:
                raise fail(f"{what} have dtype {out.dtype} for a model of dtype {c['dtype']}",
                           "Keep the model's dtype: torch.stack the loss differences (0-d tensors) into rows, or "
                           "create the table with dtype=logits.dtype; torch.zeros(...) alone is float32, "
                           "torch.tensor([...]) of Python floats too.")
            out = expect_tensor(out, what, (layers, H), dtype=c["dtype"], explain=" (layers, heads)")
            if not close(out, expected):
                shown = "; ".join(", ".join(f"{v:.3f}" for v in row) for row in out.double().tolist())
                raise diagnose(out, _ablation_mistakes(model, inputs, targets, classes, cls, expected),
                               f"wrong loss increases for {label} (yours: {shown})", CLASS_ABLATION_DEFINITION,
                               expected=expected, dim=0, axis="layer")
            if number == 0:
                again = _call(fn, model, inputs, targets, classes, cls, f"your function ({label}, called a second "
                                                                        "time)")
                calls += 1
                if not isinstance(again, Tensor) or not close(again.detach(), out):
                    raise fail(f"a second call on the same model gave other numbers ({label}): something your "
                               "function changes stays changed", "Leave the model as you found it.")
                fresh = _untrained_lm(c["seed"] + 10, c["V"], c["D"], c["H"], c["layers"], c["L"], c["mlp"],
                                      c["positions"], c["dtype"])
                with torch.no_grad():
                    for p, q in zip(model.parameters(), fresh.parameters()):
                        p.copy_(q)
                inputs, targets, classes = _text_batch(gen(c["seed"] + 10), c["B"], c["L"], c["V"])
                expected = reference_ablation(model, inputs, targets, classes, cls)
                third = _call(fn, model, inputs, targets, classes, cls, f"your function ({label}, after its weights "
                                                                        "changed, on other inputs)")
                calls += 1
                if isinstance(third, Tensor) and third.shape == out.shape and close(third.detach(), out) \
                        and not close(expected, out):
                    raise fail(f"after the model's weights changed, on other inputs ({label}), your function "
                               "returned the numbers of the earlier call: it looks like a result kept from call to "
                               "call", "Keep nothing from one call to the next: compute the means and the losses "
                                       "from this call's model and inputs, every time.")
                third = expect_tensor(third, what, (layers, H), dtype=c["dtype"], explain=" (layers, heads)")
                if not close(third, expected):
                    raise fail(f"wrong loss increases for {label} after its weights changed, on other inputs (right "
                               "the first time): something from an earlier call stays",
                               "Compute the means and the losses from this call's model and inputs, every time.")
        return (f"right for {len(cases)} untrained models (2 to 4 heads, 2 and 3 layers, float32 and float64, training "
                f"and evaluation mode) in {calls} calls (twice on the same model, again after its weights changed); "
                "the model is left as it was")

    def on_one_thread() -> str:  # models this small run many times faster on one thread of a busy CPU
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return body()
        finally:
            torch.set_num_threads(threads)

    return run_check("ablation by token class", on_one_thread)
