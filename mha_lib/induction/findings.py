"""What chapter 08 states about its seed study, as code (:data:`FINDINGS`), and the counts it
states (:data:`STATED`).

Each finding names the runs it speaks to and a test on one run; its thresholds come from
:func:`~mha_lib.induction.run.baselines` alone, never from the results. Chapter 08 states the
findings with their counts, and ``tests/test_induction_study.py`` checks that the committed
file gives them. The runs themselves: :mod:`.run` (one run) and :mod:`.study` (many, and the
file).
"""

from __future__ import annotations

from collections.abc import Callable

from ..sentiment.study import Study
from .run import CONFIGS, Run, baselines

__all__ = ["FINDINGS", "STATED", "check_findings", "count_findings", "top_head"]


_BASELINES: dict[str, dict[str, float]] = {}


def _base(run: Run) -> dict[str, float]:
    """The baselines of the run's configuration (computed once per configuration)."""
    name = run["config"]
    if name not in _BASELINES:
        _BASELINES[name] = baselines(CONFIGS[name])
    return _BASELINES[name]


def top_head(run: Run, layer: int, score: str) -> int:
    """The head of ``layer`` with the highest ``score`` (``"previous_token"``, ``"duplicate"``, ...)."""
    scores = run["scores"][layer][score]
    return max(range(len(scores)), key=scores.__getitem__)


def _is(config: str, layers: int, changed: bool = False) -> Callable[[Run], bool]:
    """The runs of ``config`` with ``layers`` layers (``changed``: only those that changed phase)."""
    return lambda run: (run["config"] == config and run["num_layers"] == layers
                        and (not changed or run["phase_change"] is not None))


def _all_induction_heads(run: Run) -> bool:
    return min(run["scores"][1]["induction"]) >= _base(run)["induction_head"]


# name -> (which runs it speaks to, the test on one run). What a trained model does is asked of
# the runs that changed phase: a run still on its plateau has learned no copying to take apart.
FINDINGS: dict[str, tuple[Callable[[Run], bool], Callable[[Run], bool]]] = {
    "untrained: no head has a role": (
        lambda r: True,
        lambda r: all(max(layer["previous_token"]) < _base(r)["previous_token_head"]
                      and max(layer["induction"]) < _base(r)["induction_head"]
                      and max(layer["duplicate"]) < _base(r)["induction_head"] for layer in r["untrained"])),
    "two layers change phase": (_is("learned", 2), lambda r: r["phase_change"] is not None),
    "one layer never changes phase": (_is("learned", 1), lambda r: r["phase_change"] is None),
    "one layer: no induction head": (
        _is("learned", 1), lambda r: max(r["scores"][0]["induction"]) < _base(r)["induction_head"]),
    "learned: all four layer-2 heads are induction heads": (_is("learned", 2, changed=True), _all_induction_heads),
    "learned: no previous-token head in layer 1": (
        _is("learned", 2), lambda r: max(r["scores"][0]["previous_token"]) < _base(r)["previous_token_head"]),
    "learned: a duplicate-token head in layer 1": (
        _is("learned", 2, changed=True), lambda r: max(r["scores"][0]["duplicate"]) >= _base(r)["induction_head"]),
    "learned: layer 2 needs it in its queries": (
        _is("learned", 2, changed=True),
        lambda r: r["composition"]["q"]["loss"][top_head(r, 0, "duplicate")] >= _base(r)["phase_threshold"]),
    "learned: no layer-1 head is needed in the keys": (
        _is("learned", 2, changed=True), lambda r: max(r["composition"]["k"]["loss"]) < _base(r)["phase_threshold"]),
    "learned: no layer-1 head is needed in the values": (
        _is("learned", 2, changed=True), lambda r: max(r["composition"]["v"]["loss"]) < _base(r)["phase_threshold"]),
    "rotary: two layers change phase": (_is("rotary", 2), lambda r: r["phase_change"] is not None),
    "rotary: all four layer-2 heads are induction heads": (_is("rotary", 2, changed=True), _all_induction_heads),
    "rotary: a previous-token head in layer 1": (
        _is("rotary", 2, changed=True),
        lambda r: max(r["scores"][0]["previous_token"]) >= _base(r)["previous_token_head"]),
    "rotary: layer 2 needs it in its keys": (
        _is("rotary", 2, changed=True),
        lambda r: r["composition"]["k"]["loss"][top_head(r, 0, "previous_token")] >= _base(r)["phase_threshold"]),
    "rotary: a duplicate-token head in layer 1": (
        _is("rotary", 2, changed=True), lambda r: max(r["scores"][0]["duplicate"]) >= _base(r)["induction_head"]),
    "rotary: no layer-1 head is needed in the queries": (
        _is("rotary", 2, changed=True), lambda r: max(r["composition"]["q"]["loss"]) < _base(r)["phase_threshold"]),
    "rotary: the queries still read the duplicate-token head": (
        _is("rotary", 2, changed=True),
        lambda r: r["composition"]["q"]["loss"][top_head(r, 0, "duplicate")] > r["loss"]["predictable"]),
}
# How many runs each finding holds in, in the committed study: chapter 08 states these counts,
# and tests/test_induction_study.py checks that the file gives them.
STATED: dict[str, tuple[int, int]] = {
    "untrained: no head has a role": (58, 58),
    "two layers change phase": (19, 24),
    "one layer never changes phase": (24, 24),
    "one layer: no induction head": (24, 24),
    "learned: all four layer-2 heads are induction heads": (19, 19),
    "learned: no previous-token head in layer 1": (24, 24),
    "learned: a duplicate-token head in layer 1": (19, 19),
    "learned: layer 2 needs it in its queries": (19, 19),
    "learned: no layer-1 head is needed in the keys": (19, 19),
    "learned: no layer-1 head is needed in the values": (19, 19),
    "rotary: two layers change phase": (10, 10),
    "rotary: all four layer-2 heads are induction heads": (9, 10),
    "rotary: a previous-token head in layer 1": (9, 10),
    "rotary: layer 2 needs it in its keys": (9, 10),
    "rotary: a duplicate-token head in layer 1": (8, 10),
    "rotary: no layer-1 head is needed in the queries": (9, 10),
    "rotary: the queries still read the duplicate-token head": (10, 10),
}


def check_findings(run: Run) -> dict[str, bool]:
    """``{finding: holds}`` for the :data:`FINDINGS` that speak to this run."""
    return {name: bool(test(run)) for name, (applies, test) in FINDINGS.items() if applies(run)}


def count_findings(study: Study) -> dict[str, tuple[int, int]]:
    """``{finding: (k, n)}``: each of :data:`FINDINGS` holds in ``k`` of the ``n`` runs it speaks to."""
    return {name: study.count(test, where=applies) for name, (applies, test) in FINDINGS.items()}
