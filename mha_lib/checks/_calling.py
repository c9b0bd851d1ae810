"""Calling the learner's code: stubs, exceptions and shortcuts become verdicts.

An exception is reported with the learner's own line (the deepest frame outside
mha_lib and torch) and, when mha_lib itself refused what the learner passed, with
mha_lib's message. Hints come from explicit tests (the exception's type and
attributes, the learner's line of code), never from the wording of PyTorch's messages.
"""

from __future__ import annotations

import copy
import inspect
import linecache
import re
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ._result import ERROR, NOT_IMPLEMENTED, Verdict, fail

_MHA_LIB = Path(__file__).resolve().parent.parent
_TORCH = Path(torch.__file__).resolve().parent
_STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


def _inside(path: str, folder: Path) -> bool:
    try:
        return Path(path).resolve().is_relative_to(folder)
    except (OSError, ValueError):
        return False


def _frames(error: BaseException) -> tuple[traceback.FrameSummary | None, traceback.FrameSummary | None]:
    """(the deepest frame of the learner's code, the mha_lib frame below it that raised, if any)."""
    learner, library = None, None
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if _inside(frame.filename, _MHA_LIB):
            if learner is None and library is None and not _inside(frame.filename, _MHA_LIB / "checks"):
                library = frame
            continue
        if _inside(frame.filename, _TORCH) or _inside(frame.filename, _STDLIB) or \
                "site-packages" in frame.filename.replace("\\", "/"):
            continue
        learner = frame
        break
    return learner, library


def _code(frame: traceback.FrameSummary | None) -> str:
    if frame is None:
        return ""
    return (frame.line or linecache.getline(frame.filename, frame.lineno or 0)).strip()


def _hint(error: BaseException, line: str, transposed: list[tuple[str, tuple[int, ...]]] | None = None) -> str:
    """A hint from what can be told for sure: the exception's type, the learner's line and the shapes of the
    tensors the line transposes with ``.T`` (``transposed``: names and shapes, read from the learner's frame)."""
    if isinstance(error, AttributeError) and getattr(error, "name", None) == "d_v":
        return ("The listing in Transformers in Action uses self.d_v, which it never defines. Every head's "
                "values have the same size as its keys: d_k = d_model // num_heads.")
    if isinstance(error, AttributeError) and getattr(error, "obj", 0) is None:
        return "Something was None: does every function you call end with a return statement?"
    if isinstance(error, NameError):
        return "A name is not defined: run the cells above this one first (or check the spelling)."
    if isinstance(error, RuntimeError) and re.match(r"(if|elif|while|assert)\b", line):
        return ("A tensor of more than one number is neither True nor False: to test whether an argument "
                "was given, write `if mask is not None:`; for its values use .all() or .any().")
    if isinstance(error, RuntimeError) and re.search(r"\.T\b", line):
        matrices = [(name, shape) for name, shape in transposed or () if len(shape) == 2]
        if matrices and len(matrices) == len(transposed or ()):
            rectangular = [(name, shape) for name, shape in matrices if shape[0] != shape[1]]
            if rectangular:
                name, shape = rectangular[0]
                return (f"{name} is a matrix {shape}, already laid out as the product needs: {name}.T turns it "
                        f"into {shape[::-1]}, which no longer fits. The transpose is the mistake here: drop the .T "
                        f"(use {name} as given, e.g. x @ {name}).")
            # only square matrices are transposed here: .T keeps their shape, so the mismatch is elsewhere
        else:
            return ("On a tensor with more than two axes .T reverses all of them: to swap the last two axes use "
                    ".transpose(-2, -1) (or .mT).")
    if isinstance(error, RuntimeError) and ".view(" in line:
        return (".view() needs sizes that multiply to the tensor's size, and a contiguous tensor: a transposed "
                "tensor isn't one. Call .contiguous() before .view(), or use .reshape().")
    if isinstance(error, RuntimeError) and "masked_fill" in line:
        return ("masked_fill takes a boolean mask (True = may attend, so block with ~mask) the shape of which "
                "broadcasts against the scores: masked_fill(~mask, float('-inf')).")
    if isinstance(error, (RuntimeError, ValueError)) and ("@" in line or "matmul" in line or "einsum" in line):
        return ("The shapes don't fit. Print the shape of every intermediate tensor; a matrix product (..., n, m) "
                "@ (..., m, p) needs the same m.")
    if isinstance(error, IndexError) and "[" in line:
        return ("An index is past the end: positions, heads and layers count from 0, so the last of n is n - 1 "
                "(a 1-based index such as [layer + 1] or [L] is one too far). Print the sizes of what you index.")
    return "Call it yourself on small inputs and read the full traceback."


def _transposed(error: BaseException, learner: traceback.FrameSummary | None,
                line: str) -> list[tuple[str, tuple[int, ...]]]:
    """The names before ``.T`` on the learner's line (``W_q.T``, ``self.W.T``) that name tensors in the
    frame that raised, with their shapes; names that can't be read are left out."""
    names = re.findall(r"([A-Za-z_][\w.]*)\.T\b", line)
    if learner is None or not names:
        return []
    frame = next((f for f, lineno in traceback.walk_tb(error.__traceback__)
                  if f.f_code.co_filename == learner.filename and lineno == learner.lineno), None)
    if frame is None:
        return []
    found = []
    for name in names:
        head, *attrs = name.split(".")
        value = frame.f_locals.get(head, frame.f_globals.get(head))
        try:
            for attr in attrs:
                value = inspect.getattr_static(value, attr) if not isinstance(value, torch.nn.Module) \
                    else getattr(value, attr)
        except AttributeError:
            continue
        if isinstance(value, torch.Tensor):
            found.append((name, tuple(value.shape)))
    return found


def _learner_frame(frame: Any) -> bool:
    path = frame.f_code.co_filename
    return not (_inside(path, _MHA_LIB) or _inside(path, _TORCH) or _inside(path, _STDLIB)
                or "site-packages" in path.replace("\\", "/"))


def stub_elsewhere(error: BaseException) -> str | None:
    """The name of another function of the learner's that raised NotImplementedError (a stub of an
    earlier exercise that the checked code calls), or None when the checked code itself is the stub.

    Only plain functions count: a method (a ``self`` argument) belongs to the class under check."""
    frames = [frame for frame, _ in traceback.walk_tb(error.__traceback__) if _learner_frame(frame)]
    if len(frames) < 2 or frames[-1].f_code is frames[0].f_code:
        return None
    deepest = frames[-1]
    name = deepest.f_code.co_name
    if name.startswith("<") or "self" in deepest.f_code.co_varnames[:1] or name == frames[0].f_code.co_name:
        return None
    return name


def describe_error(error: BaseException, what: str) -> Verdict:
    """Turn an exception from the learner's code into a short verdict with a hint."""
    if isinstance(error, NotImplementedError):
        other = stub_elsewhere(error)
        if other:
            return Verdict(NOT_IMPLEMENTED, f"not implemented yet: it calls {other}, which still raises "
                                            "NotImplementedError",
                           f"Write {other} first (an earlier exercise), run its cell, then this one.")
        return Verdict(NOT_IMPLEMENTED, "not implemented yet (it raises NotImplementedError)",
                       "Replace the `raise NotImplementedError` with your code, run the cell, then this one.")
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    learner, library = _frames(error)
    line = _code(learner)
    where = f" at line {learner.lineno}: {line}" if learner is not None and line else ""
    if library is not None:
        module = Path(library.filename).stem
        return Verdict(ERROR, f"{what} raised {type(error).__name__} in mha_lib ({module}.{library.name}): "
                              f"{text}{where}",
                       "mha_lib refused what your code passed to it on that line; its message says what was wrong.")
    return Verdict(ERROR, f"{what} raised {type(error).__name__}: {text}{where}",
                   _hint(error, line, _transposed(error, learner, line)))


class ForbiddenCallWatcher:
    """Notice whether the learner's code calls one of the course's own answers.

    It uses ``sys.setprofile`` for the duration of the call. A profiler that the learner
    runs is kept: a Python-level one is called on as well and put back afterwards; while a
    C-level one (cProfile) runs, nothing is watched and it is left alone.
    """

    def __init__(self, forbidden: Iterable[Callable[..., Any]]) -> None:
        self.codes = {f.__code__: self._name(f) for f in forbidden}
        self.called: str | None = None
        self.previous: Any = None

    @staticmethod
    def _name(f: Callable[..., Any]) -> str:
        """``mha_lib.causal_mask`` when the package exports it, else its full module path."""
        top = f.__module__.split(".")[0]
        name = f.__qualname__.split(".")[0]
        exported = getattr(sys.modules.get(top), name, None)
        if exported is f or getattr(exported, "forward", None) is f or getattr(exported, "__wrapped__", None) is f:
            return f"{top}.{f.__qualname__}"
        return f"{f.__module__}.{f.__qualname__}"

    def __enter__(self) -> ForbiddenCallWatcher:
        self.previous = sys.getprofile()
        self.active = bool(self.codes) and (self.previous is None or inspect.isfunction(self.previous)
                                            or inspect.ismethod(self.previous))
        if self.active:
            sys.setprofile(self._profile)
        return self

    def _profile(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code in self.codes and self.called is None:
            self.called = self.codes[frame.f_code]
        if self.previous is not None:
            self.previous(frame, event, arg)

    def __exit__(self, *exc: Any) -> None:
        if self.active:
            sys.setprofile(self.previous)


def accepts(fn: Callable[..., Any], keyword: str) -> bool:
    """Whether ``fn`` can be called with ``keyword=...`` (True when its signature is unknown)."""
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == keyword and p.kind is not p.POSITIONAL_ONLY or p.kind is p.VAR_KEYWORD for p in parameters)


def call(fn: Callable[..., Any], *args: Any, what: str, forbidden: Sequence[Callable[..., Any]] = (),
         **kwargs: Any) -> Any:
    """Call the learner's ``fn``; stubs, exceptions and shortcuts become verdicts."""
    if not callable(fn):
        raise fail(f"expected a function or class, got {type(fn).__name__}",
                   "Pass the function itself, without calling it: check(my_function), not check(my_function()).")
    for keyword in kwargs:
        if not accepts(fn, keyword):
            raise fail(f"{what} doesn't accept the argument {keyword}=",
                       f"Keep the exercise's signature, {keyword} included"
                       + (": def ...(..., mask=None), even when no mask is given." if keyword == "mask" else "."))
    watcher = ForbiddenCallWatcher(forbidden)
    try:
        with watcher:
            result = fn(*args, **kwargs)
    except Exception as error:  # the learner's code failed: report, don't raise
        raise describe_error(error, what) from None
    if watcher.called:
        raise fail(f"{what} calls {watcher.called}, the course's own answer",
                   "The exercise is to write it yourself; the check compares your code with it.")
    return result


def cloned(*tensors: Tensor) -> list[Tensor]:
    return [t.clone() for t in tensors]


def check_unchanged(names: Sequence[str], originals: Sequence[Tensor | None], given: Sequence[Tensor | None],
                    what: str) -> None:
    """Fail if the learner's code changed one of its inputs in place."""
    for name, original, copy in zip(names, originals, given):
        if original is not None and copy is not None and not torch.equal(original, copy):
            raise fail(f"{what} changed its input `{name}` in place",
                       "In-place operations (x /= ..., x.masked_fill_(...), x[...] = ...) overwrite the "
                       "caller's tensor; compute a new tensor instead (x = x / ..., x.masked_fill(...)).")


META = torch.device("meta")  # shapes without numbers: the checks' stand-in for a GPU on any machine
# How PyTorch and mha_lib refuse tensors of two devices in one operation. Only a match is a verdict;
# anything else the meta device can't do (read a value: .item(), nonzero, boolean indexing) passes.
_TWO_DEVICES = re.compile(r"not on the expected device|on the same device|is on cpu but")


def on_meta(value: Any) -> Any:
    """``value`` moved to the meta device: a tensor, a module (a copy), or anything with ``.to``."""
    if isinstance(value, torch.nn.Module):
        return copy.deepcopy(value).to(META)
    return value.to(META) if hasattr(value, "to") else value


def check_device_care(fn: Callable[..., Any], *args: Any, what: str, hint: str, **kwargs: Any) -> None:
    """Run ``fn`` once more with ``args`` and ``kwargs`` on the meta device (moved with :func:`on_meta`).

    A tensor that the learner's code makes on the CPU (``torch.arange(L)``, a mask without
    ``device=``) meets the inputs there, and PyTorch refuses the mix as it would on a GPU: that
    becomes a verdict naming the device, with ``hint``. The answer's numbers were checked on the CPU.
    """
    try:
        fn(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - the learner's code: a verdict or nothing, never a crash
        if _TWO_DEVICES.search(str(error)):
            message = describe_error(error, f"{what} (inputs on device 'meta', which holds shapes but no numbers, "
                                            "in place of a GPU)").message
            raise Verdict(ERROR, f"{message} (right on the CPU: it is the device that fails)", hint) from None
