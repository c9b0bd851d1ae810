"""Probes: where a trained model's heads look, what switching parts off costs, and the groups
of sentences the chapters measure them on.

- :func:`attention_shares`: where one token's attention goes (to "not", to the sentiment
  word, ...), head by head.
- :func:`~mha_lib.silence_heads` (in :mod:`mha_lib.heads`) switches heads off;
  :func:`feed_forward_off` switches the feed-forward sublayers off.
- :func:`four_groups`: plain or negated, with a positive or a negative sentiment word
  (chapter 07); :func:`halves_groups` and :func:`halves_for_batch`: "not" and the
  sentiment word in the same or in different halves of the sentence (chapter 12).
- :func:`template_of`, :func:`halves_strata` and :func:`stratified_halves`: the same
  comparison without the templates' confound, made inside groups of sentences with the same
  template and length (chapter 12's model answer).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from ..validation import check_whole
from .data import Example, Vocab, batch_examples, check_examples
from .model import SentimentClassifier, device_of

__all__ = [
    "FOUR_GROUPS",
    "HALVES_GROUPS",
    "ROLES",
    "TEMPLATES",
    "attention_shares",
    "feed_forward_off",
    "four_groups",
    "halves_for_batch",
    "halves_groups",
    "halves_strata",
    "stratified_halves",
    "template_of",
    "without_sentiment_word",
]

ROLES = ("<cls>", "not", "sentiment word", "other words")
# Short names of chapter 07's groups: "not" or not, and the sentiment word's own polarity.
FOUR_GROUPS = ("plain+", "plain-", "negated+", "negated-")
HALVES_GROUPS = ("plain", "same half", "different halves")
# The three templates of make_datasets, each named by a short negated sentence it draws.
TEMPLATES = ("the movie was not good", "i did not find the plot boring", "not a good film")


@torch.no_grad()
def attention_shares(
    model: SentimentClassifier,
    examples: Sequence[Example],
    vocab: Vocab,
    query: str = "<cls>",
    layer: int = 0,
) -> dict[str, Tensor]:
    """Where one token's attention goes, per head, averaged over ``examples``.

    Args:
        query: whose attention: ``"<cls>"``, ``"sentiment word"`` or ``"not"`` (then
            every example must be negated).
        layer: which encoder layer.

    Returns:
        ``{role: (H,) tensor}`` for the roles ``"<cls>"``, ``"not"``, ``"sentiment word"``
        and ``"other words"``: the mean share of the query's attention that goes to
        tokens of that role (0 for "not" in a sentence without it). Per head, the four
        shares sum to 1.
    """
    if query not in ROLES[:3]:
        raise ValueError(f"query must be one of {ROLES[:3]}, got {query!r}")
    if not isinstance(model, SentimentClassifier):
        raise TypeError(f"model must be a SentimentClassifier, got {type(model).__name__}")
    check_examples(examples, "examples")
    layer, num_layers = check_whole(layer, "layer"), len(model.layers)
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer must be in [0, {num_layers}), the model's encoder layers, got {layer}")
    if query == "not" and not all(e.negated for e in examples):
        raise ValueError('query="not" needs negated examples only')
    was_training = model.training
    model.eval()
    try:
        _, weights = model(batch_examples(examples, vocab).to(device_of(model)), return_weights=True)
    finally:
        model.train(was_training)
    w = weights[layer].cpu()  # (N, H, L, L)

    rows = torch.arange(len(examples))
    has_not = torch.tensor([e.negated for e in examples])
    position = {  # in the batch, word i sits at i + 1 (after <cls>)
        "<cls>": torch.zeros(len(examples), dtype=torch.long),
        "not": torch.tensor([e.negation_pos + 1 if e.negated else 0 for e in examples]),
        "sentiment word": torch.tensor([e.sentiment_pos + 1 for e in examples]),
    }
    looking = w[rows, :, position[query]]  # (N, H, L): the query's row of every head
    shares = {role: looking[rows, :, position[role]] for role in ROLES[:3]}  # (N, H) each
    shares["not"] = shares["not"] * has_not[:, None]
    shares["other words"] = looking.sum(-1) - sum(shares.values())
    return {role: shares[role].mean(dim=0) for role in ROLES}  # (H,) each


@contextmanager
def feed_forward_off(model: nn.Module) -> Iterator[None]:
    """Inside a ``with`` block, every encoder layer's feed-forward sublayer adds nothing.

    A forward hook replaces the output of each ``layer.feed_forward`` by zeros, so the
    layer computes ``x + attention(norm1(x))`` and passes it on unchanged: what reaches
    the classifier is then the embedding plus what the heads brought. The hooks are
    removed on exit; no weight changes.

        with feed_forward_off(model):
            accuracy = evaluate(model, test, vocab)
    """
    layers = [layer for layer in getattr(model, "layers", []) if isinstance(getattr(layer, "feed_forward", None), nn.Module)]
    if not layers:
        raise TypeError(f"feed_forward_off needs a model whose .layers have a feed_forward module; "
                        f"got {type(model).__name__}")

    def zero(module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> Tensor:
        return torch.zeros_like(output)

    handles = [layer.feed_forward.register_forward_hook(zero) for layer in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def four_groups(examples: Sequence[Example]) -> dict[str, list[Example]]:
    """Chapter 07's groups: ``{"plain+", "plain-", "negated+", "negated-"}``, where + / -
    is the sentiment word's own polarity (so "negated+" is "not good", label negative)."""
    check_examples(examples, "examples")
    groups: dict[str, list[Example]] = {name: [] for name in FOUR_GROUPS}
    for e in examples:
        groups[("negated" if e.negated else "plain") + ("+" if e.word_is_positive else "-")].append(e)
    return groups


def without_sentiment_word(examples: Sequence[Example]) -> list[tuple[str, ...]]:
    """The sentences with their sentiment word deleted ("the movie was not bad" -> "the movie was
    not"): what a model reads when the word it would look at is absent."""
    check_examples(examples, "examples")
    return [e.tokens[:e.sentiment_pos] + e.tokens[e.sentiment_pos + 1:] for e in examples]


def halves_group(example: Example) -> str:
    """``"plain"``, ``"same half"`` or ``"different halves"``: where "not" and the sentiment
    word fall when the sentence (``<cls>`` included, ``n`` tokens) is cut at ``n // 2``."""
    if not example.negated:
        return "plain"
    split = (len(example.tokens) + 1) // 2  # in positions: word i sits at i + 1, after <cls>
    same = (example.negation_pos + 1 < split) == (example.sentiment_pos + 1 < split)
    return "same half" if same else "different halves"


def halves_groups(examples: Sequence[Example]) -> dict[str, list[int]]:
    """Indices of ``examples`` in each of :data:`HALVES_GROUPS` (chapter 12)."""
    groups: dict[str, list[int]] = {name: [] for name in HALVES_GROUPS}
    for i, e in enumerate(examples):
        groups[halves_group(e)].append(i)
    return groups


def halves_for_batch(tokens: Tensor, pad_id: int = Vocab.pad_id) -> Tensor:
    """Chapter 12's restriction for a padded batch ``(B, L)``: a bool mask ``(B, 2, L, L)``.

    With ``n`` real tokens in a row (``<cls>`` included), head 0 may attend to the
    positions ``[0, n // 2)`` and head 1 to ``[n // 2, L)``, for every query; the
    padding is masked by the model anyway.
    """
    if not isinstance(tokens, Tensor) or tokens.dim() != 2:
        raise ValueError(f"tokens must be a (B, L) tensor of token ids, got {getattr(tokens, 'shape', tokens)!r}")
    B, L = tokens.shape
    lengths = (tokens != pad_id).sum(dim=1)  # (B,) <cls> and the words
    first = torch.arange(L, device=tokens.device)[None, :] < (lengths // 2)[:, None]  # (B, L) head 0's keys
    return torch.stack([first, ~first], dim=1)[:, :, None, :].expand(B, 2, L, L)  # (B, H, Lq, Lk)


def template_of(example: Example) -> str:
    """Which of :data:`TEMPLATES` drew ``example`` (see :func:`~mha_lib.sentiment.data.make_datasets`).

    The first word tells: "i" ("i did not find the plot boring", "i found ..."), "not", "a" or
    "an" ("not a good film", "a good film"), anything else (a determiner: "the movie was not
    good"). Raises ``ValueError`` for a sentence no template can draw.
    """
    first = example.tokens[0] if example.tokens else ""
    if first == "i":
        return TEMPLATES[1]
    if first in ("not", "a", "an"):
        return TEMPLATES[2]
    if first in ("the", "this", "that"):
        return TEMPLATES[0]
    raise ValueError(f"no template of the task starts with {first!r}: {example.tokens!r}")


def halves_strata(examples: Sequence[Example]) -> dict[tuple[str, int], dict[str, list[int]]]:
    """Indices of the **negated** ``examples`` by stratum, then by halves group (chapter 12).

    A stratum is ``(template_of(example), number of words)``. Where "not" and the sentiment word
    fall follows from the template and the optional parts, so :func:`halves_groups` mixes the
    templates unevenly; inside a stratum the sentences share template and length, and only the
    optional parts decide the halves. Returns ``{(template, words): {"same half": [...],
    "different halves": [...]}}``, every stratum that holds a negated example, sorted; a group
    may be empty.
    """
    strata: dict[tuple[str, int], dict[str, list[int]]] = {}
    for i, e in enumerate(examples):
        if e.negated:
            key = (template_of(e), len(e.tokens))
            strata.setdefault(key, {"same half": [], "different halves": []})[halves_group(e)].append(i)
    return dict(sorted(strata.items()))


def stratified_halves(runs: Sequence[tuple[Sequence[bool] | Tensor, Sequence[Example]]]) -> dict[str, float]:
    """Same half against different halves, compared only inside strata (chapter 12).

    Args:
        runs: one ``(correct, examples)`` pair per run: ``correct`` ``(N,)`` bools (a list, a
            string of ``"0"``/``"1"`` or a bool tensor), whether the model got ``examples[i]``
            right. A stratum is one run's sentences of one template and one length
            (:func:`halves_strata`); only the strata that hold both groups count.

    Returns:
        ``{"same half": a_s, "different halves": a_d, "gap": a_d - a_s, "sentences": n,
        "strata": k}``: ``a_s = sum_k w_k acc_same_k / sum_k w_k`` (``a_d`` alike) over the
        ``k`` strata holding both groups, with ``w_k = n_same n_diff / (n_same + n_diff)``
        (the Cochran-Mantel-Haenszel weights: a stratum counts for as much as its smaller
        group allows); ``n`` sentences in those strata. Without such a stratum the three
        accuracies are NaN.
    """
    total = same = different = 0.0
    sentences = strata = 0
    for correct, examples in runs:
        if isinstance(correct, str):
            correct = [c == "1" for c in correct]
        elif isinstance(correct, Tensor):
            correct = correct.tolist()
        if len(correct) != len(examples):
            raise ValueError(f"correct has {len(correct)} entries for {len(examples)} examples")
        for groups in halves_strata(examples).values():
            n_s, n_d = len(groups["same half"]), len(groups["different halves"])
            if n_s and n_d:
                weight = n_s * n_d / (n_s + n_d)
                total += weight
                same += weight * sum(bool(correct[i]) for i in groups["same half"]) / n_s
                different += weight * sum(bool(correct[i]) for i in groups["different halves"]) / n_d
                sentences, strata = sentences + n_s + n_d, strata + 1
    a_s, a_d = (same / total, different / total) if total else (math.nan, math.nan)
    return {"same half": a_s, "different halves": a_d, "gap": a_d - a_s, "sentences": sentences, "strata": strata}
