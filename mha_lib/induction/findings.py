"""What chapter 08 states about its seed study, as code (:data:`FINDINGS`), and the counts it
states (:data:`STATED`).

Each finding names the runs it speaks to and a test on one run; its thresholds come from
:func:`~mha_lib.induction.run.baselines` alone, never from the results, except one: copying
against a control (:func:`copying_control`), read from the one-layer runs only and applied to
the two-layer runs. :data:`HEAD_FINDINGS` count heads instead of runs. Two names are kept
apart: a head has the **induction pattern** when its induction score reaches its threshold
(attention only), and is an **induction head** when it also copies beyond the control. Chapter
08 states the findings with their counts, and ``tests/test_induction_study.py`` checks that the
committed file gives them. The runs themselves: :mod:`.run` (one run) and :mod:`.study` (many, and the
file).
"""

from __future__ import annotations

from collections.abc import Callable

from ..studies import Study
from .run import CONFIGS, Run, baselines, role_threshold

__all__ = ["FINDINGS", "HEAD_FINDINGS", "STATED", "STATED_HEADS", "check_findings", "copying_control", "count_findings",
           "count_head_findings", "duplicate_heads", "share_back", "top_head"]


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


def _pattern(run: Run, layer: int, head: int) -> bool:
    """The **induction pattern**, the attention half: the head's induction score reaches the role threshold."""
    return run["scores"][layer]["induction"][head] >= _base(run)["induction_head"]


_CONTROL: dict[str, float] = {}


def copying_control() -> dict[str, float]:
    """The copying baseline of a trained head that cannot be an induction head: the heads of the
    committed study's one-layer models (trained on the same task, the same way; with one layer no
    head can find the earlier occurrence's successor). ``{"mean": their mean copying score,
    "max": the largest, "threshold": role_threshold(mean)}``, read from those runs only, never
    from the two-layer runs it is applied to."""
    if not _CONTROL:
        from .study import load_study  # the committed file; .study does not import this module

        scores = [s for run in load_study().runs if run["num_layers"] == 1 for s in run["copying"]["score"][0]]
        mean = sum(scores) / len(scores)
        _CONTROL.update(mean=mean, max=max(scores), threshold=role_threshold(mean), heads=len(scores))
    return _CONTROL


def _copies_random(run: Run, layer: int, head: int) -> bool:
    """Copies beyond random weights: the argmax copying score reaches role_threshold(1 / V)."""
    return run["copying"]["score"][layer][head] >= _base(run)["copying_head"]


def _copies_control(run: Run, layer: int, head: int) -> bool:
    """Copies beyond the one-layer control: the argmax copying score reaches role_threshold(control mean)."""
    return run["copying"]["score"][layer][head] >= copying_control()["threshold"]


def _copies_eigen(run: Run, layer: int, head: int) -> bool:
    """Copies by the positive-eigenvalue measure: it reaches role_threshold(0), random weights scoring about 0."""
    return run["copying"]["eigen"][layer][head] >= _base(run)["copying_eigen_head"]


def _induction_head(run: Run, layer: int, head: int) -> bool:
    """An **induction head**: both halves, the induction pattern and copying beyond the one-layer control."""
    return _pattern(run, layer, head) and _copies_control(run, layer, head)


def _all_four(test: Callable[[Run, int, int], bool], layer: int = 1) -> Callable[[Run], bool]:
    return lambda run: all(test(run, layer, h) for h in range(len(run["scores"][layer]["induction"])))


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


def _high_q_rows(run: Run) -> list[int]:
    """The layer-1 heads whose Q-composition score with every layer-2 head is above random's 99th percentile."""
    return [h for h, row in enumerate(run["weight_composition"]["q"]) if min(row) >= _base(run)["random_composition_p99"]]


def _control_head(run: Run) -> int:
    """A control removal: the layer-1 head with the lowest duplicate-token score (no role in the queries)."""
    scores = run["scores"][0]["duplicate"]
    return min(range(len(scores)), key=scores.__getitem__)


def _rise(run: Run, which: str, head: int) -> float:
    """How much removing layer-1 head ``head`` from input ``which`` raises the held-out loss."""
    return run["composition"][which]["loss"][head] - run["loss"]["predictable"]


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
    "one layer: no induction pattern": (
        _is("learned", 1), lambda r: max(r["scores"][0]["induction"]) < _base(r)["induction_head"]),
    "learned: all four layer-2 heads have the induction pattern": (_is("learned", 2, changed=True), _all_four(_pattern)),
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
    "learned: all four layer-2 heads copy beyond random weights": (
        _is("learned", 2, changed=True), _all_four(_copies_random)),
    "learned: all four layer-2 heads copy beyond the one-layer control": (
        _is("learned", 2, changed=True), _all_four(_copies_control)),
    "learned: all four layer-2 heads copy by the eigenvalue measure": (
        _is("learned", 2, changed=True), _all_four(_copies_eigen)),
    "learned: all four layer-2 heads are induction heads": (_is("learned", 2, changed=True), _all_four(_induction_head)),
    "learned: high Q-composition of the duplicate-token head with every layer-2 head": (
        _is("learned", 2, changed=True),
        lambda r: min(r["weight_composition"]["q"][top_head(r, 0, "duplicate")]) >= _base(r)["random_composition_p99"]),
    "learned: no high K-composition score": (
        _is("learned", 2, changed=True),
        lambda r: max(max(row) for row in r["weight_composition"]["k"]) < _base(r)["random_composition_p99"]),
    "learned: the layer-1 heads with high Q-composition are the duplicate-token heads": (
        _is("learned", 2, changed=True), lambda r: _high_q_rows(r) == duplicate_heads(r)),
    "learned: a second duplicate-token head is not needed in the queries": (
        lambda r: _is("learned", 2, changed=True)(r) and len(duplicate_heads(r)) > 1,
        lambda r: all(r["composition"]["q"]["loss"][h] < _base(r)["phase_threshold"]
                      for h in duplicate_heads(r) if h != top_head(r, 0, "duplicate"))),
    "learned: no duplicate-token head has a high V-composition score": (
        _is("learned", 2, changed=True),
        lambda r: all(max(r["weight_composition"]["v"][h]) < _base(r)["random_composition_p99"] for h in duplicate_heads(r))),
    "learned: a high V-composition score": (
        _is("learned", 2, changed=True),
        lambda r: max(max(row) for row in r["weight_composition"]["v"]) >= _base(r)["random_composition_p99"]),
    "learned: all four layer-1 heads removed from the values lower the loss": (
        _is("learned", 2, changed=True), lambda r: r["composition"]["v"]["all"] < r["loss"]["predictable"]),
    "untrained: no head copies, by either measure": (
        lambda r: True,
        lambda r: max(max(layer) for layer in r["untrained_copying"]["score"]) < _base(r)["copying_head"]
        and max(max(layer) for layer in r["untrained_copying"]["eigen"]) < _base(r)["copying_eigen_head"]),
    "two layers: a phase change is a held-out loss below the threshold": (
        lambda r: r["num_layers"] == 2,
        lambda r: (r["phase_change"] is not None) == (r["loss"]["predictable"] < _base(r)["phase_threshold"])),
    "rotary: two layers change phase": (_is("rotary", 2), lambda r: r["phase_change"] is not None),
    "rotary: all four layer-2 heads have the induction pattern": (_is("rotary", 2, changed=True), _all_four(_pattern)),
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
    "rotary: it raises the loss more than the control head does": (
        _is("rotary", 2, changed=True),
        lambda r: _rise(r, "q", top_head(r, 0, "duplicate")) > _rise(r, "q", _control_head(r))),
    "rotary: the previous-token head's token part is needed in the keys": (
        _is("rotary", 2, changed=True), lambda r: _needed(r, _part(r, "k", "token", "previous_token"))),
    "rotary: all four layer-2 heads copy beyond random weights": (
        _is("rotary", 2, changed=True), _all_four(_copies_random)),
    "rotary: all four layer-2 heads copy by the eigenvalue measure": (
        _is("rotary", 2, changed=True), _all_four(_copies_eigen)),
    "rotary: all four layer-2 heads are induction heads": (_is("rotary", 2, changed=True), _all_four(_induction_head)),
}
# name -> (which runs, which layer, the test on one head): counts over heads, not runs.
HEAD_FINDINGS: dict[str, tuple[Callable[[Run], bool], int, Callable[[Run, int, int], bool]]] = {
    f"{config}, layer {layer + 1}: {what}": (_is(config, 2, changed=True), layer, test)
    for config in ("learned", "rotary") for layer in (1, 0)
    for what, test in (("induction pattern", _pattern), ("copies beyond random weights", _copies_random),
                       ("copies beyond the one-layer control", _copies_control),
                       ("copies by the eigenvalue measure", _copies_eigen), ("induction head", _induction_head))
} | {
    "one layer: copies beyond random weights": (_is("learned", 1), 0, _copies_random),
    "one layer: copies beyond the one-layer control": (_is("learned", 1), 0, _copies_control),
    "one layer: copies by the eigenvalue measure": (_is("learned", 1), 0, _copies_eigen),
}
# How many runs each finding holds in, in the committed study: chapter 08 states these counts,
# and tests/test_induction_study.py checks that the file gives them.
STATED: dict[str, tuple[int, int]] = {
    "untrained: no head has a role": (58, 58),
    "two layers change phase": (19, 24),
    "one layer never changes phase": (24, 24),
    "one layer: no induction pattern": (24, 24),
    "learned: all four layer-2 heads have the induction pattern": (19, 19),
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
    "learned: all four layer-2 heads copy beyond random weights": (17, 19),
    "learned: all four layer-2 heads copy beyond the one-layer control": (7, 19),
    "learned: all four layer-2 heads copy by the eigenvalue measure": (19, 19),
    "learned: all four layer-2 heads are induction heads": (7, 19),
    "learned: high Q-composition of the duplicate-token head with every layer-2 head": (19, 19),
    "learned: no high K-composition score": (19, 19),
    "learned: the layer-1 heads with high Q-composition are the duplicate-token heads": (19, 19),
    "learned: a second duplicate-token head is not needed in the queries": (4, 4),
    "learned: no duplicate-token head has a high V-composition score": (19, 19),
    "learned: a high V-composition score": (15, 19),
    "learned: all four layer-1 heads removed from the values lower the loss": (19, 19),
    "untrained: no head copies, by either measure": (58, 58),
    "two layers: a phase change is a held-out loss below the threshold": (34, 34),
    "rotary: two layers change phase": (10, 10),
    "rotary: all four layer-2 heads have the induction pattern": (9, 10),
    "rotary: a previous-token head in layer 1": (9, 10),
    "rotary: layer 2 needs it in its keys": (9, 10),
    "rotary: a duplicate-token head in layer 1": (8, 10),
    "rotary: no layer-1 head is needed in the queries": (9, 10),
    "rotary: the queries still read the duplicate-token head": (10, 10),
    "rotary: it raises the loss more than the control head does": (10, 10),
    "rotary: the previous-token head's token part is needed in the keys": (9, 10),
    "rotary: all four layer-2 heads copy beyond random weights": (0, 10),
    "rotary: all four layer-2 heads copy by the eigenvalue measure": (10, 10),
    "rotary: all four layer-2 heads are induction heads": (0, 10),
}
# How many heads each of HEAD_FINDINGS holds for, in the committed study.
STATED_HEADS: dict[str, tuple[int, int]] = {
    "learned, layer 2: induction pattern": (76, 76),
    "learned, layer 2: copies beyond random weights": (74, 76),
    "learned, layer 2: copies beyond the one-layer control": (50, 76),
    "learned, layer 2: copies by the eigenvalue measure": (76, 76),
    "learned, layer 2: induction head": (50, 76),
    "learned, layer 1: induction pattern": (0, 76),
    "learned, layer 1: copies beyond random weights": (23, 76),
    "learned, layer 1: copies beyond the one-layer control": (2, 76),
    "learned, layer 1: copies by the eigenvalue measure": (70, 76),
    "learned, layer 1: induction head": (0, 76),
    "rotary, layer 2: induction pattern": (36, 40),
    "rotary, layer 2: copies beyond random weights": (0, 40),
    "rotary, layer 2: copies beyond the one-layer control": (0, 40),
    "rotary, layer 2: copies by the eigenvalue measure": (40, 40),
    "rotary, layer 2: induction head": (0, 40),
    "rotary, layer 1: induction pattern": (0, 40),
    "rotary, layer 1: copies beyond random weights": (4, 40),
    "rotary, layer 1: copies beyond the one-layer control": (0, 40),
    "rotary, layer 1: copies by the eigenvalue measure": (31, 40),
    "rotary, layer 1: induction head": (0, 40),
    "one layer: copies beyond random weights": (0, 96),
    "one layer: copies beyond the one-layer control": (0, 96),
    "one layer: copies by the eigenvalue measure": (96, 96),
}


def check_findings(run: Run) -> dict[str, bool]:
    """``{finding: holds}`` for the :data:`FINDINGS` that speak to this run."""
    return {name: bool(test(run)) for name, (applies, test) in FINDINGS.items() if applies(run)}


def count_findings(study: Study) -> dict[str, tuple[int, int]]:
    """``{finding: (k, n)}``: each of :data:`FINDINGS` holds in ``k`` of the ``n`` runs it speaks to."""
    return {name: study.count(test, where=applies) for name, (applies, test) in FINDINGS.items()}


def count_head_findings(study: Study) -> dict[str, tuple[int, int]]:
    """``{finding: (k, n)}``: each of :data:`HEAD_FINDINGS` holds for ``k`` of the ``n`` heads it speaks to
    (every head of its layer, in every run it speaks to)."""
    counts = {}
    for name, (applies, layer, test) in HEAD_FINDINGS.items():
        hits = [test(run, layer, h) for run in study.runs if applies(run)
                for h in range(len(run["scores"][layer]["induction"]))]
        counts[name] = (sum(hits), len(hits))
    return counts
