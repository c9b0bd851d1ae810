"""What chapters 07 and 11 state about the seed study, as code (:data:`FINDINGS`), and how much
of their wording each count supports (:data:`STATED`).

Each finding names the runs it speaks to and a test on one run; every threshold comes from
the run's baselines (:func:`~mha_lib.sentiment.run.baselines`), never from the results. The
chapters print the counts with :func:`findings_table`, which fails when a re-run study stops
supporting the text; ``tests/test_study.py`` checks the committed file against :data:`STATED`.
The runs themselves: :mod:`.run` (one run) and :mod:`.study` (many, and the file).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .attribution import ABLATIONS
from .probes import FOUR_GROUPS
from .run import Run
from .study import HEADS, Study

__all__ = ["FINDINGS", "STATED", "check_findings", "count_findings", "findings_table", "independent",
           "kernel_path_changes", "learned", "learning_order", "negation_head_of", "other_head_of",
           "other_heads_of", "robust_seeds", "wording"]


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
}
# section 6: each head ablated each way (zero, mean, resample), on the
# group it should matter for: the other head on negated sentences, the negation head on plain ones
for _who, _head_of, _group in (("other", other_head_of, "negated"), ("negation", negation_head_of, "plain")):
    for _how in ABLATIONS:
        FINDINGS[f"{_how}-ablating the {_who} head: {_group} near chance"] = (
            _TWO_LEARNED, lambda r, how=_how, head_of=_head_of, group=_group:
            _near_chance(r, _ablated(r, how, head_of(r), group)))
del _who, _head_of, _group, _how
FINDINGS |= {
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
