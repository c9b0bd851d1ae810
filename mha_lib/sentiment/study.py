"""The seed study: chapter 07's and chapter 11's models trained from many seeds, on several
CPU kernel paths, and measured the same way as in the chapters.

One trained model is one sample: another seed, or the same seed on another CPU, gives
another model. The chapters therefore quote what held over the runs of this study, read
from the committed file ``study.json`` next to this module (:func:`load_study`), and
assert it on the model the learner trains. Re-run it with ``make study`` or
``python -m mha_lib.sentiment study --help``.

Each run (one seed on one kernel path) holds:

- ``"heads"`` (chapter 07): the held-out accuracy per group (:func:`four_groups`), each
  head's share of ``<cls>``'s attention per group and role, the share of the sentiment
  word's attention on "not" and of "not"'s on the sentiment word, the accuracy with head 0,
  head 1 or both silenced and with the feed-forward sublayer switched off, and the held-out
  accuracy after each epoch;
- ``"halves"`` (chapter 11): accuracy on plain sentences and on negated ones with "not"
  and the sentiment word in the same or in different halves, for the model trained
  freely (tested free and tested restricted) and for one trained restricted.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..device import seed_everything
from ..heads import silence_heads
from .data import Example, Vocab, make_datasets
from .model import SentimentClassifier, predict, train_model
from .probes import FOUR_GROUPS, ROLES, attention_shares, feed_forward_off, four_groups, halves_for_batch, halves_groups

__all__ = ["CONFIG", "FINDINGS", "PARTS", "ROLES", "STUDY_FILE", "Study", "check_findings", "kernel_path",
           "learned", "load_study", "measure_halves", "measure_heads", "negation_head_of", "run_seed", "run_study",
           "save_study"]

STUDY_FILE = Path(__file__).with_name("study.json")
PARTS = ("heads", "halves")
# The chapters' set-up: the data, the model and its training.
CONFIG: dict[str, Any] = {
    "n_train": 2000, "n_test": 500, "data_seed": 0,
    "model": {"d_model": 48, "num_heads": 2, "num_layers": 1, "d_ff": 96},
    "training": {"epochs": 12, "batch_size": 32, "lr": 5e-3},
}
ABLATIONS = {"head 0": [0], "head 1": [1], "both": [0, 1]}
Run = dict[str, Any]


def kernel_path(device: torch.device | str = "cpu") -> dict[str, Any]:
    """What computed a run: ``path`` (``"AVX512"``, ``"DEFAULT"``, ... or ``"CUDA"``), the
    ``ATEN_CPU_CAPABILITY`` setting, PyTorch's version and the number of CPU threads."""
    device = torch.device(device)
    return {
        "path": "CUDA" if device.type == "cuda" else torch.backends.cpu.get_cpu_capability(),
        "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY") or None,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def _round(x: float) -> float:
    return round(float(x), 4)


def _accuracy(correct: torch.Tensor, groups: dict[str, list[int]]) -> dict[str, float]:
    return {name: _round(correct[idx].float().mean()) if idx else float("nan") for name, idx in groups.items()}


def measure_heads(model: SentimentClassifier, test: Sequence[Example], vocab: Vocab) -> dict[str, Any]:
    """Chapter 07's measurements of a trained two-head model (see the module's docstring)."""
    labels = torch.tensor([e.label for e in test])
    groups = {"negated": [i for i, e in enumerate(test) if e.negated],
              "plain": [i for i, e in enumerate(test) if not e.negated]}
    by_group = four_groups(test)
    index = {id(e): i for i, e in enumerate(test)}
    groups |= {name: [index[id(e)] for e in examples] for name, examples in by_group.items()}

    def accuracy() -> dict[str, float]:
        return _accuracy(predict(model, test, vocab) == labels, groups)

    negated = [test[i] for i in groups["negated"]]
    attn = model.layers[0].self_attn
    silenced = {}
    for name, heads in ABLATIONS.items():
        with silence_heads(attn, heads):
            silenced[name] = accuracy()
    with feed_forward_off(model):
        ffn_off = accuracy()
    return {
        "accuracy": accuracy(),
        "cls_shares": {name: {role: [_round(s) for s in share.tolist()]
                              for role, share in attention_shares(model, by_group[name], vocab).items()}
                       for name in FOUR_GROUPS},
        "cls_to_not": [_round(s) for s in attention_shares(model, negated, vocab)["not"].tolist()],
        "word_to_not": [_round(s) for s in attention_shares(model, negated, vocab, query="sentiment word")["not"]],
        "not_to_word": [_round(s) for s in attention_shares(model, negated, vocab, query="not")["sentiment word"]],
        "silenced": silenced,
        "feed_forward_off": ffn_off,
    }


def measure_halves(model: SentimentClassifier, test: Sequence[Example], vocab: Vocab,
                   restricted: bool) -> dict[str, float]:
    """Accuracy per :data:`~mha_lib.sentiment.probes.HALVES_GROUPS`, with or without the restriction."""
    labels = torch.tensor([e.label for e in test])
    mask = halves_for_batch if restricted else None
    return _accuracy(predict(model, test, vocab, mask=mask) == labels, halves_groups(test))


def _train(seed: int, data: tuple[list[Example], list[Example]], vocab: Vocab, device: torch.device,
           restricted: bool) -> tuple[SentimentClassifier, dict[str, list[float]]]:
    seed_everything(seed)  # the starting weights, as in the chapters: seed, then build
    model = SentimentClassifier(len(vocab), **CONFIG["model"]).to(device)
    history = train_model(model, data[0], vocab, test=data[1], seed=seed, reports=0,
                          mask=halves_for_batch if restricted else None, **CONFIG["training"])
    return model, {"negated": [_round(a) for a in history["test_negated"]],
                   "plain": [_round(a) for a in history["test_plain"]]}


def run_seed(seed: int, parts: Iterable[str] = PARTS, device: torch.device | str = "cpu",
             data: tuple[list[Example], list[Example]] | None = None) -> Run:
    """Train and measure the models of one seed; returns one run of the study."""
    parts = list(parts)
    if unknown := set(parts) - set(PARTS):
        raise ValueError(f"parts must be among {PARTS}, got {sorted(unknown)}")
    device = torch.device(device)
    vocab = Vocab.for_task()
    data = data or make_datasets(CONFIG["n_train"], CONFIG["n_test"], seed=CONFIG["data_seed"])
    test = data[1]
    run: Run = {"seed": seed, **kernel_path(device)}
    free, history = _train(seed, data, vocab, device, restricted=False)
    if "heads" in parts:
        run["heads"] = measure_heads(free, test, vocab) | {"history": history}
    if "halves" in parts:
        restricted, _ = _train(seed, data, vocab, device, restricted=True)
        run["halves"] = {
            "free, tested free": measure_halves(free, test, vocab, restricted=False),
            "free, tested restricted": measure_halves(free, test, vocab, restricted=True),
            "trained restricted": measure_halves(restricted, test, vocab, restricted=True),
        }
    return run


def _progress(label: str, done: int, total: int, started: float, unit: str = "seeds") -> None:
    """A plain-text progress bar on stderr: redrawn in place on a terminal, one line per step otherwise."""
    width = 24
    filled = round(width * done / total)
    line = f"{label:>8} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {unit}, {time.perf_counter() - started:.0f} s"
    if sys.stderr.isatty():
        sys.stderr.write("\r" + line + ("\n" if done == total else ""))
    else:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


def run_study(seeds: Sequence[int], parts: Iterable[str] = PARTS, device: torch.device | str = "cpu",
              progress: bool = True) -> list[Run]:
    """:func:`run_seed` for every seed, in this process (so on its kernel path), with a progress bar."""
    data = make_datasets(CONFIG["n_train"], CONFIG["n_test"], seed=CONFIG["data_seed"])
    label = kernel_path(device)["path"]
    runs, started = [], time.perf_counter()
    for done, seed in enumerate(seeds, 1):
        runs.append(run_seed(seed, parts, device, data))
        if progress:
            _progress(label, done, len(seeds), started)
    return runs


@dataclass
class Study:
    """The runs of a seed study, and small helpers to read them.

    Attributes:
        runs: one dict per seed and kernel path (see the module's docstring).
        config: the data, model and training set-up the runs used.
        about: how the file was made.
    """

    runs: list[Run]
    config: dict[str, Any] = field(default_factory=dict)
    about: dict[str, Any] = field(default_factory=dict)

    @property
    def paths(self) -> list[str]:
        """The kernel paths in the study, in the order of their first run."""
        return list(dict.fromkeys(run["path"] for run in self.runs))

    @property
    def seeds(self) -> list[int]:
        return sorted({run["seed"] for run in self.runs})

    def values(self, fn: Callable[[Run], Any], path: str | None = None,
               where: Callable[[Run], bool] | None = None) -> list[Any]:
        """``fn(run)`` for every run (of one kernel path, and for which ``where`` holds, if given)."""
        return [fn(run) for run in self.runs
                if (path is None or run["path"] == path) and (where is None or where(run))]

    def count(self, predicate: Callable[[Run], bool], path: str | None = None,
              where: Callable[[Run], bool] | None = None) -> tuple[int, int]:
        """``(k, n)``: the predicate holds in ``k`` of the ``n`` runs (selected as in :meth:`values`)."""
        hits = self.values(predicate, path, where)
        return sum(map(bool, hits)), len(hits)

    def span(self, fn: Callable[[Run], float], path: str | None = None,
             where: Callable[[Run], bool] | None = None) -> tuple[float, float]:
        """``(min, max)`` of ``fn(run)`` over the runs (selected as in :meth:`values`)."""
        values = self.values(fn, path, where)
        return min(values), max(values)


def save_study(runs: list[Run], path: str | Path = STUDY_FILE, command: str = "") -> Path:
    """Write the runs as JSON, one run per line (small diffs when a study is re-run)."""
    path = Path(path)
    header = {"about": {"what": "mha_lib.sentiment seed study (chapters 07 and 11)", "command": command,
                        "parts": list(PARTS)},
              "config": CONFIG}
    lines = [json.dumps(run, separators=(",", ":"), sort_keys=False) for run in runs]
    text = json.dumps(header, indent=1)[:-2] + ',\n "runs": [\n' + ",\n".join(lines) + "\n ]\n}\n"
    path.write_text(text)
    return path


def load_study(path: str | Path | None = None) -> Study:
    """The committed study (``mha_lib/sentiment/study.json``), or the file at ``path``."""
    path = Path(path) if path is not None else STUDY_FILE
    if not path.exists():
        raise FileNotFoundError(f"no study at {path}; make one with `python -m mha_lib.sentiment study`")
    data = json.loads(path.read_text())
    return Study(runs=data["runs"], config=data.get("config", {}), about=data.get("about", {}))


# --- What held in every run of the committed study, as code --------------------------------
# Chapters 07 and 11 assert the same on the model the learner trains; tests/test_study.py
# checks that every committed run satisfies them and that freshly trained seeds do too.


def learned(run: Run, at: float = 0.95) -> bool:
    """Whether the freely trained model reached ``at`` on the held-out sentences: on negated
    and on plain ones (from the "halves" part alone: on all three of its groups)."""
    if "heads" in run:
        accuracy = run["heads"]["accuracy"]
        return min(accuracy["negated"], accuracy["plain"]) >= at
    return min(run["halves"]["free, tested free"].values()) >= at


def negation_head_of(run: Run) -> int:
    """The head that puts more of ``<cls>``'s attention on "not" in negated sentences."""
    shares = run["heads"]["cls_to_not"]
    return max(range(len(shares)), key=shares.__getitem__)


def _other(run: Run) -> int:
    return 1 - negation_head_of(run)


# name -> (the part it needs, the test on one run). The "heads" findings concern runs that learned.
FINDINGS: dict[str, tuple[str, Callable[[Run], bool]]] = {
    # One head puts at least 10 points more of <cls>'s attention on "not" than the other.
    "a negation head": ("heads", lambda r: r["heads"]["cls_to_not"][negation_head_of(r)]
                        - r["heads"]["cls_to_not"][_other(r)] >= 0.10),
    # In "not good" or in "not bad", the other head puts at least 90% on the sentiment word.
    "the other head brings the sentiment word": (
        "heads", lambda r: max(r["heads"]["cls_shares"][g]["sentiment word"][_other(r)]
                               for g in ("negated+", "negated-")) >= 0.90),
    # Silencing the other head leaves negated sentences at chance (at most 65% right).
    "without the other head, negated at chance": (
        "heads", lambda r: r["heads"]["silenced"][f"head {_other(r)}"]["negated"] <= 0.65),
    # Averaged over negated sentences, the sentiment word gives "not" 10% or more of a head's attention.
    "the sentiment word looks at 'not'": ("heads", lambda r: max(r["heads"]["word_to_not"]) >= 0.10),
    # Restricting the free model without retraining: some group of sentences falls to 60% or less.
    "the restriction breaks the free model": (
        "halves", lambda r: min(r["halves"]["free, tested restricted"].values()) <= 0.60),
}


def check_findings(run: Run) -> dict[str, bool]:
    """``{finding: holds}`` for the :data:`FINDINGS` this run can speak to (its parts; the
    "heads" ones only if the free model learned)."""
    out = {}
    for name, (part, test) in FINDINGS.items():
        if part in run and (part != "heads" or learned(run)):
            out[name] = bool(test(run))
    return out
