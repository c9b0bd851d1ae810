"""The configuration of chapter 09's model and its training, in one place.

``python -m mha_lib.textlm train`` uses these values unless told otherwise. With the 2 CPU
cores and 10 minutes a run may take, no configuration tried grew an induction head on this text
(:mod:`.configurations` re-runs the variations, one run each); this one trains in under 10
minutes and its heads are what chapter 09 measures over the study's runs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MODEL", "TRAIN", "VOCAB_SIZE"]

VOCAB_SIZE = 512  # byte-pair tokens, trained on the training files
# Small enough that a run trains in under 10 minutes on 2 CPU cores (576 s measured with other work running).
MODEL: dict[str, Any] = {"d_model": 64, "num_heads": 4, "num_layers": 2, "max_len": 64, "mlp": True,
                         "positions": "rotary"}
TRAIN: dict[str, Any] = {"steps": 2000, "batch_size": 32, "lr": 3e-3, "warmup": 200, "weight_decay": 0.01,
                         "final_lr": 0.1, "eval_every": 100}
