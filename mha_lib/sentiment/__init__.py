"""A tiny sentiment task with negations, generated in code, and a small model that learns it.

Chapter 07 trains the model and looks at what its heads do; chapter 12 restricts them.
The package is split by job:

- :mod:`~mha_lib.sentiment.data`: the task. :func:`make_datasets` draws sentences such as
  "the movie was not bad" (positive) from a few templates, with a seed; :class:`Vocab`,
  :func:`tokenize` and :func:`batch_examples` turn them into padded batches of ids.
- :mod:`~mha_lib.sentiment.model`: :class:`SentimentClassifier` (embeddings, pre-norm
  :class:`~mha_lib.EncoderLayer` s, a linear classifier on ``<cls>``), :func:`train_model`,
  :func:`evaluate`, :func:`predict`.
- :mod:`~mha_lib.sentiment.probes`: :func:`attention_shares` (where a token's attention
  goes, head by head), :func:`feed_forward_off`, and the groups of sentences the chapters
  measure on (chapter 12's halves live there too: the exercise asks you to write them). :func:`silence_heads` lives in :mod:`mha_lib.heads` and is re-exported here.
- :mod:`~mha_lib.sentiment.attribution`: what each head contributes, measured three ways:
  :func:`ablated_accuracy` (zero-, mean- and resample-ablation) and :func:`logit_attribution`
  (direct logit attribution, the final LayerNorm's scale frozen).
- The seed study the chapters quote, made by ``python -m mha_lib.sentiment study``:
  :mod:`~mha_lib.sentiment.run` trains and measures one run (its own initialisation and data,
  thresholds derived from baselines); :mod:`~mha_lib.sentiment.study` runs many, with 1, 2, 4
  and 8 heads, and reads the committed file (:func:`load_study`);
  :mod:`~mha_lib.sentiment.findings` holds what the chapters state, with its counts.

The negation example comes from *Transformers in Action* (Manning), section 1.1.4.
"""

from ..heads import silence_heads
from .attribution import ablated_accuracy, logit_attribution
from .data import (
    MAX_SENTENCES,
    NEGATION,
    NEGATIVE,
    POSITIVE,
    Example,
    Vocab,
    batch_examples,
    make_datasets,
    tokenize,
)
from .model import SentimentClassifier, evaluate, predict, train_model
from .probes import ROLES, attention_shares, feed_forward_off, four_groups
from .study import Study, load_study

__all__ = [
    "MAX_SENTENCES",
    "NEGATION",
    "NEGATIVE",
    "POSITIVE",
    "ROLES",
    "Example",
    "SentimentClassifier",
    "Study",
    "Vocab",
    "ablated_accuracy",
    "attention_shares",
    "batch_examples",
    "evaluate",
    "feed_forward_off",
    "four_groups",
    "load_study",
    "logit_attribution",
    "make_datasets",
    "predict",
    "silence_heads",
    "tokenize",
    "train_model",
]
