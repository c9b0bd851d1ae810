"""What the checks of exercises 8.4 and 8.5 share: small seeded attention-only models, the shipped
trained model, and a guard that the learner's function leaves the model as it found it.

The models are :class:`CheckModel` s, :class:`~mha_lib.induction.AttentionOnlyTransformer` s that
also run on the meta device (the checks' stand-in for a GPU), with seeded weights and biases that
differ from each other everywhere, so that a misplaced term shows. The checks hand them over in
training mode with gradients on, some with attention dropout switched on (so that running them in
training mode changes the numbers), one with a hook of its own and one with a frozen parameter:
the learner's function must compute in evaluation mode and put everything back (mode,
``requires_grad``, hooks, parameters, gradients, grad mode).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..induction.model import AttentionOnlyTransformer
from ..induction.study import load_trained
from ._core import call, fail, gen, randn


class CheckModel(AttentionOnlyTransformer):
    """An :class:`AttentionOnlyTransformer` that also runs on the meta device, where the token checks
    (which read the ids' values) can't run; tokens on another device than the model are refused as
    PyTorch refuses them on a GPU."""

    def _check_tokens(self, tokens: Tensor) -> None:
        weight = self.unembed.weight
        if isinstance(tokens, Tensor) and (tokens.is_meta or weight.is_meta):
            if tokens.device != weight.device:
                raise RuntimeError(f"Tensor on device {tokens.device} is not on the expected device {weight.device}!")
            return
        super()._check_tokens(tokens)


def seeded_model(seed: int, V: int, D: int, H: int, max_len: int, dtype: torch.dtype, layers: int = 2,
                 dropout: float = 0.0) -> CheckModel:
    """A model with learned positions and distinct seeded weights and biases, in training mode, with
    attention dropout ``dropout`` in every layer (0 in the course's model)."""
    torch.manual_seed(seed)  # the checks run inside run_check, which restores the global random state
    model = CheckModel(V, d_model=D, num_heads=H, num_layers=layers, max_len=max_len, positions="learned")
    g = gen(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embedding" in name:
                p.copy_(randn(g, *p.shape))
            elif p.dim() > 1:
                p.copy_(randn(g, *p.shape, scale=1.5 * p.shape[1] ** -0.5))
            else:
                p.copy_(randn(g, *p.shape, scale=0.5))
    for layer in model.layers:
        layer.dropout = dropout
    return model.to(dtype).train()


def trained_model() -> CheckModel:
    """The shipped trained model (``mha_lib.induction.study.load_trained``), as a :class:`CheckModel`,
    in training mode."""
    shipped = load_trained()
    model = CheckModel(shipped.vocab_size, d_model=shipped.d_model, num_heads=shipped.num_heads,
                       num_layers=shipped.num_layers, max_len=shipped.max_len, positions=shipped.positions)
    model.load_state_dict(shipped.state_dict())
    return model.train()


class Witness:
    """A forward pre-hook on every attention layer of the model that notes whether one ran in training
    mode with dropout on (its numbers were then random). It is one of the model's own hooks while the
    check runs: the learner's function must leave it in place."""

    def __init__(self, model: nn.Module) -> None:
        self.fired = False
        self.handles = [layer.register_forward_pre_hook(self._note) for layer in model.layers]

    def _note(self, module: nn.Module, args: Any) -> None:
        if module.training and getattr(module, "dropout", 0.0) > 0:
            self.fired = True

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _hooks(model: nn.Module) -> set[tuple[str, str, int]]:
    """Every hook on the model's modules: (module, kind, handle id)."""
    kinds = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")
    return {(name, kind, key) for name, module in model.named_modules() for kind in kinds
            for key in getattr(module, kind, {})}


def evaluated(model: nn.Module, compute: Callable[[], Any]) -> Any:
    """``compute()`` with the model in evaluation mode and without gradients; the mode put back."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            return compute()
    finally:
        for m, training in modes.items():
            m.training = training


def call_leaving_model_alone(fn: Callable[..., Any], model: nn.Module, *args: Any, what: str,
                             witness: Witness | None = None, forbidden: Sequence[Callable[..., Any]] = ()) -> Any:
    """Call ``fn(model, *args)``; fail, naming it, when it changed the model or the grad mode, left or
    removed a hook, or ran the model in training mode with its attention dropout on."""
    grad_mode, hooks = torch.is_grad_enabled(), _hooks(model)
    modes = {name: m.training for name, m in model.named_modules()}
    wants = {name: p.requires_grad for name, p in model.named_parameters()}
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    grads = {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}
    if witness is not None:
        witness.fired = False
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
        raise fail("your function left a hook registered on the model: it runs in every later forward pass",
                   "Keep the handle that register_forward_hook returns and call handle.remove() in a `finally:` "
                   "block, also after an error (or read what you need without a hook).")
    if hooks - now:
        raise fail("your function removed a hook that it did not add (the model had one before the call)",
                   "Remove only your own hooks, with their handles: handle.remove(); don't clear the module's hook "
                   "dictionaries.")
    if witness is not None and witness.fired:
        raise fail("your function ran the model in training mode: its attention dropout was on, so the attention "
                   "weights were random",
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
                   "Read the weights, don't write them: no in-place operation (mul_, copy_, +=) on a parameter or on a "
                   "slice of one (a slice of .weight is a view of it).")
    for name, p in model.named_parameters():
        before = grads[name]
        if (before is None) != (p.grad is None) or (before is not None and not torch.equal(before, p.grad)):
            raise fail("your function changed the gradients stored in the model's parameters (.grad)",
                       "Only evaluate: compute under `with torch.no_grad():` and call no backward().")
    return out
