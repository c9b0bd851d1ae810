"""The seed study: chapter 07's and chapter 11's models trained from many independent seeds,
and measured the same way as in the chapters.

One trained model is one sample: another seed gives another model. The chapters therefore
quote what held over the runs of this study, read from the committed file ``study.json``
next to this module (:func:`load_study`), and assert it where they state it. Re-run it with
``make study`` or ``python -m mha_lib.sentiment study --help``.

**Independent runs.** Run ``seed`` builds its model after ``seed_everything(seed)``, draws its
own sentences with ``make_datasets(seed=data_seed)`` (``data_seed = seed``) and shuffles its
batches with a generator seeded with ``seed``: no two runs of one configuration share their
initialisation or their data. The configurations differ in the number of heads, ``H`` in
:data:`HEADS`, at a fixed ``d_model`` (so ``d_k = d_model / H``). Runs of different ``H`` with
the same seed share their data: comparisons across ``H`` are paired.

**Kernel paths are replicas, not samples.** The two-head runs are repeated on a second CPU
kernel path (:data:`REPLICA_KERNEL`, plain C++ kernels chosen with ``ATEN_CPU_CAPABILITY``).
A replica is the same seed and data computed with other rounding; it says how often the
rounding alone changes an outcome, and is marked ``"replica": true`` and left out of every
count (:func:`independent`).

**Thresholds come from baselines**, fixed before any trained run is read (:func:`baselines`):
chance accuracy, the share of attention that uniform attention gives one token, and what an
untrained model does (recorded in every run, ``"untrained"``).

Each run holds ``seed``, ``data_seed``, ``num_heads``, ``replica``, the kernel path, its
``"baselines"``, and:

- ``"untrained"``: the shares of ``<cls>``'s attention (negated sentences) on "not" and on the
  sentiment word, per head, and the accuracy, before training;
- ``"heads"`` (chapter 07): the held-out accuracy per group; each head's share of ``<cls>``'s
  attention per group and role; the sentiment word's share on "not" and "not"'s on the
  sentiment word; the accuracy with each head ablated three ways (zero, mean, resample) and
  with the feed-forward sublayer off; each term's direct logit attribution per group; and,
  after every epoch, the held-out accuracy and each head's share of ``<cls>``'s attention on
  "not" and on the sentiment word (``"history"``);
- ``"halves"`` (chapter 11, two heads only): accuracy on plain sentences and on negated ones
  with "not" and the sentiment word in the same or in different halves, for the model trained
  freely (tested free and tested restricted) and for one trained restricted; and
  ``"halves_correct"``: for each of the three, one character per held-out sentence, ``1`` when
  it was right, in the order of the run's held-out sentences.
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
from .attribution import ABLATIONS, ablated_accuracy, logit_attribution
from .data import Example, Vocab, make_datasets
from .model import SentimentClassifier, predict, train_model
from .probes import FOUR_GROUPS, ROLES, attention_shares, feed_forward_off, four_groups, halves_for_batch, halves_groups

__all__ = ["CONFIG", "FINDINGS", "HEADS", "PARTS", "REPLICA_KERNEL", "ROLES", "RUNS", "STATED", "STUDY_FILE", "Study",
           "baselines", "check_findings", "count_findings", "independent", "kernel_path", "kernel_path_changes", "learned", "other_head_of", "robust_seeds", "load_study", "findings_table", "wording",
           "measure_halves", "measure_heads", "negation_head_of", "other_heads_of", "run_seed", "run_study",
           "save_study", "study_jobs"]

STUDY_FILE = Path(__file__).with_name("study.json")
PARTS = ("heads", "halves")
# The chapters' set-up: the data, the model and its training (num_heads is each configuration's).
CONFIG: dict[str, Any] = {
    "n_train": 2000, "n_test": 500,
    "model": {"d_model": 48, "num_heads": 2, "num_layers": 1, "d_ff": 96},
    "training": {"epochs": 12, "batch_size": 32, "lr": 5e-3},
}
HEADS = (1, 2, 4, 8)  # heads per configuration, d_model fixed at 48: d_k = 48, 24, 12, 6
RUNS = {1: 24, 2: 40, 4: 24, 8: 24}  # independent runs (seeds 0, 1, ...) per number of heads
REPLICA_KERNEL = "default"  # the two-head runs again, on PyTorch's plain C++ CPU kernels
THREADS = 1  # per training process: a model this small trains fastest on one thread
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


# --- Baselines, fixed before any trained model is read ---------------------------------------

CHANCE = 0.5  # two labels, balanced: a guess is right half the time


def baselines(test: Sequence[Example]) -> dict[str, float]:
    """The baselines of a run's held-out sentences and the thresholds derived from them.

    - ``chance``: 0.5. ``learned_at``: a run *learned* when it errs on at most a tenth as
      many sentences as a guess would, on negated and on plain sentences alike (0.95);
      ``near_chance``: an accuracy closer to chance than to ``learned_at`` (below 0.725).
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
    return {"chance": CHANCE, "learned_at": learned_at, "near_chance": (CHANCE + learned_at) / 2,
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

    two = {name: groups[name] for name in ("negated", "plain")}
    negated = [test[i] for i in groups["negated"]]
    ablation = {how: {f"head {h}": _accuracy(ablated_accuracy(model, test, vocab, [h], how, train, seed), two)
                      for h in range(model.num_heads)} for how in ABLATIONS}
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
        "feed_forward_off": ffn_off,
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


def study_jobs(seeds: Sequence[int] | None = None, heads: Sequence[int] = HEADS,
               replicas: bool = True) -> list[tuple[int, int, bool]]:
    """``(seed, num_heads, replica)`` for every run: each ``H`` in ``heads`` with its
    :data:`RUNS` seeds (or ``seeds``), and, if ``replicas``, the two-head seeds again as replicas."""
    jobs = [(seed, H, False) for H in heads for seed in (seeds if seeds is not None else range(RUNS[H]))]
    if replicas and 2 in heads:
        jobs += [(seed, 2, True) for seed, H, _ in list(jobs) if H == 2]
    return jobs


def _job(job: tuple[int, int, bool, str, tuple[str, ...]]) -> Run:
    seed, num_heads, replica, device, parts = job
    torch.set_num_threads(THREADS)  # this process is ours
    return run_seed(seed, num_heads, parts, device, replica=replica)


def run_study(jobs: Sequence[tuple[int, int, bool]], parts: Iterable[str] = PARTS, device: torch.device | str = "cpu",
              workers: int = 2, progress: bool = True) -> list[Run]:
    """Every job of :func:`study_jobs`, in ``workers`` processes of one thread each, with a
    progress bar on stderr; the replicas in processes that take :data:`REPLICA_KERNEL`.
    Returns the runs in the order of ``jobs``."""
    import multiprocessing

    parts = tuple(parts)
    runs: dict[tuple[int, int, bool], Run] = {}
    started, done = time.perf_counter(), 0
    for replica in (False, True):
        # a replica repeats the heads part only: chapter 07's measurements on other rounding
        job_parts = tuple(p for p in parts if p == "heads") if replica else parts
        batch = [(seed, H, rep, str(device), job_parts) for seed, H, rep in jobs if rep == replica]
        batch.sort(key=lambda job: -job[1])  # the slowest (most heads) first: the workers end together
        if not batch:
            continue
        saved = os.environ.get("ATEN_CPU_CAPABILITY")
        if replica:  # a spawned process reads it when it imports torch
            os.environ["ATEN_CPU_CAPABILITY"] = REPLICA_KERNEL
        try:
            with multiprocessing.get_context("spawn").Pool(max(1, workers)) as pool:
                for run in pool.imap_unordered(_job, batch):
                    runs[(run["seed"], run["num_heads"], run["replica"])] = run
                    done += 1
                    if progress:
                        _progress("study", done, len(jobs), started, unit="runs")
        finally:
            if saved is None:
                os.environ.pop("ATEN_CPU_CAPABILITY", None)
            else:
                os.environ["ATEN_CPU_CAPABILITY"] = saved
    return [runs[job] for job in jobs]


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
                        "parts": list(PARTS), "heads": list(HEADS), "replica_kernel": REPLICA_KERNEL},
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


# --- What the chapters state, as code -------------------------------------------------------
# Each finding names the runs it speaks to and a test on one run; every threshold comes from
# the run's baselines. STATED says how much of the chapters' wording each count must support;
# tests/test_study.py checks the committed file against it.


def independent(run: Run, num_heads: int | None = 2) -> bool:
    """A run that counts: not a replica (and with ``num_heads`` heads, unless None)."""
    return not run.get("replica") and (num_heads is None or run["num_heads"] == num_heads)


def learned(run: Run) -> bool:
    """Whether the freely trained model reached ``learned_at`` (0.95) on the held-out negated
    and plain sentences (from the "halves" part alone: on all three of its groups)."""
    at = run["baselines"]["learned_at"] if "baselines" in run else 0.95
    if "heads" in run:
        accuracy = run["heads"]["accuracy"]
        return min(accuracy["negated"], accuracy["plain"]) >= at
    return min(run["halves"]["free, tested free"].values()) >= at


def negation_head_of(run: Run) -> int:
    """The head that puts the most of ``<cls>``'s attention on "not" in negated sentences."""
    shares = run["heads"]["cls_to_not"]
    return max(range(len(shares)), key=shares.__getitem__)


def other_heads_of(run: Run) -> list[int]:
    """Every head but the negation head."""
    return [h for h in range(run["num_heads"]) if h != negation_head_of(run)]


def _role(run: Run) -> float:
    return run["baselines"]["role"]


def _brings_word(run: Run, h: int) -> bool:
    """Head ``h`` puts at least the role threshold of ``<cls>``'s attention on the sentiment word
    in "not good" or in "not bad"."""
    shares = run["heads"]["cls_shares"]
    return max(shares[g]["sentiment word"][h] for g in ("negated+", "negated-")) >= _role(run)


def _ablated(run: Run, how: str, head: int, group: str) -> float:
    return run["heads"]["ablation"][how][f"head {head}"][group]


def other_head_of(run: Run) -> int:
    """The head, other than the negation head, that puts most on the sentiment word (negated)."""
    shares = run["heads"]["cls_shares"]
    return max(other_heads_of(run), key=lambda h: max(shares[g]["sentiment word"][h] for g in ("negated+", "negated-")))


def _first_epoch(curve: Sequence[float], at: float) -> int | None:
    return next((epoch for epoch, acc in enumerate(curve, 1) if acc >= at), None)


def learning_order(run: Run) -> str:
    """``"plain first"``, ``"together"`` or ``"negated first"``: which group of held-out
    sentences reached ``learned_at`` at an earlier epoch (ties are ties)."""
    at = run["baselines"]["learned_at"]
    plain, negated = (_first_epoch(run["heads"]["history"][g], at) for g in ("plain", "negated"))
    plain, negated = (e if e is not None else 10**6 for e in (plain, negated))
    return "together" if plain == negated else "plain first" if plain < negated else "negated first"


_TWO = lambda r: independent(r) and "heads" in r  # noqa: E731
_TWO_LEARNED = lambda r: _TWO(r) and learned(r)  # noqa: E731


def _near_chance(run: Run, accuracy: float) -> bool:
    return accuracy < run["baselines"]["near_chance"]


def _some_head_needed(run: Run) -> bool:
    """Mean-ablating one head (some head) leaves negated or plain sentences near chance."""
    return any(_near_chance(run, _ablated(run, "mean", h, group))
               for h in range(run["num_heads"]) for group in ("negated", "plain"))


def _negation_role_in_time(run: Run) -> bool:
    """The negation head's share on "not" reached ``role`` by the epoch at which the negated
    sentences reached ``learned_at``."""
    history, h = run["heads"]["history"], negation_head_of(run)
    role_at = _first_epoch([shares[h] for shares in history["cls_to_not"]], _role(run))
    learned_by = _first_epoch(history["negated"], run["baselines"]["learned_at"])
    return role_at is not None and learned_by is not None and role_at <= learned_by


_NEGATED = ("negated+", "negated-")


def _looks_at_not_where_not_word(run: Run, h: int) -> bool:
    """Head ``h`` brings the sentiment word (``role``) in one negated group and has ``role`` on
    "not" in the other."""
    shares = run["heads"]["cls_shares"]
    word = [shares[g]["sentiment word"][h] >= _role(run) for g in _NEGATED]
    on_not = [shares[g]["not"][h] >= _role(run) for g in _NEGATED]
    return (word[0] and on_not[1]) or (word[1] and on_not[0])


def _toward(run: Run, term: str | int, groups: Sequence[str]) -> float:
    """A term's mean direct logit attribution toward the right label over ``groups``."""
    key = term if isinstance(term, str) else f"head {term}"
    return sum(run["heads"]["logit_attribution"][g][key] for g in groups) / len(groups)



FINDINGS: dict[str, tuple[Callable[[Run], bool], Callable[[Run], bool]]] = {
    # section 4: training
    "untrained: no head has a role": (
        lambda r: not r.get("replica"),
        lambda r: max(r["untrained"]["cls_to_not"] + r["untrained"]["cls_to_word"]) < _role(r)),
    "not learned: negated sentences near chance": (
        lambda r: _TWO(r) and not learned(r), lambda r: _near_chance(r, r["heads"]["accuracy"]["negated"])),
    "plain sentences learned first": (_TWO_LEARNED, lambda r: learning_order(r) == "plain first"),
    "plain and negated learned together": (_TWO_LEARNED, lambda r: learning_order(r) == "together"),
    "negated sentences learned first": (_TWO_LEARNED, lambda r: learning_order(r) == "negated first"),
    "negation head in place when negated sentences are learned": (_TWO_LEARNED, _negation_role_in_time),
    # section 5: what the heads look at
    "a negation head": (_TWO_LEARNED, lambda r: r["heads"]["cls_to_not"][negation_head_of(r)] >= _role(r)),
    "the other head brings the sentiment word": (_TWO_LEARNED, lambda r: _brings_word(r, other_head_of(r))),
    "the other head brings the word in both negated groups": (
        _TWO_LEARNED, lambda r: min(r["heads"]["cls_shares"][g]["sentiment word"][other_head_of(r)] for g in _NEGATED)
        >= _role(r)),
    "the other head looks at 'not' in the other negated group": (
        _TWO_LEARNED, lambda r: _looks_at_not_where_not_word(r, other_head_of(r))),
    "plain: the negation head brings the sentiment word": (
        _TWO_LEARNED, lambda r: max(r["heads"]["cls_shares"][g]["sentiment word"][negation_head_of(r)]
                                    for g in ("plain+", "plain-")) >= _role(r)),
    "the sentiment word looks at 'not' more than uniform attention": (
        _TWO_LEARNED, lambda r: max(r["heads"]["word_to_not"]) > r["baselines"]["uniform"]),
    # sections 6 and 7: ablation, direct logit attribution
    "zero-ablating the other head: negated near chance": (
        _TWO_LEARNED, lambda r: _near_chance(r, _ablated(r, "zero", other_head_of(r), "negated"))),
    "mean-ablating the other head: negated near chance": (
        _TWO_LEARNED, lambda r: _near_chance(r, _ablated(r, "mean", other_head_of(r), "negated"))),
    "resample-ablating the other head: negated near chance": (
        _TWO_LEARNED, lambda r: _near_chance(r, _ablated(r, "resample", other_head_of(r), "negated"))),
    "zero-ablating the negation head: plain near chance": (
        _TWO_LEARNED, lambda r: _near_chance(r, _ablated(r, "zero", negation_head_of(r), "plain"))),
    "mean-ablating the negation head: plain near chance": (
        _TWO_LEARNED, lambda r: _near_chance(r, _ablated(r, "mean", negation_head_of(r), "plain"))),
    "resample-ablating the negation head: plain near chance": (
        _TWO_LEARNED, lambda r: _near_chance(r, _ablated(r, "resample", negation_head_of(r), "plain"))),
    "mean-ablating the negation head: negated not near chance": (
        _TWO_LEARNED, lambda r: not _near_chance(r, _ablated(r, "mean", negation_head_of(r), "negated"))),
    "negation head, negated: zero-ablation costs more than mean": (
        _TWO_LEARNED, lambda r: _ablated(r, "zero", negation_head_of(r), "negated")
        < _ablated(r, "mean", negation_head_of(r), "negated")),
    "negation head, negated: resample costs more than mean": (
        _TWO_LEARNED, lambda r: _ablated(r, "resample", negation_head_of(r), "negated")
        < _ablated(r, "mean", negation_head_of(r), "negated")),
    "negated: other head's logit term > negation head's": (
        _TWO_LEARNED, lambda r: _toward(r, other_head_of(r), _NEGATED) > _toward(r, negation_head_of(r), _NEGATED)),
    "feed-forward term toward the right label in every group": (
        _TWO_LEARNED, lambda r: min(_toward(r, "feed-forward", [g]) for g in FOUR_GROUPS) > 0),
    "without the feed-forward network: still learned": (
        _TWO_LEARNED, lambda r: min(r["heads"]["feed_forward_off"][g] for g in ("negated", "plain"))
        >= r["baselines"]["learned_at"]),
}
# section 8: how many heads
for _H in HEADS:
    _RUNS_H = lambda r, H=_H: independent(r, H) and "heads" in r  # noqa: E731
    _s = "s" if _H > 1 else ""
    FINDINGS[f"{_H} head{_s}: learned"] = (_RUNS_H, learned)
    if _H == 1:
        FINDINGS["1 head: negated sentences near chance"] = (
            _RUNS_H, lambda r: _near_chance(r, r["heads"]["accuracy"]["negated"]))
    if _H > 1:
        FINDINGS[f"{_H} heads: mean-ablating one head leaves a group near chance"] = (
            lambda r, f=_RUNS_H: f(r) and learned(r), _some_head_needed)
    if _H > 2:
        FINDINGS[f"{_H} heads: two or more heads on 'not'"] = (
            lambda r, f=_RUNS_H: f(r) and learned(r),
            lambda r: sum(share >= _role(r) for share in r["heads"]["cls_to_not"]) >= 2)
del _H, _RUNS_H, _s


def kernel_path_changes(study: Study) -> tuple[int, int]:
    """``(k, n)``: of the ``n`` seeds run on both kernel paths, ``k`` learned on one path and not
    on the other: how often rounding alone changes a run's outcome (a robustness check, not a sample)."""
    replicas = {(r["seed"], r["num_heads"]): r for r in study.runs if r.get("replica") and "heads" in r}
    pairs = [(r, replicas[(r["seed"], r["num_heads"])]) for r in study.runs
             if not r.get("replica") and "heads" in r and (r["seed"], r["num_heads"]) in replicas]
    return sum(learned(a) != learned(b) for a, b in pairs), len(pairs)


# How much of the chapters' wording each count supports: "all" (in every run), "most" (in more
# than half of them), "some" (in at least one, not all), "none".
STATED: dict[str, str] = {
    "untrained: no head has a role": "all",
    "not learned: negated sentences near chance": "most",
    "plain sentences learned first": "most",
    "plain and negated learned together": "some",
    "negated sentences learned first": "some",
    "negation head in place when negated sentences are learned": "most",
    "a negation head": "most",
    "the other head brings the sentiment word": "most",
    "the other head brings the word in both negated groups": "some",
    "the other head looks at 'not' in the other negated group": "most",
    "plain: the negation head brings the sentiment word": "most",
    "the sentiment word looks at 'not' more than uniform attention": "most",
    "zero-ablating the other head: negated near chance": "most",
    "mean-ablating the other head: negated near chance": "all",
    "resample-ablating the other head: negated near chance": "all",
    "zero-ablating the negation head: plain near chance": "most",
    "mean-ablating the negation head: plain near chance": "most",
    "resample-ablating the negation head: plain near chance": "most",
    "mean-ablating the negation head: negated not near chance": "most",
    "negation head, negated: zero-ablation costs more than mean": "most",
    "negation head, negated: resample costs more than mean": "most",
    "negated: other head's logit term > negation head's": "most",
    "feed-forward term toward the right label in every group": "all",
    "without the feed-forward network: still learned": "most",
    "1 head: learned": "none",
    "1 head: negated sentences near chance": "most",
    "2 heads: learned": "most",
    "4 heads: learned": "most",
    "8 heads: learned": "all",
    "2 heads: mean-ablating one head leaves a group near chance": "all",
    "4 heads: mean-ablating one head leaves a group near chance": "all",
    "8 heads: mean-ablating one head leaves a group near chance": "most",
    "4 heads: two or more heads on 'not'": "some",
    "8 heads: two or more heads on 'not'": "most",
}


def robust_seeds(study: Study, num_heads: int = 2) -> list[int]:
    """The seeds whose ``num_heads``-head run learned on both kernel paths, in order."""
    replicas = {r["seed"]: r for r in study.runs if r.get("replica") and r["num_heads"] == num_heads and "heads" in r}
    return [r["seed"] for r in study.runs if independent(r, num_heads) and "heads" in r
            and r["seed"] in replicas and learned(r) and learned(replicas[r["seed"]])]


def wording(k: int, n: int) -> str:
    """What ``k`` of ``n`` runs support: ``"all"``, ``"most"`` (more than half), ``"some"``
    (at least one, at most half) or ``"none"``."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    return "all" if k == n else "none" if k == 0 else "most" if k > n / 2 else "some"


def findings_table(study: Study, names: Sequence[str] | None = None) -> str:
    """The counts of some :data:`FINDINGS` (default: all of them) as a table, one per line:
    ``k of n`` runs, the wording the count supports, and the finding. Raises ``AssertionError``
    when a count no longer supports the wording :data:`STATED` gives the text."""
    counts = count_findings(study)
    names = list(FINDINGS) if names is None else list(names)
    if unknown := [name for name in names if name not in FINDINGS]:
        raise KeyError(f"unknown findings: {unknown}")
    lines = [f"{'runs':>10}  {'wording':7}  finding"]
    for name in names:
        k, n = counts[name]
        said = wording(k, n)
        if name in STATED and STATED[name] != said:
            raise AssertionError(f"{name!r}: {k} of {n} runs is {said!r}, the text says {STATED[name]!r}")
        lines.append(f"{k:>3} of {n:<3}  {said:7}  {name}")
    return "\n".join(lines)


def count_findings(study: Study) -> dict[str, tuple[int, int]]:
    """``{finding: (k, n)}``: each of :data:`FINDINGS` holds in ``k`` of the ``n`` runs it speaks to."""
    return {name: study.count(test, where=applies) for name, (applies, test) in FINDINGS.items()}


def check_findings(run: Run) -> dict[str, bool]:
    """``{finding: holds}`` for the :data:`FINDINGS` that speak to this run."""
    return {name: bool(test(run)) for name, (applies, test) in FINDINGS.items() if applies(run)}
