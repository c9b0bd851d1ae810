"""Check for exercise 7.5 (chapter 07): a finding recounted over the seed study's runs, with each
run's own baseline thresholds.

The question: over the independent two-head runs that learned and whose negation head has a role for
"not", in how many did that head already put more of ``<cls>``'s attention on "not" than the other
head *before training*? The check builds its own studies in the study file's format (synthetic runs:
replicas, other numbers of heads, runs that did not learn, and baselines other than the committed
file's, e.g. a task with four labels, so that 0.95 or 0.5 typed in give another count than the run's
own ``learned_at`` and ``role``), calls the learner's function on each and compares with
:func:`leaned_before`.
"""

from __future__ import annotations

import copy
import json
import numbers
import random
from collections.abc import Callable
from typing import Any

import torch

from ..sentiment.findings import independent, learned, negation_head_of
from ..sentiment.study import Study
from ._core import CheckResult, call, fail, run_check
from ._recount_mistakes import MISTAKES

DEFINITION = ("Count over the runs with not run.get('replica'), run['num_heads'] == 2, learned(run) (min of the "
              "negated and plain accuracy >= run['baselines']['learned_at']) and the negation head's trained share "
              "on 'not' >= run['baselines']['role']; k = those whose negation head also has the larger untrained "
              "share on 'not' (run['untrained']['cls_to_not']).")


def _head(run: dict[str, Any], head: str = "trained") -> int:
    """The negation head, as the question defines it ("trained"), or as a mistake picks it."""
    if head == "trained":
        return negation_head_of(run)
    if head == "untrained":
        before = run["untrained"]["cls_to_not"]
        return max(range(len(before)), key=before.__getitem__)
    shares = run["heads"]["cls_to_not"] if head == "smallest" else run["heads"]["cls_shares"][head]["not"]
    pick = min if head == "smallest" else max
    return pick(range(len(shares)), key=shares.__getitem__)


def _counted(run: dict[str, Any], *, replicas: bool = False, heads: int | None = 2, need_learned: bool = True,
             learned_at: float | str | None = None, role: float | str | None = "role", accuracy: str = "both",
             strict: str = "", head: str = "trained", role_before: bool = False) -> bool:
    def below(value: float, at: float, kind: str) -> bool:  # "at least" the threshold passes, unless a mistake says ">"
        return value <= at if kind in strict else value < at

    if run.get("replica") and not replicas:
        return False
    if heads is not None and run["num_heads"] != heads:
        return False
    if need_learned:
        at = run["baselines"][learned_at or "learned_at"] if not isinstance(learned_at, float) else learned_at
        acc = run["heads"]["accuracy"]
        value = {"both": min(acc["negated"], acc["plain"]), "negated": acc["negated"], "plain": acc["plain"]}[accuracy]
        if below(value, at, "learned"):
            return False
    if role is not None:
        threshold = run["baselines"][role] if isinstance(role, str) else role
        h = _head(run, head.rstrip("*"))
        share = run["untrained" if role_before else "heads"]["cls_to_not"][h]
        if head.endswith("*"):  # the role read from the same per-group shares
            share = run["heads"]["cls_shares"][head.rstrip("*")]["not"][h]
        if below(share, threshold, "role"):
            return False
    return True


def _leaned(run: dict[str, Any], *, field: str = "cls_to_not", head_from: str = "heads", grew: bool = False,
            head: str = "trained", against: str = "other", ties: bool = False) -> bool:
    before = run["untrained"][field]
    h = _head(run, head) if head_from == "heads" else max(range(len(before)), key=before.__getitem__)
    if grew:
        return run["heads"]["cls_to_not"][h] > run["untrained"]["cls_to_not"][h]
    if against == "uniform":
        return before[h] > run["baselines"]["uniform"]
    if against == "own word":
        return before[h] > run["untrained"]["cls_to_word"][h]
    others = run["heads"]["cls_to_not"] if against == "trained" else before
    if ties:
        return all(before[h] >= others[o] for o in range(len(before)) if o != h)
    return all(before[h] > others[o] for o in range(len(before)) if o != h)


def leaned_before(study: Study) -> tuple[int, int]:
    """``(k, n)``: of the ``n`` independent two-head runs that learned and whose negation head has a role
    for "not" (its share >= the run's ``role``), the ``k`` in which that head, untrained, already put a larger
    share of ``<cls>``'s attention on "not" than the other head."""
    runs = [r for r in study.runs if independent(r) and "heads" in r and learned(r)
            and r["heads"]["cls_to_not"][negation_head_of(r)] >= r["baselines"]["role"]]
    return sum(map(_leaned, runs)), len(runs)


def _by_path(study: Study, rule: str) -> list[dict[str, Any]]:
    """The runs a learner keeps who tells replicas apart by their kernel path."""
    first = study.runs[0]["path"]
    keep = {"first": lambda p: p == first, "not default": lambda p: p != "DEFAULT", "AVX2": lambda p: p == "AVX2"}
    return [r for r in study.runs if keep[rule](r["path"])]


def _variant(study: Study, select: dict[str, Any], holds: dict[str, Any]) -> tuple[int, int]:
    if "path" in select:
        rest = {key: value for key, value in select.items() if key != "path"}
        runs = [r for r in _by_path(study, select["path"]) if "heads" in r and _counted(r, replicas=True, **rest)]
        return sum(_leaned(r, **holds) for r in runs), len(runs)
    runs = [r for r in study.runs if "heads" in r and _counted(r, **select)]
    if "n_from" in holds:  # k from the question's runs, n from another selection
        k, _ = leaned_before(study)
        return k, sum(1 for r in study.runs if "heads" in r and _counted(r, **holds["n_from"]))
    return sum(_leaned(r, **holds) for r in runs), len(runs)


def _each(holds: dict[str, Any] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return holds if isinstance(holds, list) else [holds]


def _as_pair(out: Any, what: str) -> tuple[int, int]:
    if out is None:
        from ._result import NOT_IMPLEMENTED, Verdict
        raise Verdict(NOT_IMPLEMENTED, f"not implemented yet ({what} returned None)",
                      "Does your function end with a return statement?")
    if isinstance(out, numbers.Real) and not isinstance(out, bool):
        raise fail(f"{what} returned one number ({out!r}); expected the pair (k, n)",
                   "Return both counts, return k, n: a share without its n hides how many runs it rests on.")
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise fail(f"{what} returned {type(out).__name__}; expected the pair (k, n) of two ints", "End with: return k, n")
    pair = []
    for value in out:
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise fail(f"{what} returned ({out[0]!r}, {out[1]!r}); expected two whole numbers (ints)",
                       "k and n are counts of runs: sum(...) of booleans and len(...) give ints.")
        pair.append(int(value))
    return pair[0], pair[1]


def _baselines(rng: random.Random) -> dict[str, float]:
    chance = rng.choice([0.5, 0.5, 0.25])  # some runs come from a task with four labels: other thresholds
    learned_at = 1 - (1 - chance) / 10
    uniform = round(rng.uniform(0.08, 0.3), 4)
    return {"chance": chance, "learned_at": learned_at, "near_chance": (chance + learned_at) / 2,
            "uniform": uniform, "role": round(uniform + (1 - uniform) / 2, 4)}


def _run(rng: random.Random, seed: int, num_heads: int, replica: bool, path: str) -> dict[str, Any]:
    base = _baselines(rng)

    def accuracy() -> float:  # learned_at itself among them: "at least" must count it
        return round(rng.choice([base["learned_at"], base["learned_at"] + 0.01, 0.94, 0.93, 0.96, 0.97, 0.99, 1.0,
                                 1.0, 0.6, 0.91]), 4)

    negated, plain = accuracy(), accuracy()
    top = round(rng.choice([0.52, 0.56, 0.6, 0.7, 0.9, 1.0, 1.0, base["uniform"] + 0.05, base["uniform"] - 0.02,
                            base["role"] - 0.01, base["role"] + 0.01, base["role"]]), 4)
    shares = [round(rng.uniform(0.0, 0.9 * top), 4) for _ in range(num_heads)]
    shares[rng.randrange(num_heads)] = top
    before = [round(rng.uniform(0.02, 0.3), 4) for _ in range(num_heads)]
    if num_heads == 2 and shares[1] > shares[0] and rng.random() < 0.3:
        # a tie before training: the negation head did not lead. Only with head 1 as the negation head, where
        # argmax (which picks the first of equal values) agrees with "larger" and only ">=" counts it
        before = [before[0]] * num_heads
    groups = ("plain+", "plain-", "negated+", "negated-")

    def per_group(g: str) -> list[float]:  # the groups' own shares: near cls_to_not, not equal to it
        return [round(min(1.0, max(0.0, s + rng.uniform(-0.35, 0.35))), 4) for s in shares]

    return {
        "seed": seed, "data_seed": seed, "num_heads": num_heads, "replica": replica,
        "path": "DEFAULT" if replica else path, "baselines": base,
        "untrained": {"cls_to_not": before,
                      "cls_to_word": [round(rng.uniform(0.02, 0.3), 4) for _ in range(num_heads)],
                      "accuracy": round(rng.uniform(0.4, 0.6), 4)},
        "heads": {"accuracy": {"negated": negated, "plain": plain, **{g: negated if g.startswith("n") else plain
                                                                       for g in groups}},
                  "cls_to_not": shares,
                  "cls_shares": {g: {"not": per_group(g), "sentiment word": [round(rng.uniform(0, 1), 4)
                                                                             for _ in range(num_heads)]}
                                 for g in groups}},
    }


def synthetic_study(seed: int, n: int, path: str = "AVX2") -> Study:
    """A study in the committed file's format: ``n`` two-head runs and their replicas (on the kernel path
    ``DEFAULT``; the others on ``path``), and runs with 1, 4 and 8 heads, with outcomes and baselines drawn so
    that the common mistakes change the count."""
    rng = random.Random(seed)
    runs = [_run(rng, s, 2, False, path) for s in range(n)]
    runs += [_run(rng, s, H, False, path) for H in (1, 4, 8) for s in range(n // 2)]
    runs += [_run(rng, s, 2, True, path) for s in range(n)]
    return Study(runs=runs, config={"n_train": 2000, "n_test": 500}, about={"what": "a synthetic study (the check's)"})


def check_recount(fn: Callable[[Study], Any]) -> CheckResult:
    """Check ``fn(study) -> (k, n)``: over the independent two-head runs that learned (the run's own
    ``learned_at``) and whose negation head has a role for "not" (the run's own ``role``), ``k`` of the ``n``
    runs in which that head, untrained, already put a larger share of ``<cls>``'s attention on "not" than the
    other head; two ints; the study left unchanged."""

    def body() -> str:
        # two studies of one size (a result kept from an earlier call shows), on three kernel paths
        studies = [synthetic_study(seed, n, path) for seed, n, path in
                   ((51, 30, "AVX2"), (1051, 30, "AVX512"), (2051, 36, "DEFAULT"))]
        answers, expected = [], []
        for number, study in enumerate(studies):
            before = json.dumps(study.runs, sort_keys=True)
            given = Study(runs=copy.deepcopy(study.runs), config=dict(study.config), about=dict(study.about))
            what = f"your function (synthetic study {number + 1})"
            out = _as_pair(call(fn, given, what=what, forbidden=[leaned_before]), what)
            if json.dumps(given.runs, sort_keys=True) != before:
                raise fail(f"{what} changed the runs of the study it was given",
                           "Only read the runs: no run[...] = ..., no .pop(), no sorting in place.")
            answers.append(out)
            expected.append(leaned_before(study))
        if answers == expected:
            return (f"right on {len(studies)} studies of its own (replicas, 1, 4 and 8 heads, runs that did not learn, "
                    "and other baselines)")
        if len(set(answers)) == 1 and answers[0] != (0, 0):
            from ..sentiment.study import load_study
            try:
                committed = leaned_before(load_study())
            except Exception:  # noqa: BLE001 - no committed file: the verdict below still holds
                committed = None
            where = "the committed study's count" if answers[0] == committed else "the same answer"
            raise fail(f"your function gave {where}, {answers[0][0]} of {answers[0][1]}, for {len(studies)} different "
                       "studies: it doesn't count the runs of the study it is given",
                       "Count from the argument, study.runs, not from load_study() nor from numbers typed in.")
        if answers == [(n, k) for k, n in expected]:
            raise fail("wrong count: it looks like k and n were swapped (you return (n, k))",
                       "Return k, n: first the runs in which the negation head led, then the runs counted.")
        for name, select, holds, hint in MISTAKES:
            pairs = zip(select, holds) if isinstance(select, list) else ((select, h) for h in _each(holds))
            if any([_variant(s, sel, h) for s in studies] == answers for sel, h in pairs):
                raise fail(f"wrong count: it looks like {name}", hint)
        stale = [(i, j) for i, a in enumerate(answers) for j in range(i) if a != expected[i] and a == answers[j]
                 and expected[j] != expected[i]]
        if stale and len(set(answers)) > 1:
            i, j = stale[0]
            raise fail(f"your function gave study {i + 1} the count of study {j + 1} ({answers[j][0]} of "
                       f"{answers[j][1]}), which it was called on before: it remembers an earlier call",
                       "Keep no result from one call to the next (no cache keyed on part of the study, such as its "
                       "number of runs): count the runs of the study you are given, every time.")
        i = next(i for i, (a, e) in enumerate(zip(answers, expected)) if a != e)
        (k, n), (k0, n0) = answers[i], expected[i]
        which = (f"you count {n} runs, the question {n0}: check which runs you keep" if n != n0 else
                 f"you keep the right {n} runs, but find it in {k}, not {k0}: check what you test in each run")
        raise fail(f"wrong count on synthetic study {i + 1}: {k} of {n}, expected {k0} of {n0} ({which})", DEFINITION)

    return run_check("recount a finding", body)
