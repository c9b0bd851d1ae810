"""Checks of numbers and flags: sizes, probabilities, head counts, switches.

Every size argument of ``mha_lib`` goes through :func:`check_positive_int`, which takes Python
and NumPy integers alike and refuses ``True``, ``2.0`` and ``"2"`` with a hint.
"""

from __future__ import annotations

import math
import numbers
import operator

import torch

__all__ = ["as_index", "broadcast_shapes", "check_dropout", "check_flag", "check_heads", "check_num_kv_heads",
           "check_positive_int", "check_positive_number", "check_rotary", "check_whole", "check_base", "check_device",
           "describe"]


def broadcast_shapes(*shapes: tuple[int, ...] | torch.Size) -> torch.Size:
    """The shape that ``shapes`` broadcast to, aligned from the right; RuntimeError if they don't.

    The same answer as ``torch.broadcast_shapes`` for shapes of whole sizes, in plain Python:
    PyTorch's own imports its symbolic-shape machinery (SymPy) on first use, about a second.
    """
    result: list[int] = []
    for shape in shapes:
        for i, size in enumerate(reversed(tuple(shape))):
            if i == len(result):
                result.insert(0, size)
            elif result[-1 - i] == 1:
                result[-1 - i] = size
            elif size != 1 and size != result[-1 - i]:
                raise RuntimeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast: size {size} against "
                                   f"{result[-1 - i]} at dimension {-1 - i}")
    return torch.Size(result)


def check_whole(value: object, name: str, what: str = "a whole number (an int)") -> int:
    """``value`` as an ``int`` if it is a whole number (``int``, ``np.int64``...), else a ValueError.

    A ``bool`` is refused although Python counts it as an int, and so are ``2.0`` and ``"2"``.
    """
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    hint = ""
    if isinstance(value, float) and value.is_integer():
        hint = f"; write {int(value)}, without the decimal point"
    elif isinstance(value, str) and value.strip().isdigit():
        hint = f"; write {int(value)}, without the quotes"
    elif isinstance(value, bool):
        hint = "; a size is a number, not a flag"
    raise ValueError(f"{name} must be {what}, got {value!r} (a {type(value).__name__}){hint}")


def as_index(value: object) -> int | None:
    """``value`` as an ``int`` if it is an integer index, else None: a Python or NumPy integer or a
    0-d integer tensor (``w.argmax()``), never a ``bool`` (nor a bool tensor or NumPy bool)."""
    if isinstance(value, bool) or type(value).__name__ in ("bool", "bool_"):
        return None
    if isinstance(value, torch.Tensor):
        if value.ndim != 0 or value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
            return None
        return int(value.item())
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def check_positive_int(value: object, name: str) -> int:
    """``value`` as an ``int`` if it is a whole number >= 1, else a ValueError that names it."""
    if type(value) is int and value >= 1:  # the common case, first: this runs on every forward
        return value
    number = check_whole(value, name, "a positive int")
    if number < 1:
        raise ValueError(f"{name} must be a positive int, got {number}")
    return number


def check_dropout(value: object, name: str = "dropout") -> float:
    """``value`` as a ``float`` if it is a probability in ``[0, 1)``, else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = ""
        if isinstance(value, bool) and name == "dropout":
            hint = (": a bool is not a probability; dropout is the argument after num_heads, "
                    "pass the others by name, e.g. bias=False")
        raise ValueError(f"{name} must be in [0, 1), got {value!r} (a {type(value).__name__}){hint}")
    if not 0.0 <= value < 1.0:  # NaN fails too
        raise ValueError(f"{name} must be in [0, 1), got {value}: the probability of zeroing an attention weight")
    return float(value)


def check_heads(d_model: object, num_heads: object, dropout: object = 0.0) -> tuple[int, int, float]:
    """The configuration of a multi-head module, checked: ``(d_model, num_heads, dropout)``.

    ``num_heads`` must divide ``d_model``, so that every head gets ``d_k = d_model // num_heads``
    features, at least one.
    """
    d_model = check_whole(d_model, "d_model", "a positive int")
    num_heads = check_whole(num_heads, "num_heads", "a positive int")
    if num_heads < 1 or d_model < 1:
        raise ValueError(f"d_model and num_heads must be positive, got d_model={d_model}, num_heads={num_heads}")
    if num_heads > d_model:
        raise ValueError(f"num_heads={num_heads} is more than d_model={d_model}: each head would get "
                         f"d_k = d_model // num_heads = 0 features; use at most {d_model} heads")
    if d_model % num_heads != 0:
        raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}: "
                         f"every head needs the same share of the {d_model} features")
    return d_model, num_heads, check_dropout(dropout)




def describe(x: object) -> str:
    """How an error message names an argument it refuses: ``shape (3, 5)`` or ``a list``."""
    shape = getattr(x, "shape", None)
    if shape is not None and type(x).__module__.startswith("torch"):
        return f"shape {tuple(shape)}"
    name = type(x).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}" + (f" of shape {tuple(shape)}" if shape is not None else "")


def check_num_kv_heads(num_heads: int, num_kv_heads: object) -> int:
    """``num_kv_heads``, defaulting to ``num_heads``; a clear error unless it divides ``num_heads``."""
    if num_kv_heads is None:
        return num_heads
    num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_kv_heads={num_kv_heads} does not divide num_heads={num_heads}: every key/value "
            f"head must serve the same number of query heads"
        )
    return num_kv_heads


def check_rotary(d_k: int) -> None:
    """A clear error, at construction, for a module with ``rotary=True`` and an odd head size."""
    if d_k % 2 != 0:
        raise ValueError(
            f"rotary=True needs an even head size d_k = d_model // num_heads, got d_k={d_k}: "
            "RoPE rotates the features in pairs"
        )


def check_flag(value: object, name: str) -> bool:
    """``value`` if it is a ``bool`` (or a NumPy bool); a ValueError otherwise.

    A switch given as ``"False"`` or ``"no"`` would count as true, so only booleans are taken.
    """
    if isinstance(value, bool):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):  # np.True_, np.False_
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {value!r} (a {type(value).__name__})")


def check_device(device: object, name: str = "device") -> torch.device | None:
    """``device`` as a ``torch.device`` (None stays None); a ValueError that names it otherwise."""
    if device is None or isinstance(device, torch.device):
        return device
    try:
        return torch.device(device)  # type: ignore[arg-type]
    except (RuntimeError, TypeError):
        raise ValueError(f"{name} must be a torch.device or a name such as 'cpu', 'cuda' or 'cuda:0', "
                         f"got {device!r}") from None


def check_positive_number(value: object, name: str, *, zero: bool = False) -> float:
    """``value`` as a ``float`` if it is a finite number > 0 (>= 0 with ``zero``), such as a learning rate."""
    number = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not number or not (value > 0 or (zero and value == 0)):
        raise ValueError(f"{name} must be a {'non-negative' if zero else 'positive'}, finite number, got {value!r}")
    return float(value)


def check_base(base: object, name: str = "base") -> float:
    """RoPE's wavelength scale: a finite number above 1 (10000 in the paper)."""
    if isinstance(base, bool) or not isinstance(base, numbers.Real) or not (1 < base < math.inf):
        raise ValueError(f"{name} must be a finite number above 1 (10000 in the paper), got {base!r}")
    return float(base)
