"""Where the course runs, and how it stays reproducible."""

from __future__ import annotations

import os
import random
import re

import torch

from .validation import check_whole

__all__ = ["get_device", "parse_device", "seed_everything"]

_DEVICE_PATTERN = re.compile(r"^(cpu|mps|cuda(:(0|[1-9]\d*))?)$")  # cuda:N, no leading zeros


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def get_device() -> torch.device:
    """The device the notebooks and examples use.

    The environment variable ``MHA_DEVICE`` decides when it is set to
    ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (an empty value counts as unset).
    Otherwise: CUDA if available, else Apple's MPS, else the CPU.

    Raises:
        ValueError: ``MHA_DEVICE`` holds something else.
        RuntimeError: ``MHA_DEVICE`` names a device this machine doesn't have.
    """
    requested = os.environ.get("MHA_DEVICE", "").strip()
    if requested:
        return parse_device(requested, "MHA_DEVICE")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def parse_device(requested: str, source: str) -> torch.device:
    """``cpu``, ``cuda``, ``cuda:N`` or ``mps`` as a device this machine has; errors name ``source``
    (``MHA_DEVICE``, a command's ``--device``).

    Raises:
        ValueError: ``requested`` is not one of those names.
        RuntimeError: it names a device this machine doesn't have.
    """
    said = f"{source}={requested!r}"
    if not _DEVICE_PATTERN.match(requested):
        hint = ""
        if _DEVICE_PATTERN.match(requested.lower()):
            hint = f" (write it in lower case: {requested.lower()!r})"
        elif re.fullmatch(r"cuda:0\d+", requested):
            hint = f" (write the index without leading zeros: 'cuda:{int(requested[5:])}')"
        raise ValueError(f"{said} is not a device the course knows{hint}; use cpu, cuda, cuda:N or mps"
                         + (", or unset MHA_DEVICE to pick automatically" if source == "MHA_DEVICE" else ""))
    try:
        device = torch.device(requested)
    except RuntimeError as error:  # e.g. an index too large to parse
        raise ValueError(f"{said} is not a device PyTorch accepts: {error}") from None
    if ":" in requested and device.index != int(requested.split(":")[1]):  # torch wraps cuda:256 to cuda:0
        raise ValueError(f"{said} has a device index PyTorch can't hold (it reads it as {device})")
    if device.type == "cuda":
        if not torch.cuda.is_available():  # also when this PyTorch was built without CUDA
            raise RuntimeError(f"{said}, but CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise RuntimeError(f"{said}, but this machine has only {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not _mps_available():
        raise RuntimeError(f"{said}, but MPS is not available on this machine")
    return device


_MAX_SEED = 2**32 - 1  # NumPy's legacy generator takes seeds in [0, 2**32 - 1]


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and PyTorch's (CPU and every GPU) random generators.

    ``seed`` is a whole number in ``[0, 2**32 - 1]`` (the range all three accept), a
    Python or NumPy int.

    Note that CPU and CUDA generators produce different numbers from the same
    seed: create random tensors on the CPU and move them with ``.to(device)``
    when the numbers must be the same on every device.
    """
    seed = check_whole(seed, "seed")  # a plain int: Python's random refuses np.int64
    if not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed must be in [0, 2**32 - 1] (NumPy's limit), got {seed}; "
                         f"e.g. seed % 2**32 = {seed % 2**32}")
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with matplotlib
        pass
    else:
        np.random.seed(seed)
    torch.manual_seed(seed)  # seeds CUDA and MPS too
