"""Chapter 09: a small language model of real text, trained on the CPU, and its heads.

- :mod:`~mha_lib.textlm.corpus`: the text (Python's own test suite, shipped compressed) and
  its split into training and held-out files.
- :mod:`~mha_lib.textlm.tokenizer`: byte-pair encoding, trained on the corpus in seconds.
- :mod:`~mha_lib.textlm.model`: :class:`TextTransformer`, pre-norm blocks of the course's
  :class:`~mha_lib.MultiHeadAttention` (and an MLP, optionally).
- :mod:`~mha_lib.textlm.train`: AdamW on random windows, with a progress bar.
- :mod:`~mha_lib.textlm.scores`: each head's score for a role, next to uniform attention's.
- :mod:`~mha_lib.textlm.ablation`: mean-ablating a head, and the loss it costs per class of token.
- :mod:`~mha_lib.textlm.checkpoint`: the shipped model, and saving your own.
- :mod:`~mha_lib.textlm.study` and :mod:`~mha_lib.textlm.findings`: the seed study the chapter
  quotes, and its findings counted over the runs.

``python -m mha_lib.textlm train`` trains one, ``... sample`` continues a prompt, ``... study``
re-runs the study (``--help`` for the options).
"""

from .checkpoint import CHECKPOINT_FILE, load_checkpoint, save_checkpoint
from .corpus import Corpus, load_corpus, load_text
from .model import Block, ModelConfig, TextTransformer
from .scores import ROLES, head_scores, repeat_batch, roles
from .tokenizer import Tokenizer, split_words
from .train import TrainConfig, batches, evaluate_loss, train_lm

__all__ = ["CHECKPOINT_FILE", "Block", "Corpus", "ModelConfig", "ROLES", "TextTransformer", "Tokenizer",
           "TrainConfig", "batches", "evaluate_loss", "head_scores", "load_checkpoint", "load_corpus", "load_text",
           "repeat_batch", "roles", "save_checkpoint", "split_words", "train_lm"]
