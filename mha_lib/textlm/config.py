"""The configuration of chapter 09's model and its training, in one place.

``python -m mha_lib.textlm train`` uses these values unless told otherwise. Provisional:
the probes run so far (issue 33's note) found a configuration that trains, not yet one in
which induction heads form within the time limit; the chapter's values come from the study.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MODEL", "TRAIN", "VOCAB_SIZE"]

VOCAB_SIZE = 512  # byte-pair tokens, trained on the training files
MODEL: dict[str, Any] = {"d_model": 128, "num_heads": 4, "num_layers": 2, "max_len": 128, "mlp": True,
                         "positions": "rotary"}
TRAIN: dict[str, Any] = {"steps": 2000, "batch_size": 16, "lr": 3e-3, "warmup": 200, "weight_decay": 0.01,
                         "eval_every": 100}
