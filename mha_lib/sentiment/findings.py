"""What chapters 07 and 12 state about the seed study, as code (:data:`FINDINGS`), and how much
of their wording each count supports (:data:`STATED`).

Each finding names the runs it speaks to and a test on one run; every threshold comes from
the run's baselines (:func:`~mha_lib.sentiment.run.baselines`), never from the results. The
chapters print the counts with :func:`findings_table`, which fails when a re-run study stops
supporting the text; ``tests/test_study.py`` checks the committed file against :data:`STATED`.
The runs themselves: :mod:`.run` (one run) and :mod:`.study` (many, and the file).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from itertools import combinations

from .attribution import ABLATIONS
from .probes import FOUR_GROUPS, ROLES
from .run import Run
from .study import HEADS, Study

__all__ = ["ABLATION_FINDINGS", "CONTROL_FINDINGS", "FINDINGS", "LABELS", "MEAN_CONTROLS", "MOST", "OUTCOMES", "STATED", "ablation_outcomes", "attended_polarities",
           "check_findings", "colliding_pairs", "count_findings", "findings_table", "heads_on_word", "independent",
           "kernel_path_changes", "learned", "learning_order", "negation_head_of", "other_head_of",
           "other_heads_of", "outcome", "outcomes_table", "robust_seeds", "sent_token", "wording"]


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


# The control of mean-ablation: the head's mean over the plain (or the negated) reference
# sentences only, where "mean" takes it over all of them ("mean_from" in a run).
MEAN_CONTROLS = ("plain-only mean", "negated-only mean")


def _ablated(run: Run, how: str, head: int, group: str) -> float:
    if how in MEAN_CONTROLS:
        return run["heads"]["mean_from"][how.split("-")[0]][f"head {head}"][group]
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


# Chapter 07's groups, by the label they should get (1 = positive): "negated+" is "not good".
LABELS = {"plain+": 1, "plain-": 0, "negated+": 0, "negated-": 1}


def sent_token(run: Run, group: str, h: int) -> str | None:
    """What head ``h`` sends ``<cls>`` in ``group``: the role (``"not"``, ``"sentiment word"``,
    ...) that gets the most of its attention, if that share reaches the run's ``role``
    threshold; None when the head spreads its attention."""
    shares = run["heads"]["cls_shares"][group]
    top = max(ROLES, key=lambda role: shares[role][h])
    return top if shares[top][h] >= _role(run) else None


def colliding_pairs(run: Run, h: int = 0) -> list[tuple[str, str]]:
    """The pairs of groups with *opposite* labels to which head ``h`` sends the same token:
    "not" in "not good" and "not bad", a sentiment word of one polarity with and without "not",
    ``<cls>`` or the other words anywhere. Whatever reads that head then gets (nearly) the same
    vector for two sentences that need opposite answers."""
    pairs = []
    for a, b in combinations(FOUR_GROUPS, 2):
        token = sent_token(run, a, h)
        same = token is not None and token == sent_token(run, b, h) and (
            token != "sentiment word" or a[-1] == b[-1])  # a word is the same word only at the same polarity
        if same and LABELS[a] != LABELS[b]:
            pairs.append((a, b))
    return pairs


def _weaker_of_collision(run: Run) -> float:
    """The lowest accuracy over the groups of :func:`colliding_pairs` (head 0)."""
    return min(run["heads"]["accuracy"][g] for pair in colliding_pairs(run) for g in pair)


def heads_on_word(run: Run) -> tuple[int, int]:
    """How many heads give the sentiment word ``role`` of ``<cls>``'s attention in "good"
    sentences and in "bad" ones (plain)."""
    shares = run["heads"]["cls_shares"]
    return tuple(sum(share >= _role(run) for share in shares[g]["sentiment word"])  # type: ignore[return-value]
                 for g in ("plain+", "plain-"))


def attended_polarities(run: Run) -> tuple[bool, bool]:
    """Whether some head gives the sentiment word ``role`` of ``<cls>``'s attention in "good"
    sentences and in "bad" ones (plain)."""
    return tuple(n > 0 for n in heads_on_word(run))  # type: ignore[return-value]


def _read_as(run: Run, positive: bool) -> bool:
    """Plain sentences with their sentiment word deleted are read as that polarity (positive or
    not), in at least ``near_chance`` of them."""
    positive_share = run["heads"]["without_word"]["plain"]  # share predicted positive
    return (positive_share if positive else 1 - positive_share) >= run["baselines"]["near_chance"]


def _absence_read(run: Run) -> bool:
    """In a run that attends to one polarity's words only, plain sentences with their sentiment
    word deleted are read as the *other* polarity, in at least ``near_chance`` of them."""
    positive_seen, negative_seen = attended_polarities(run)
    return _read_as(run, positive=negative_seen and not positive_seen)


def _fewer_heads_read(run: Run) -> bool:
    """Word-deleted plain sentences are read as the polarity whose word gets ``role`` from fewer
    heads (none, or one against two), in at least ``near_chance`` of them."""
    on_positive, on_negative = heads_on_word(run)
    return _read_as(run, positive=on_positive < on_negative)


def _read_one_way(run: Run) -> bool:
    """Word-deleted plain sentences get one label, either one, in at least ``near_chance`` of them."""
    return _read_as(run, positive=True) or _read_as(run, positive=False)


_TWO = lambda r: independent(r) and "heads" in r  # noqa: E731
_TWO_LEARNED = lambda r: _TWO(r) and learned(r)  # noqa: E731
_ONE_POLARITY = lambda r: _TWO_LEARNED(r) and sum(attended_polarities(r)) == 1  # noqa: E731
_BOTH_POLARITIES = lambda r: _TWO_LEARNED(r) and all(attended_polarities(r))  # noqa: E731
_FEWER_HEADS = lambda r: _TWO_LEARNED(r) and len(set(heads_on_word(r))) == 2  # noqa: E731


OUTCOMES = ("still learned", "hurt", "near chance", "inverted")


def _inverted_at(run: Run) -> float:
    """Below this accuracy a group is *inverted*: as far below chance as ``near_chance`` is above."""
    base = run["baselines"]
    return base.get("inverted", 2 * base["chance"] - base["near_chance"])


def outcome(run: Run, accuracy: float) -> str:
    """One of :data:`OUTCOMES`, from the run's baselines: ``"still learned"`` (at least
    ``learned_at``, 95%), ``"hurt"`` (below that, above near chance), ``"near chance"`` (from
    27.5% up to 72.5%: closer to a guess than to having learned) or ``"inverted"`` (below 27.5%:
    the model gives the *opposite* label, as far from chance as "near chance" allows on the
    other side)."""
    base = run["baselines"]
    if accuracy >= base["learned_at"]:
        return "still learned"
    if accuracy >= base["near_chance"]:
        return "hurt"
    return "near chance" if accuracy >= _inverted_at(run) else "inverted"


def _near_chance(run: Run, accuracy: float) -> bool:
    """Near chance *or worse*: below ``near_chance`` (72.5%), inverted groups included."""
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
    "plain: one polarity's word gets a role, the other's none": (
        _TWO_LEARNED, lambda r: sum(attended_polarities(r)) == 1),
    "plain, word deleted: read as the polarity no head looks at": (_ONE_POLARITY, _absence_read),
    # the control: runs in which some head looks at the words of both polarities
    "both polarities looked at: word deleted, read one way": (_BOTH_POLARITIES, _read_one_way),
    "plain, word deleted: read as the polarity fewer heads look at": (_FEWER_HEADS, _fewer_heads_read),
}
# section 6: each head ablated each way (zero, mean, resample), read group by group
_PLAIN = ("plain+", "plain-")
for _how in ABLATIONS:
    for _who, _head_of, _its, _others in (("negation", negation_head_of, _PLAIN, _NEGATED),
                                          ("other", other_head_of, _NEGATED, _PLAIN)):
        def _outcomes(r: Run, how: str = _how, head_of: Callable[[Run], int] = _head_of,
                      groups: Sequence[str] = _its) -> list[str]:
            return [outcome(r, _ablated(r, how, head_of(r), g)) for g in groups]

        def _kept(r: Run, how: str = _how, head_of: Callable[[Run], int] = _head_of,
                  groups: Sequence[str] = _others) -> bool:
            return all(outcome(r, _ablated(r, how, head_of(r), g)) == "still learned" for g in groups)

        _where = "a plain group" if _who == "negation" else "a negated group"
        FINDINGS[f"{_how}-ablating the {_who} head: {_where} near chance or inverted"] = (
            _TWO_LEARNED, lambda r, f=_outcomes: any(o in ("near chance", "inverted") for o in f(r)))
        FINDINGS[f"{_how}-ablating the {_who} head: {_where} inverted"] = (
            _TWO_LEARNED, lambda r, f=_outcomes: "inverted" in f(r))
        FINDINGS[f"{_how}-ablating the {_who} head: both {'plain' if _who == 'negation' else 'negated'} groups inverted"] = (
            _TWO_LEARNED, lambda r, f=_outcomes: all(o == "inverted" for o in f(r)))
        FINDINGS[f"{_how}-ablating the {_who} head: both {'negated' if _who == 'negation' else 'plain'} groups still learned"] = (
            _TWO_LEARNED, _kept)
del _who, _head_of, _its, _others, _how, _where, _outcomes, _kept
ABLATION_FINDINGS = [name for name in FINDINGS if "-ablating the " in name]
# the control: the negation head replaced by its mean over one kind of sentence only
_CONTROLLED = lambda r: _TWO_LEARNED(r) and "mean_from" in r["heads"]  # noqa: E731
for _how in MEAN_CONTROLS:
    def _plain_outcomes(r: Run, how: str = _how) -> list[str]:
        return [outcome(r, _ablated(r, how, negation_head_of(r), g)) for g in _PLAIN]

    FINDINGS[f"{_how}, negation head: a plain group near chance or inverted"] = (
        _CONTROLLED, lambda r, f=_plain_outcomes: any(o in ("near chance", "inverted") for o in f(r)))
    FINDINGS[f"{_how}, negation head: a plain group inverted"] = (
        _CONTROLLED, lambda r, f=_plain_outcomes: "inverted" in f(r))
    FINDINGS[f"{_how}, negation head: both negated groups still learned"] = (
        _CONTROLLED, lambda r, how=_how: all(outcome(r, _ablated(r, how, negation_head_of(r), g)) == "still learned"
                                             for g in _NEGATED))
del _how, _plain_outcomes


def _plain_broken(run: Run, how: str) -> bool:
    """Ablating the negation head ``how`` leaves a plain group near chance or worse."""
    return any(_near_chance(run, _ablated(run, how, negation_head_of(run), g)) for g in _PLAIN)


FINDINGS["plain-only mean, negation head: where a plain group breaks, the mixed mean breaks one too"] = (
    lambda r: _CONTROLLED(r) and _plain_broken(r, "plain-only mean"), lambda r: _plain_broken(r, "mean"))
CONTROL_FINDINGS = [name for name in FINDINGS if name.startswith(MEAN_CONTROLS)]
FINDINGS |= {
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
        FINDINGS["1 head: two groups with opposite labels get the same token"] = (
            _RUNS_H, lambda r: bool(colliding_pairs(r)))
        FINDINGS["1 head: the weaker group of a colliding pair near chance or worse"] = (
            lambda r, f=_RUNS_H: f(r) and bool(colliding_pairs(r)), lambda r: _near_chance(r, _weaker_of_collision(r)))
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
# than two thirds of them), "some" (in at least one, two thirds or fewer), "none"; or, where the
# text gives the count itself, that count, (k, n).
STATED: dict[str, str | tuple[int, int]] = {
    "untrained: no head has a role": "all",
    "not learned: negated sentences near chance": (9, 16),
    "plain sentences learned first": (14, 24),
    "plain and negated learned together": (8, 24),
    "negated sentences learned first": (2, 24),
    "negation head in place when negated sentences are learned": "most",
    "a negation head": "most",
    "the other head brings the sentiment word": "all",
    "the other head brings the word in both negated groups": (4, 24),
    "the other head looks at 'not' in the other negated group": "most",
    "plain: the negation head brings the sentiment word": "most",
    "the sentiment word looks at 'not' more than uniform attention": "most",
    "plain: one polarity's word gets a role, the other's none": (10, 24),
    "plain, word deleted: read as the polarity no head looks at": "all",
    "both polarities looked at: word deleted, read one way": (12, 14),
    "plain, word deleted: read as the polarity fewer heads look at": (17, 18),
    "zero-ablating the other head: a negated group near chance or inverted": "all",
    "mean-ablating the other head: a negated group near chance or inverted": "all",
    "resample-ablating the other head: a negated group near chance or inverted": "all",
    "mean-ablating the other head: a negated group inverted": "most",
    "mean-ablating the other head: both negated groups inverted": "none",
    "zero-ablating the negation head: a plain group near chance or inverted": (16, 24),
    "mean-ablating the negation head: a plain group near chance or inverted": "most",
    "resample-ablating the negation head: a plain group near chance or inverted": "all",
    "zero-ablating the negation head: a plain group inverted": (11, 24),
    "mean-ablating the negation head: a plain group inverted": (16, 24),
    "resample-ablating the negation head: a plain group inverted": (11, 24),
    "mean-ablating the negation head: both plain groups inverted": (5, 24),
    "mean-ablating the negation head: both negated groups still learned": (15, 24),
    "plain-only mean, negation head: a plain group near chance or inverted": (12, 24),
    "plain-only mean, negation head: a plain group inverted": (10, 24),
    "plain-only mean, negation head: both negated groups still learned": (8, 24),
    "plain-only mean, negation head: where a plain group breaks, the mixed mean breaks one too": "all",
    "negated-only mean, negation head: a plain group inverted": "all",
    "negated-only mean, negation head: both negated groups still learned": "most",
    "resample-ablating the negation head: both negated groups still learned": "none",
    "negation head, negated: zero-ablation costs more than mean": (14, 24),
    "negation head, negated: resample costs more than mean": "most",
    "negated: other head's logit term > negation head's": "most",
    "feed-forward term toward the right label in every group": "all",
    "without the feed-forward network: still learned": (16, 24),
    "1 head: learned": "none",
    "1 head: negated sentences near chance": (15, 24),
    "1 head: two groups with opposite labels get the same token": "most",
    "1 head: the weaker group of a colliding pair near chance or worse": "all",
    "2 heads: learned": (24, 40),
    "4 heads: learned": "most",
    "8 heads: learned": "all",
    "2 heads: mean-ablating one head leaves a group near chance": "all",
    "4 heads: mean-ablating one head leaves a group near chance": "all",
    "8 heads: mean-ablating one head leaves a group near chance": "most",
    "4 heads: two or more heads on 'not'": (11, 23),
    "8 heads: two or more heads on 'not'": "most",
}


def robust_seeds(study: Study, num_heads: int = 2) -> list[int]:
    """The seeds whose ``num_heads``-head run learned on both kernel paths, in order."""
    replicas = {r["seed"]: r for r in study.runs if r.get("replica") and r["num_heads"] == num_heads and "heads" in r}
    return [r["seed"] for r in study.runs if independent(r, num_heads) and "heads" in r
            and r["seed"] in replicas and learned(r) and learned(replicas[r["seed"]])]


MOST = 2 / 3  # "most" runs: more than two in three; a count from one up to that is given as "k of n"


def wording(k: int, n: int) -> str:
    """What ``k`` of ``n`` runs support: ``"all"``, ``"most"`` (more than :data:`MOST`, two
    thirds: 17 of 24, not 16), ``"some"`` (at least one, two thirds or fewer: the text then gives
    the count) or ``"none"``. A bare majority such as 14 of 25 is not "most": one run either way
    would tip it; nor is a count exactly at the bar."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    return "all" if k == n else "none" if k == 0 else "most" if 3 * k > 2 * n else "some"


def findings_table(study: Study, names: Sequence[str] | None = None) -> str:
    """The counts of some :data:`FINDINGS` (default: all of them) as a table, one per line:
    ``k of n`` runs, the wording the count supports, and the finding. Raises ``AssertionError``
    when a count no longer supports the wording :data:`STATED` gives the text (or, where the text
    gives the count, when the count changed)."""
    counts = count_findings(study)
    names = list(FINDINGS) if names is None else list(names)
    if unknown := [name for name in names if name not in FINDINGS]:
        raise KeyError(f"unknown findings: {unknown}")
    lines = [f"{'runs':>10}  {'wording':7}  finding"]
    for name in names:
        k, n = counts[name]
        said = wording(k, n)
        stated = STATED.get(name)
        if isinstance(stated, tuple) and stated != (k, n):
            raise AssertionError(f"{name!r}: {k} of {n} runs, the text says {stated[0]} of {stated[1]}")
        if isinstance(stated, str) and stated != said:
            raise AssertionError(f"{name!r}: {k} of {n} runs is {said!r}, the text says {stated!r}")
        lines.append(f"{k:>3} of {n:<3}  {said:7}  {name}")
    return "\n".join(lines)


def count_findings(study: Study) -> dict[str, tuple[int, int]]:
    """``{finding: (k, n)}``: each of :data:`FINDINGS` holds in ``k`` of the ``n`` runs it speaks to."""
    return {name: study.count(test, where=applies) for name, (applies, test) in FINDINGS.items()}


def check_findings(run: Run) -> dict[str, bool]:
    """``{finding: holds}`` for the :data:`FINDINGS` that speak to this run."""
    return {name: bool(test(run)) for name, (applies, test) in FINDINGS.items() if applies(run)}


def ablation_outcomes(study: Study, who: str, how: str) -> dict[str, Counter[str]]:
    """``{group: Counter({outcome: runs})}``: what ablating each two-head run's ``who`` head
    (``"negation"`` or ``"other"``) ``how`` (zero, mean or resample, or one of
    :data:`MEAN_CONTROLS`) does to each of the four groups, over the runs that learned; outcomes
    as :func:`outcome` names them."""
    if who not in ("negation", "other") or how not in ABLATIONS + MEAN_CONTROLS:
        raise ValueError(f"who must be 'negation' or 'other' and how one of {ABLATIONS + MEAN_CONTROLS}, "
                         f"got {who!r}, {how!r}")
    head_of = negation_head_of if who == "negation" else other_head_of
    runs = study.values(lambda r: r, where=_TWO_LEARNED)
    return {g: Counter(outcome(r, _ablated(r, how, head_of(r), g)) for r in runs) for g in FOUR_GROUPS}


def outcomes_table(study: Study, rows: Sequence[tuple[str, str]] | None = None) -> str:
    """Heads ablated, one line per ``(who, how)`` of ``rows`` (default: the negation and the
    other head, each ablated the three ways of ``ABLATIONS``): per group, how many runs still
    learned / hurt / near chance / inverted (the outcomes of :func:`outcome`)."""
    rows = [(who, how) for who in ("negation", "other") for how in ABLATIONS] if rows is None else rows
    short = "/".join(o.split()[-1] for o in OUTCOMES)  # learned/hurt/chance/inverted
    lines = [f"{'runs: ' + short:>36}" + "".join(f"{g:>14}" for g in FOUR_GROUPS)]
    for who, how in rows:
        counts = ablation_outcomes(study, who, how)
        cells = ["/".join(f"{counts[g][o]}" for o in OUTCOMES) for g in FOUR_GROUPS]
        label = f"{how}-ablated {who} head" if how in ABLATIONS else f"{who} head, {how}"
        lines.append(f"{label:>36}" + "".join(f"{c:>14}" for c in cells))
    return "\n".join(lines)
