"""The known mistakes of exercise 7.5 (a finding recounted from the seed study), for :mod:`.recount`: which runs
each one keeps (``select``, arguments of ``recount._counted``) and what it tests in each (``holds``, arguments of
``recount._leaned``), with its hint."""

from __future__ import annotations

from typing import Any

# (name, select, holds (or a list of them: variants of one mistake), hint)
MISTAKES: list[tuple[str, dict[str, Any], Any, str]] = [
    ("the replicas (the same seeds again on another kernel path) were counted", dict(replicas=True), {},
     "A replica is the same seed and data computed with other rounding, not another sample: leave out every run "
     "with run.get('replica') true (findings.independent(run) does)."),
    ("the replicas were told apart by their kernel path (run['path']), which differs from machine to machine",
     [dict(path=rule) for rule in ("first", "not default", "AVX2")], [{}, {}, {}],
     "A study run on another machine has other paths (and a machine without AVX runs everything on DEFAULT): "
     "leave out the runs with run.get('replica') true (findings.independent(run))."),
    ("runs with 1, 4 and 8 heads were counted too", dict(heads=None), {},
     "The question is about the two-head runs: run['num_heads'] == 2 (findings.independent(run) checks both)."),
    ("the runs that did not learn were counted too", dict(need_learned=False), {},
     "Count only the runs that learned: min(accuracy['negated'], accuracy['plain']) >= run['baselines']['learned_at'] "
     "(findings.learned(run))."),
    ("'learned' was tested against 0.95 typed in, not against the run's own learned_at", dict(learned_at=0.95), {},
     "Each run carries its thresholds: run['baselines']['learned_at'] (derived from chance, which depends on the "
     "task), not a number read off the committed file."),
    ("'learned' was tested against 0.9 typed in, not against the run's own learned_at", dict(learned_at=0.9), {},
     "Each run carries its thresholds: run['baselines']['learned_at'], not a number typed in."),
    ("'learned' was tested on the negated sentences only", dict(accuracy="negated"), {},
     "A run learned when both groups reach learned_at: min(accuracy['negated'], accuracy['plain'])."),
    ("'learned' was tested on the plain sentences only", dict(accuracy="plain"), {},
     "A run learned when both groups reach learned_at: min(accuracy['negated'], accuracy['plain'])."),
    ("the negation head's role was tested against 0.5 typed in, not against the run's own role", dict(role=0.5), {},
     "The role threshold depends on the run's sentence lengths: run['baselines']['role'] (halfway from uniform "
     "attention to 1)."),
    ("the negation head's role was tested against 0.5658 typed in (read off the committed file)",
     dict(role=0.5658), {}, "Use each run's own threshold: run['baselines']['role']."),
    ("the negation head's role was tested against uniform attention, not against role", dict(role="uniform"), {},
     "A head *has a role* at run['baselines']['role'] (halfway from uniform to 1); uniform is the baseline it is "
     "derived from."),
    ("the negation head's role was not required", dict(role=None), {},
     "Count only the runs whose negation head has a role: run['heads']['cls_to_not'][h] >= run['baselines']['role']."),
    ("the untrained shares on the sentiment word were compared, not those on 'not'", {}, dict(field="cls_to_word"),
     "Compare the heads' untrained shares on 'not': run['untrained']['cls_to_not']."),
    ("every counted run leans (k = n): the negation head was picked from the untrained shares, or its share "
     "after training was compared with its own share before", {}, [dict(head_from="untrained"), dict(grew=True)],
     "Find the negation head after training (findings.negation_head_of(run)), then compare the two heads' shares "
     "on 'not' *before* training, run['untrained']['cls_to_not']: does the future negation head lead already?"),
    ("the negation head was picked from the untrained shares (run['untrained']['cls_to_not']), also for its role",
     dict(head="untrained"), dict(head_from="untrained"),
     "The negation head is the one with the larger *trained* share on 'not', run['heads']['cls_to_not'] "
     "(findings.negation_head_of(run)); its role is tested on that trained share; only the comparison that asks "
     "whether it led reads the untrained shares."),
    ("no run was left out: every run of the study was counted (replicas, other numbers of heads, runs that did "
     "not learn, negation heads without a role)", dict(replicas=True, heads=None, need_learned=False, role=None), {},
     "Keep only the runs the question is about: independent(run) (no replica, two heads), learned(run), and a "
     "negation head whose trained share on 'not' is at least run['baselines']['role'] (study.count(..., where=...))."),
    ("a tie before training was counted as leading (>= instead of >)", {}, dict(ties=True),
     "'Already larger' is strict: with equal untrained shares the negation head did not lead; compare with >."),
    ("'learned' was tested with > learned_at: a run exactly at the threshold was left out", dict(strict="learned"), {},
     "'At least' the run's learned_at: min(accuracy['negated'], accuracy['plain']) >= run['baselines']['learned_at']."),
    ("the role was tested with > role: a negation head exactly at the threshold was left out", dict(strict="role"), {},
     "'At least' the run's role: run['heads']['cls_to_not'][h] >= run['baselines']['role']."),
    ("'learned' was tested against near_chance instead of learned_at", dict(learned_at="near_chance"), {},
     "near_chance marks a model closer to chance than to learned; a run *learned* at run['baselines']['learned_at']."),
    ("the negation head was taken as the head with the *smaller* trained share on 'not'",
     dict(head="smallest"), dict(head="smallest"),
     "The negation head has the larger trained share: max(range(2), key=shares.__getitem__) (findings.negation_head_of)."),
    ("the negation head was read from the per-group shares (run['heads']['cls_shares']), not from "
     "run['heads']['cls_to_not']", 
     [dict(head=g + star) for g in ("negated+", "negated-") for star in ("", "*")],
     [dict(head=g) for g in ("negated+", "negated-") for _ in range(2)],
     "The negation head is the head with the larger trained share on 'not' over the negated sentences, "
     "run['heads']['cls_to_not'] (findings.negation_head_of(run))."),
    ("the role threshold was applied to the untrained share, not to the trained one", dict(role_before=True), {},
     "A head *has a role* after training: run['heads']['cls_to_not'][h] >= run['baselines']['role']; the untrained "
     "shares only decide whether it led before."),
    ("the negation head's untrained share was compared with uniform attention, not with the other head's",
     {}, dict(against="uniform"),
     "'Leaned': its untrained share on 'not' larger than the *other head's* untrained share on 'not'."),
    ("the negation head's untrained share on 'not' was compared with its own share on the sentiment word",
     {}, dict(against="own word"),
     "Compare the two heads: run['untrained']['cls_to_not'][h] > run['untrained']['cls_to_not'][other]."),
    ("the negation head's untrained share was compared with the other head's *trained* share",
     {}, dict(against="trained"),
     "Compare both heads before training: run['untrained']['cls_to_not'][h] > run['untrained']['cls_to_not'][other]."),
    ("n counts runs that k's conditions leave out (a condition was applied to k only)", {},
     [dict(n_from=dict(need_learned=False, role=None)), dict(n_from=dict(role=None)),
      dict(n_from=dict(need_learned=False))],
     "n is the number of runs that pass *every* condition (independent, two heads, learned, a role); k counts those "
     "of them whose negation head led before training."),
]
