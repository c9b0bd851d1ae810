"""Saving and loading a trained language model with everything needed to use it again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .model import ModelConfig, TextTransformer
from .tokenizer import Tokenizer
from .train import TrainConfig

__all__ = ["CHECKPOINT_FILE", "load_checkpoint", "save_checkpoint"]

CHECKPOINT_FILE = Path(__file__).parent / "model_seed0.pt"


def save_checkpoint(path: str | Path, model: TextTransformer, tokenizer: Tokenizer, train: TrainConfig,
                    history: dict[str, Any]) -> Path:
    """One file: the model's config and weights (float32, CPU), the tokenizer, how it trained, its history."""
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    torch.save({"format": 1, "model": model.config.as_dict(), "train": train.as_dict(),
                "tokenizer": tokenizer.to_dict(), "history": history, "state_dict": state}, path)
    return Path(path)


def load_checkpoint(path: str | Path | None = None, device: torch.device | str = "cpu"
                    ) -> tuple[TextTransformer, Tokenizer, dict[str, Any]]:
    """``(model in eval mode on device, tokenizer, {"train": ..., "history": ...})``; the shipped model by default."""
    path = CHECKPOINT_FILE if path is None else Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}; `python -m mha_lib.textlm train --output {path}` makes one")
    data = torch.load(path, map_location="cpu", weights_only=True)
    if data.get("format") != 1:
        raise ValueError(f"{path} is not a checkpoint this mha_lib can read (format {data.get('format')!r})")
    model = TextTransformer(ModelConfig(**data["model"]))
    model.load_state_dict(data["state_dict"])
    return model.to(device).eval(), Tokenizer.from_dict(data["tokenizer"]), {"train": data["train"], "history": data["history"]}
