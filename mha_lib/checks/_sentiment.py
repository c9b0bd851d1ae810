"""What the checks of exercises 7.3 and 7.4 share: small seeded sentiment models, their sentences,
and a guard that the learner's function leaves the model as it found it.

The models are *untrained* one-layer :class:`~mha_lib.sentiment.SentimentClassifier` s with seeded
weights that differ from each other everywhere (LayerNorm gains and biases included), so that a
misplaced piece of the computation shows in the logits: what the exercises compute doesn't depend on
training, and the checks stay fast and the same on every machine. They have dropout, and the checks
hand them over in training mode with gradients on: the learner's function must evaluate in
evaluation mode and put everything back (mode, ``requires_grad``, hooks, parameters, grad mode).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ..sentiment.data import Vocab, batch_examples, make_datasets
from ..sentiment.model import SentimentClassifier
from ._core import ERROR, Verdict, call, check_device_care, fail, gen, randn

VOCAB = Vocab.for_task()


class WatchedDropout(nn.Dropout):
    """A dropout that remembers whether it ever ran in training mode (it then changes the numbers)."""

    fired = False

    def forward(self, x: Tensor) -> Tensor:
        if self.training and self.p > 0:
            self.fired = True
        return super().forward(x)


class CheckModel(SentimentClassifier):
    """A :class:`SentimentClassifier` that also runs on the meta device, where the token checks
    (which read the ids' values) can't run; tokens on another device than the model are refused
    as PyTorch refuses them on a GPU."""

    def _check_tokens(self, tokens: Tensor) -> None:
        weight = self.token_embedding.weight
        if isinstance(tokens, Tensor) and (tokens.is_meta or weight.is_meta):
            if tokens.device != weight.device:
                raise RuntimeError(f"Tensor on device {tokens.device} is not on the expected device {weight.device}!")
            return
        super()._check_tokens(tokens)


def seeded_model(seed: int, num_heads: int, d_model: int, d_ff: int, dtype: torch.dtype,
                 dropout: float = 0.1) -> CheckModel:
    """A one-layer model with distinct seeded weights, in training mode, its dropouts watched."""
    torch.manual_seed(seed)  # the checks run inside run_check, which restores the global random state
    model = CheckModel(len(VOCAB), d_model=d_model, num_heads=num_heads, num_layers=1, d_ff=d_ff, dropout=dropout)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Dropout):
                setattr(module, name, WatchedDropout(child.p))
    g = gen(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embedding" in name:
                p.copy_(randn(g, *p.shape))
            elif p.dim() > 1:
                p.copy_(randn(g, *p.shape, scale=1.5 * p.shape[1] ** -0.5))
            elif name.endswith("weight"):  # a LayerNorm gain
                p.copy_(1.0 + randn(g, *p.shape, scale=0.4))
            else:
                p.copy_(randn(g, *p.shape, scale=0.3))
    return model.to(dtype).train()


def sentences(n: int, seed: int) -> tuple[list[Any], Tensor, Tensor]:
    """``n`` sentences of the task, their ids ``(n, L)`` (padded) and which positions are real ``(n, L)``."""
    examples = make_datasets(n_train=0, n_test=n, seed=seed)[1]
    tokens = batch_examples(examples, VOCAB)
    return examples, tokens, tokens != VOCAB.pad_id


def _hooks(model: nn.Module) -> set[tuple[str, str, int]]:
    """Every hook on the model's modules: (module, kind, handle id)."""
    kinds = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")
    return {(name, kind, key) for name, module in model.named_modules() for kind in kinds
            for key in getattr(module, kind, {})}


def call_leaving_model_alone(fn: Callable[..., Any], model: nn.Module, *args: Any, what: str,
                             forbidden: Sequence[Callable[..., Any]] = ()) -> Any:
    """Call ``fn(model, *args)``; fail, naming it, when it changed the model or the grad mode, left or
    removed a hook, or ran the model with dropout on (in training mode)."""
    grad_mode, hooks = torch.is_grad_enabled(), _hooks(model)
    modes = {name: m.training for name, m in model.named_modules()}
    wants = {name: p.requires_grad for name, p in model.named_parameters()}
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    for m in model.modules():
        if isinstance(m, WatchedDropout):
            m.fired = False
    try:
        out = call(fn, model, *args, what=what, forbidden=forbidden)
    finally:
        changed_grad = torch.is_grad_enabled() != grad_mode
        torch.set_grad_enabled(grad_mode)
    if changed_grad:
        raise fail("your function left gradients switched off for everything that runs after it",
                   "Switch them off for a block only: `with torch.no_grad():` (or the decorator @torch.no_grad()) "
                   "switches them back on when the block ends; torch.set_grad_enabled(False) does not.")
    now = _hooks(model)
    if now - hooks:
        where = sorted(now - hooks)[0][0] or "the model itself"
        raise fail(f"your function left a hook registered on the model (on {where}): every later forward pass "
                   "still runs it", "Keep the handle that register_forward_pre_hook returns and call handle.remove() in "
                   "a `finally:` block (or use a `with` block that removes it), also after an error.")
    if hooks - now:
        raise fail("your function removed a hook that it did not add (the model had one before the call)",
                   "Remove only your own hook, with its handle: handle.remove(); don't clear the module's hook "
                   "dictionaries.")
    if any(isinstance(m, WatchedDropout) and m.fired for m in model.modules()):
        raise fail("your function ran the model in training mode: its dropout was on, so the numbers are random",
                   "Evaluate in evaluation mode: was_training = model.training; model.eval(); ... and, in a "
                   "`finally:` block, model.train(was_training).")
    changed = [name for name, m in model.named_modules() if m.training != modes[name]]
    if changed:
        name = changed[0]
        mode = lambda training: "training" if training else "evaluation"  # noqa: E731
        raise fail(f"your function changed the mode of {'the model' if not name else 'model.' + name}: it was in "
                   f"{mode(modes[name])} mode and is now in {mode(not modes[name])} mode",
                   "Put back the mode you found, whichever it was: was_training = model.training before, "
                   "model.train(was_training) after (not model.train() nor model.eval()).")
    switched = [name for name, p in model.named_parameters() if p.requires_grad != wants[name]]
    if switched:
        raise fail(f"your function changed requires_grad of the model's parameters ({switched[0]}, ...)",
                   "Leave requires_grad alone: to compute without gradients use `with torch.no_grad():`, which "
                   "changes no parameter.")
    if any(not torch.equal(p.detach(), params[name]) for name, p in model.named_parameters()):
        raise fail("your function changed the model's parameters",
                   "Replace the head's output on the way through (a forward pre-hook on W_o, removed afterwards), "
                   "instead of editing weights.")
    if any(p.grad is not None for p in model.parameters()):
        raise fail("your function left gradients in the model's parameters (.grad)",
                   "Only evaluate: compute under `with torch.no_grad():` and call no backward().")
    return out


# ---------------------------------------------------------------- probes that name a slip after a wrong answer

_DRAWS = {torch.randint, torch.randperm, torch.rand, torch.randn, torch.multinomial, torch.normal}


class _LikeAGpu(TorchFunctionMode):
    """On the meta device, refuse what a GPU refuses but meta lets through: an embedding looked up with ids
    on another device, and a draw on the model's device with a CPU generator."""

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.embedding:
            ids = args[0] if args else kwargs.get("input")
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            if isinstance(ids, Tensor) and isinstance(weight, Tensor) and ids.device != weight.device:
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                                   f"{weight.device} and {ids.device} (an embedding looked up with ids on {ids.device})")
        if func in _DRAWS and kwargs.get("generator") is not None and kwargs.get("device") is not None:
            where, drawer = torch.device(kwargs["device"]), kwargs["generator"].device
            if where.type != drawer.type:
                raise RuntimeError(f"Tensor on device {drawer} is not on the expected device {where}: a generator on "
                                   f"{drawer} can't draw on {where}")
        return func(*args, **kwargs)


def device_and_grad_care(fn: Callable[..., Any], *args: Any, what: str, hint: str) -> None:
    """:func:`check_device_care` as a GPU would refuse it, called with gradients switched off: fails when the
    function leaves them switched on for a caller that had them off."""

    def like_a_gpu(*given: Any) -> Any:
        with _LikeAGpu():
            return fn(*given)

    with torch.no_grad():
        check_device_care(like_a_gpu, *args, what=what, hint=hint)
        switched_on = torch.is_grad_enabled()
    if switched_on:
        raise fail(f"{what} switched gradients on for a caller that had them off (it was called under "
                   "torch.no_grad())", "Don't end with torch.set_grad_enabled(True): `with torch.no_grad():` puts "
                   "back the grad mode it found, whichever it was.")


FLOAT64_HINT = ("Something your code makes is float32 while the model is float64: torch.tensor(...) of Python floats "
                "or of .tolist(), torch.zeros/ones/empty(...) without dtype=, .float(). Create tensors with the "
                "model's dtype (dtype=model.classifier.weight.dtype, or torch.zeros_like(...)).")


def _quiet(fn: Callable[..., Any], model: nn.Module, args: Sequence[Any]) -> Any:
    """``fn(model, *args)`` with the global random state and grad mode kept; None when it raises."""
    with torch.random.fork_rng(devices=[]):
        grad = torch.is_grad_enabled()
        try:
            return fn(model, *args)
        except Exception:  # noqa: BLE001 - a probe: no answer
            return None
        finally:
            torch.set_grad_enabled(grad)


def explain(verdict: Verdict, fn: Callable[..., Any], model: nn.Module, args: Callable[[], Sequence[Any]],
            right: Callable[[Any], bool], *, used_before: bool, label: str) -> Verdict:
    """A better verdict for a wrong answer or an error, when a probe tells its cause: the function is right on a
    fresh copy of a model it was called on before (it remembers an earlier call), or an error on a float64 model
    doesn't happen on a float32 copy (a float32 tensor of its own). ``args()`` gives fresh arguments."""
    if used_before and right(_quiet(fn, copy.deepcopy(model), args())):
        return fail(f"your function ({label}) is wrong on a model it was called on before, and right on a fresh copy "
                    "of it: it remembers something from an earlier call",
                    "Keep nothing from one call to the next (no cache keyed on the model, on some arguments only or "
                    "on shapes): compute from the arguments of this call, every time.")
    if verdict.status == ERROR and next(model.parameters()).dtype == torch.float64:
        if _quiet(fn, copy.deepcopy(model).float(), args()) is not None:
            return Verdict(ERROR, f"{verdict.message} (the same call on a float32 copy of the model runs)", FLOAT64_HINT)
    return verdict
