"""Heads that compose: induction heads in a small attention-only transformer (chapter 08).

An induction head continues a pattern it has seen before: at a token ``A`` it looks for an
earlier ``A`` and predicts the token that followed it (``... A B ... A -> B``). In the textbook
circuit it needs a head of an earlier layer: a previous-token head writes "the token before
me was A" at the position of ``B``, and the induction head's *keys* read it (K-composition).
A one-layer model can't build it. The package is split by job:

- :mod:`~mha_lib.induction.data`: the task. :func:`repeated_segments` draws random tokens in
  which a segment reappears at a varying offset, as a :class:`RepeatBatch`.
- :mod:`~mha_lib.induction.model`: :class:`AttentionOnlyTransformer` (residual attention
  layers, no MLP), its per-head outputs and ``remove_from`` for Q-/K-/V-composition tests.
- :mod:`~mha_lib.induction.train`: :func:`train_induction`, :func:`phase_change_step`.
- :mod:`~mha_lib.induction.scores`: previous-token, self and induction scores, and what
  uniform attention would score.
- :mod:`~mha_lib.induction.circuits`: the mechanism measured: a layer-1 head's output split
  into its token, position and bias parts (and one part removed from layer 2's inputs), what
  an induction head's OV circuit copies, and Elhage et al.'s weight-based composition scores.
- The seed study the chapter quotes, made by ``python -m mha_lib.induction study``:
  :mod:`~mha_lib.induction.run` (one run, trained and measured), :mod:`~mha_lib.induction.study`
  (many runs, the committed file, and the shipped trained model of exercise 8.3) and
  :mod:`~mha_lib.induction.findings` (what the chapter states, with its counts).

Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits" (Transformer
Circuits Thread); Olsson et al. (2022), "In-context Learning and Induction Heads".
"""

from ..heads import silence_heads
from .data import RepeatBatch, check_task, repeated_segments
from .model import POSITIONS, AttentionOnlyTransformer
from .scores import (
    duplicate_token_score,
    induction_queries,
    induction_score,
    previous_token_score,
    self_score,
    uniform_induction_score,
    uniform_previous_token_score,
)
from .train import PHASE_RECORDS, losses, phase_change_step, train_induction

__all__ = [
    "PHASE_RECORDS",
    "POSITIONS",
    "AttentionOnlyTransformer",
    "RepeatBatch",
    "check_task",
    "duplicate_token_score",
    "induction_queries",
    "induction_score",
    "losses",
    "phase_change_step",
    "previous_token_score",
    "repeated_segments",
    "self_score",
    "silence_heads",
    "train_induction",
    "uniform_induction_score",
    "uniform_previous_token_score",
]
