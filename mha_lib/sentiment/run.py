"""One run of chapter 07's and chapter 12's seed study: a model built and trained from one
seed, then measured the same way as in the chapters (:func:`run_seed`).

**A run is independent.** Run ``seed`` builds its model after ``seed_everything(seed)``, draws
its own sentences with ``make_datasets(seed=data_seed)`` (``data_seed = seed``) and shuffles
its batches with a generator seeded with ``seed``: no two runs of one configuration share their
initialisation or their data. The configurations differ in the number of heads, at a fixed
``d_model`` (so ``d_k = d_model / H``). Runs of different ``H`` with the same seed share their
data: comparisons across ``H`` are paired.

**Thresholds come from baselines**, fixed before any trained model is read (:func:`baselines`):
chance accuracy, the share of attention that uniform attention gives one token, and what an
untrained model does (recorded in every run, ``"untrained"``).

Each run holds ``seed``, ``data_seed``, ``num_heads``, ``replica``, the kernel path
(:func:`kernel_path`), its ``"baselines"``, and:

- ``"untrained"``: the shares of ``<cls>``'s attention (negated sentences) on "not" and on the
  sentiment word, per head, and the accuracy, before training;
- ``"heads"`` (chapter 07, :func:`measure_heads`): the held-out accuracy per group; each
  head's share of ``<cls>``'s attention per group and role; the sentiment word's share on "not"
  and "not"'s on the sentiment word; the accuracy with each head ablated three ways (zero,
  mean, resample), with each head mean-ablated by its mean over the plain reference
  sentences only and over the negated ones only (``"mean_from"``, the control of
  mean-ablation), and with the feed-forward sublayer off; each term's direct logit attribution
  per group; and, after every epoch, the held-out accuracy and each head's share of
  ``<cls>``'s attention on "not" and on the sentiment word (``"history"``);
- ``"halves"`` (chapter 12, two heads only, :func:`measure_halves`): accuracy on plain
  sentences and on negated ones with "not" and the sentiment word in the same or in different
  halves, for the model trained freely (tested free and tested restricted) and for one trained
  restricted; and ``"halves_correct"``: for each of the three, one character per held-out
  sentence, ``1`` when it was right, in the order of the run's held-out sentences.

Many runs make the study (:mod:`.study`); what the chapters state about them is in
:mod:`.findings`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ..device import seed_everything
from ..studies import kernel_path
from .attribution import ABLATIONS, ablated_accuracy, logit_attribution
from .data import Example, Vocab, make_datasets
from .model import SentimentClassifier, predict, train_model
from .probes import (FOUR_GROUPS, attention_shares, feed_forward_off, four_groups, halves_for_batch, halves_groups,
                     without_sentiment_word)

__all__ = ["CHANCE", "CONFIG", "PARTS", "Run", "baselines", "kernel_path", "measure_halves", "measure_heads",
           "measure_untrained", "run_seed"]

PARTS = ("heads", "halves")
# The chapters' set-up: the data, the model and its training (num_heads is each configuration's).
CONFIG: dict[str, Any] = {
    "n_train": 2000, "n_test": 500,
    "model": {"d_model": 48, "num_heads": 2, "num_layers": 1, "d_ff": 96},
    "training": {"epochs": 12, "batch_size": 32, "lr": 5e-3},
}
Run = dict[str, Any]


def _round(x: float) -> float:
    return round(float(x), 4)


def _accuracy(correct: torch.Tensor, groups: dict[str, list[int]]) -> dict[str, float]:
    return {name: _round(correct[idx].float().mean()) if idx else float("nan") for name, idx in groups.items()}


# --- Baselines, fixed before any trained model is read ---------------------------------------

CHANCE = 0.5  # two labels, balanced: a guess is right half the time


def baselines(test: Sequence[Example]) -> dict[str, float]:
    """The baselines of a run's held-out sentences and the thresholds derived from them.

    - ``chance``: 0.5. ``learned_at``: a run *learned* when it errs on at most a tenth as
      many sentences as a guess would, on negated and on plain sentences alike (0.95);
      ``near_chance``: an accuracy closer to chance than to ``learned_at`` (below 0.725);
      ``inverted``: as far *below* chance as ``near_chance`` is above it (below 0.275): the
      model gives the opposite label more often than a guess would, by that much.
    - ``uniform``: the share of ``<cls>``'s attention that one token gets when ``<cls>``
      attends uniformly to its ``n`` tokens (itself included): the mean of ``1 / n`` over
      the negated held-out sentences. ``role``: a head *has a role* (a "negation head")
      when its share on that token is at least halfway from ``uniform`` to 1.
    """
    negated = [e for e in test if e.negated]
    if not negated:
        raise ValueError("baselines need negated held-out sentences")
    uniform = sum(1 / (len(e.tokens) + 1) for e in negated) / len(negated)
    learned_at = 1 - (1 - CHANCE) / 10
    near_chance = (CHANCE + learned_at) / 2
    return {"chance": CHANCE, "learned_at": learned_at, "near_chance": near_chance, "inverted": 2 * CHANCE - near_chance,
            "uniform": _round(uniform), "role": _round(uniform + (1 - uniform) / 2)}


# --- Measurements -----------------------------------------------------------------------------


def _shares(model: SentimentClassifier, examples: Sequence[Example], vocab: Vocab, query: str = "<cls>") -> dict[str, list[float]]:
    return {role: [_round(s) for s in share.tolist()] for role, share in attention_shares(model, examples, vocab, query).items()}


def measure_untrained(model: SentimentClassifier, test: Sequence[Example], vocab: Vocab) -> dict[str, Any]:
    """What a model does before training: ``<cls>``'s shares on "not" and on the sentiment word
    (negated sentences), per head, and its accuracy."""
    negated = [e for e in test if e.negated]
    shares = _shares(model, negated, vocab)
    labels = torch.tensor([e.label for e in test])
    return {"cls_to_not": shares["not"], "cls_to_word": shares["sentiment word"],
            "accuracy": _round((predict(model, test, vocab) == labels).float().mean())}


def measure_heads(model: SentimentClassifier, test: Sequence[Example], vocab: Vocab,
                  train: Sequence[Example], seed: int = 0) -> dict[str, Any]:
    """Chapter 07's measurements of a trained model (see the module's docstring).

    ``train``: the reference sentences of mean- and resample-ablation; ``seed``: the draw of
    resample-ablation."""
    labels = torch.tensor([e.label for e in test])
    groups = {"negated": [i for i, e in enumerate(test) if e.negated],
              "plain": [i for i, e in enumerate(test) if not e.negated]}
    by_group = four_groups(test)
    index = {id(e): i for i, e in enumerate(test)}
    groups |= {name: [index[id(e)] for e in examples] for name, examples in by_group.items()}

    def accuracy() -> dict[str, float]:
        return _accuracy(predict(model, test, vocab) == labels, groups)

    negated = [test[i] for i in groups["negated"]]
    ablation = {how: {f"head {h}": _accuracy(ablated_accuracy(model, test, vocab, [h], how, train, seed), groups)
                      for h in range(model.num_heads)} for how in ABLATIONS}
    # the control of mean-ablation: the mean over the plain (or the negated) reference sentences only
    mean_from = {kind: {f"head {h}": _accuracy(ablated_accuracy(model, test, vocab, [h], "mean", reference), groups)
                        for h in range(model.num_heads)}
                 for kind, reference in (("plain", [e for e in train if not e.negated]),
                                         ("negated", [e for e in train if e.negated]))}
    with feed_forward_off(model):
        ffn_off = accuracy()
    attribution = {}
    for name in FOUR_GROUPS:
        examples = by_group[name]
        toward = torch.tensor([1.0 if e.label else -1.0 for e in examples])  # + pushes toward the right label
        attribution[name] = {term: _round((value * toward).mean())
                             for term, value in logit_attribution(model, examples, vocab).items()}
    return {
        "accuracy": accuracy(),
        "cls_shares": {name: _shares(model, by_group[name], vocab) for name in FOUR_GROUPS},
        "cls_to_not": _shares(model, negated, vocab)["not"],
        "word_to_not": _shares(model, negated, vocab, query="sentiment word")["not"],
        "not_to_word": _shares(model, negated, vocab, query="not")["sentiment word"],
        "ablation": ablation,
        "mean_from": mean_from,
        "feed_forward_off": ffn_off,
        "without_word": {kind: _round(predict(model, without_sentiment_word([test[i] for i in groups[kind]]),
                                              vocab).float().mean()) for kind in ("plain", "negated")},
        "logit_attribution": attribution,
    }


def measure_halves(model: SentimentClassifier, test: Sequence[Example], vocab: Vocab,
                   restricted: bool) -> tuple[dict[str, float], str]:
    """Accuracy per :data:`~mha_lib.sentiment.probes.HALVES_GROUPS`, with or without the
    restriction, and which sentences were right (``"0110..."``, in the order of ``test``)."""
    labels = torch.tensor([e.label for e in test])
    mask = halves_for_batch if restricted else None
    correct = predict(model, test, vocab, mask=mask) == labels
    return _accuracy(correct, halves_groups(test)), "".join("1" if c else "0" for c in correct.tolist())


def _build(seed: int, num_heads: int, vocab: Vocab, device: torch.device) -> SentimentClassifier:
    seed_everything(seed)  # the starting weights, as in the chapters: seed, then build
    return SentimentClassifier(len(vocab), **(CONFIG["model"] | {"num_heads": num_heads})).to(device)


def run_seed(seed: int, num_heads: int = 2, parts: Iterable[str] = PARTS, device: torch.device | str = "cpu",
             replica: bool = False, data: tuple[list[Example], list[Example]] | None = None) -> Run:
    """Train and measure the models of one independent run; returns one run of the study.

    The run draws its own sentences (``data_seed = seed``), unless ``data`` (train, test) is
    given (the tests use small ones; ``data_seed`` is then None). ``"halves"`` needs two heads
    and is skipped otherwise. ``replica`` marks a run that repeats another on another kernel path.
    """
    parts = list(parts)
    if unknown := set(parts) - set(PARTS):
        raise ValueError(f"parts must be among {PARTS}, got {sorted(unknown)}")
    device = torch.device(device)
    vocab = Vocab.for_task()
    train, test = data or make_datasets(CONFIG["n_train"], CONFIG["n_test"], seed=seed)
    negated = [e for e in test if e.negated]
    run: Run = {"seed": seed, "data_seed": None if data else seed, "num_heads": num_heads, "replica": replica, **kernel_path(device),
                "baselines": baselines(test)}
    model = _build(seed, num_heads, vocab, device)
    run["untrained"] = measure_untrained(model, test, vocab)
    history: dict[str, list] = {"cls_to_not": [], "cls_to_word": []}

    def record(epoch: int, trained: SentimentClassifier) -> None:
        shares = _shares(trained, negated, vocab)
        history["cls_to_not"].append(shares["not"])
        history["cls_to_word"].append(shares["sentiment word"])

    curves = train_model(model, train, vocab, test=test, seed=seed, reports=0, on_epoch=record, **CONFIG["training"])
    history |= {"negated": [_round(a) for a in curves["test_negated"]],
                "plain": [_round(a) for a in curves["test_plain"]]}
    if "heads" in parts:
        run["heads"] = measure_heads(model, test, vocab, train, seed) | {"history": history}
    if "halves" in parts and num_heads == 2:
        restricted = _build(seed, num_heads, vocab, device)
        train_model(restricted, train, vocab, seed=seed, reports=0, mask=halves_for_batch, **CONFIG["training"])
        measured = {"free, tested free": measure_halves(model, test, vocab, restricted=False),
                    "free, tested restricted": measure_halves(model, test, vocab, restricted=True),
                    "trained restricted": measure_halves(restricted, test, vocab, restricted=True)}
        run["halves"] = {name: groups for name, (groups, _) in measured.items()}
        run["halves_correct"] = {name: correct for name, (_, correct) in measured.items()}
    return run
