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

from ..studies import Study
from .run import CONFIGS, Run, baselines

__all__ = ["FINDINGS", "STATED", "check_findings", "count_findings", "duplicate_heads", "share_back", "top_head"]


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


def duplicate_heads(run: Run) -> list[int]:
    """The layer-1 heads whose duplicate-token score reaches the role threshold."""
    return [h for h, s in enumerate(run["scores"][0]["duplicate"]) if s >= _base(run)["induction_head"]]


def share_back(run: Run) -> float:
    """How far silencing the duplicate-token head takes the held-out loss back towards ``ln V``:
    ``(silenced - intact) / (ln V - intact)``; 0 is not at all, 1 is a model that cannot copy."""
    intact = run["loss"]["predictable"]
    silenced = run["ablation"][0][top_head(run, 0, "duplicate")]
    return (silenced - intact) / (_base(run)["no_copy_loss"] - intact)


def _needed(run: Run, loss: float) -> bool:
    """A removal makes a part "needed" when it takes the loss back above the phase-change threshold."""
    return loss >= _base(run)["phase_threshold"]


def _part(run: Run, which: str, part: str, score: str) -> float:
    """The loss with ``part`` of the layer-1 head that scores highest on ``score`` removed from input ``which``."""
    return run["parts"][which][part][top_head(run, 0, score)]


def _copies(run: Run) -> bool:
    return min(run["copying"]["score"][1]) >= _base(run)["copying_head"]


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
    "learned: the position part is needed in the queries": (
        _is("learned", 2, changed=True), lambda r: _needed(r, _part(r, "q", "position", "duplicate"))),
    "learned: the token part is not needed in the queries": (
        _is("learned", 2, changed=True), lambda r: not _needed(r, _part(r, "q", "token", "duplicate"))),
    "learned: the bias part is not needed in the queries": (
        _is("learned", 2, changed=True), lambda r: not _needed(r, _part(r, "q", "bias", "duplicate"))),
    "learned: mean-ablated in the queries, it is needed too": (
        _is("learned", 2, changed=True),
        lambda r: _needed(r, r["mean_ablation"]["q"][top_head(r, 0, "duplicate")])),
    "learned: all four layer-1 heads at once are not needed in the keys": (
        _is("learned", 2, changed=True), lambda r: not _needed(r, r["composition"]["k"]["all"])),
    "learned: all four layer-1 heads at once are not needed in the values": (
        _is("learned", 2, changed=True), lambda r: not _needed(r, r["composition"]["v"]["all"])),
    "learned: one duplicate-token head only": (_is("learned", 2, changed=True), lambda r: len(duplicate_heads(r)) == 1),
    "learned: all four layer-2 heads copy": (_is("learned", 2, changed=True), _copies),
    "learned: high Q-composition of the duplicate-token head with every layer-2 head": (
        _is("learned", 2, changed=True),
        lambda r: min(r["weight_composition"]["q"][top_head(r, 0, "duplicate")]) >= _base(r)["random_composition_p99"]),
    "learned: no high K-composition score": (
        _is("learned", 2, changed=True),
        lambda r: max(max(row) for row in r["weight_composition"]["k"]) < _base(r)["random_composition_p99"]),
    "untrained: no head copies": (
        lambda r: True,
        lambda r: max(max(layer) for layer in r["untrained_copying"]["score"]) < _base(r)["copying_head"]),
    "two layers: a phase change is a held-out loss below the threshold": (
        lambda r: r["num_layers"] == 2,
        lambda r: (r["phase_change"] is not None) == (r["loss"]["predictable"] < _base(r)["phase_threshold"])),
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
    "rotary: the previous-token head's token part is needed in the keys": (
        _is("rotary", 2, changed=True), lambda r: _needed(r, _part(r, "k", "token", "previous_token"))),
    "rotary: all four layer-2 heads copy": (_is("rotary", 2, changed=True), _copies),
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
    "learned: the position part is needed in the queries": (19, 19),
    "learned: the token part is not needed in the queries": (19, 19),
    "learned: the bias part is not needed in the queries": (19, 19),
    "learned: mean-ablated in the queries, it is needed too": (19, 19),
    "learned: all four layer-1 heads at once are not needed in the keys": (19, 19),
    "learned: all four layer-1 heads at once are not needed in the values": (19, 19),
    "learned: one duplicate-token head only": (15, 19),
    "learned: all four layer-2 heads copy": (17, 19),
    "learned: high Q-composition of the duplicate-token head with every layer-2 head": (19, 19),
    "learned: no high K-composition score": (19, 19),
    "untrained: no head copies": (58, 58),
    "two layers: a phase change is a held-out loss below the threshold": (34, 34),
    "rotary: two layers change phase": (10, 10),
    "rotary: all four layer-2 heads are induction heads": (9, 10),
    "rotary: a previous-token head in layer 1": (9, 10),
    "rotary: layer 2 needs it in its keys": (9, 10),
    "rotary: a duplicate-token head in layer 1": (8, 10),
    "rotary: no layer-1 head is needed in the queries": (9, 10),
    "rotary: the queries still read the duplicate-token head": (10, 10),
    "rotary: the previous-token head's token part is needed in the keys": (9, 10),
    "rotary: all four layer-2 heads copy": (0, 10),
}


def check_findings(run: Run) -> dict[str, bool]:
    """``{finding: holds}`` for the :data:`FINDINGS` that speak to this run."""
    return {name: bool(test(run)) for name, (applies, test) in FINDINGS.items() if applies(run)}


def count_findings(study: Study) -> dict[str, tuple[int, int]]:
    """``{finding: (k, n)}``: each of :data:`FINDINGS` holds in ``k`` of the ``n`` runs it speaks to."""
    return {name: study.count(test, where=applies) for name, (applies, test) in FINDINGS.items()}
