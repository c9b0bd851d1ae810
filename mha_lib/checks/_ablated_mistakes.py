"""The known mistakes of exercise 7.3 (mean- and resample-ablation), for :mod:`.ablated_logits`: the reference
computations (each head's output as ``W_o`` receives it, the logits with some replaced) and what each mistake
would have returned on the same inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..sentiment import attribution as _attribution
from ._core import Mistake


@torch.no_grad()
def outputs(model: nn.Module, tokens: Tensor) -> Tensor:
    """``(N, L, H, d_k)``: every head's output at every position, as ``W_o`` receives it, in evaluation mode."""
    attention = model.layers[0].self_attn
    got: list[Tensor] = []
    handle = attention.W_o.register_forward_pre_hook(lambda module, args: got.append(args[0].detach()))
    was_training = model.training
    model.eval()
    try:
        model(tokens)
    finally:
        handle.remove()
        model.train(was_training)
    N, L, _ = got[0].shape
    return got[0].view(N, L, model.num_heads, -1)


@torch.no_grad()
def logits_with(model: nn.Module, tokens: Tensor, heads: Sequence[int], values: Tensor | None,
                after: bool = False) -> Tensor:
    """The logits with the heads' outputs at ``<cls>`` set to ``values`` (``(len(heads), d_k)`` or
    ``(B, len(heads), d_k)``) before ``W_o`` (the library's ``replace_heads``), or, with ``after``,
    the heads' slices of ``W_o``'s output; ``values=None``: the intact model."""
    was_training = model.training
    model.eval()
    try:
        if values is None:
            return model(tokens)
        if not after:
            with _attribution.replace_heads(model, list(heads), values):
                return model(tokens)
        H = model.num_heads

        def swap(module: nn.Module, args: Any, output: Tensor) -> Tensor:
            out = output.clone()
            at_cls = out[:, 0].view(out.size(0), H, -1)
            at_cls[:, list(heads)] = values.to(out.dtype)
            return out

        handle = model.layers[0].self_attn.W_o.register_forward_hook(swap)
        try:
            return model(tokens)
        finally:
            handle.remove()
    finally:
        model.train(was_training)


def _after_w_o(model: nn.Module, reference: Tensor) -> Tensor:
    """``(M, H, d_k)``: the heads' slices of ``W_o``'s output at ``<cls>`` on the reference sentences."""
    concat = outputs(model, reference)[:, 0].flatten(1)  # (M, H * d_k)
    with torch.no_grad():
        return model.layers[0].self_attn.W_o(concat).view(concat.size(0), model.num_heads, -1)


def draw(generator_state: Tensor, high: int, size: tuple[int, ...]) -> Tensor:
    g = torch.Generator()
    g.set_state(generator_state)
    return torch.randint(high, size, generator=g)


def mistakes(model: nn.Module, tokens: Tensor, heads: list[int], how: str, reference: Tensor, ref_real: Tensor,
              state: Tensor, seed: int) -> list[Mistake]:
    B, M, H = tokens.size(0), reference.size(0), model.num_heads
    everyone = list(range(H))
    ref, own = outputs(model, reference), outputs(model, tokens)  # (M, L', H, d_k), (B, L, H, d_k)
    cls_ref = ref[:, 0]  # (M, H, d_k)
    pick = draw(state, M, (B,))
    with_values = lambda values, who=heads, after=False: lambda: logits_with(model, tokens, who, values, after)  # noqa: E731
    real = ref_real.to(ref.dtype)[:, :, None, None]  # (M, L', 1, 1)
    common: list[Mistake] = [
        ("nothing was replaced (these are the intact model's logits)", with_values(None),
         "Register the pre-hook on W_o itself (model.layers[0].self_attn.W_o: its input holds the heads side by "
         "side), run the model *while* the hook is registered (inside the `with` block or before handle.remove()), and "
         "write at position 0 (<cls>): in a one-layer model a replacement at any other position never reaches the "
         "classifier."),
        ("zero-ablation (the heads' outputs set to zero)",
         with_values(torch.zeros(len(heads), cls_ref.size(-1), dtype=cls_ref.dtype)),
         "Write the heads' mean output (how='mean') or a reference sentence's output (how='resample'), not zeros."),
    ]
    others = [h for h in everyone if h not in heads]
    chosen = (lambda at: at.mean(0)) if how == "mean" else (lambda at: at[pick])  # noqa: E731
    d_k = cls_ref.size(-1)
    interleaved = cls_ref.flatten(1).view(M, d_k, H).transpose(1, 2)  # head h read as features h, h + H, ...
    common += [
        ("the heads *not* in `heads` were replaced, and those listed kept their own outputs",
         lambda: with_values(chosen(cls_ref)[..., others, :], others)(),
         "Replace the heads listed in `heads` (for h in heads), and leave the others as they are."),
        ("only some of the heads in `heads` were replaced (e.g. heads[0] alone)",
         lambda: [with_values(chosen(cls_ref)[..., [h], :], [h])() for h in heads] if len(heads) > 1 else [],
         "Replace every head listed in `heads` (for h in heads, or index with the whole list), not only the first."),
        ("each head's features were read as interleaved (a (d_k, H) view: head h as features h, h+H, ...)",
         lambda: _interleaved(model, tokens, heads, chosen(interleaved)[..., heads, :]),
         "W_o's input holds the heads side by side: head h owns features [h*d_k, (h+1)*d_k), so view it as "
         "(B, H, d_k) (or slice h*d_k:(h+1)*d_k), not as (B, d_k, H)."),
        ("the heads' outputs (W_o's input) were written into W_o's output, after W_o",
         with_values(chosen(cls_ref[:, heads]), after=True),
         "W_o mixes every head into every output feature: replace the head's slice of W_o's *input* (a forward "
         "pre-hook on W_o, args[0]), not of its output."),
    ]
    if how == "mean":
        mean = cls_ref[:, heads].mean(0)  # (len(heads), d_k)
        specific: list[Mistake] = [
            ("every head was replaced, not only those in `heads`", with_values(cls_ref.mean(0), everyone),
             "Replace only the heads listed in `heads`; the others keep their own outputs."),
            ("a sum over the reference sentences instead of their mean", with_values(cls_ref[:, heads].sum(0)),
             "Divide by the number of reference sentences: .mean(dim=0) of the (M, len(heads), d_k) outputs."),
            ("the mean was taken over the evaluated sentences (`tokens`), not over the reference sentences",
             with_values(own[:, 0, heads].mean(0)),
             "The mean comes from the reference sentences (the training sentences in the notebook), the same "
             "value for every evaluated sentence: read the heads' outputs on `reference`."),
            ("the mean over every position, padding included, instead of the outputs at <cls>",
             lambda: [with_values(ref[:, :, heads].mean((0, 1)))(),
                      with_values(own[:, :, heads].mean((0, 1)))()],
             "Only position 0 (<cls>) reaches the classifier: average the heads' outputs at position 0 over the "
             "reference sentences, [:, 0]; padded positions are not even words."),
            ("the mean over every word of the reference sentences (padding left out), not only <cls>",
             with_values((ref[:, :, heads] * real).sum((0, 1)) / real.sum((0, 1))),
             "Only position 0 (<cls>) reaches the classifier: average over the reference sentences at position 0."),
            ("the mean was taken over the wrong axis (over the d_k features, one number per head)",
             with_values(cls_ref[:, heads].mean(-1, keepdim=True).mean(0).expand(len(heads), cls_ref.size(-1))),
             "Average over the sentences (dim 0 of (M, H, d_k)), keep each head's d_k features."),
            ("the mean was taken over the heads too (one vector for every head)",
             lambda: [with_values(cls_ref.mean((0, 1)).expand(len(heads), -1))(),
                      with_values(cls_ref[:, heads].mean((0, 1)).expand(len(heads), -1))()],
             "Average over the sentences only (dim 0 of (M, H, d_k)): each head keeps its own mean."),
            ("the heads' slices were replaced after W_o (in its output) instead of before it",
             with_values(_after_w_o(model, reference)[:, heads].mean(0), after=True),
             "W_o mixes every head into every output feature: replace the head's slice of W_o's *input* (a forward "
             "pre-hook on W_o), not of its output."),
            ("the mean over the positions of the first reference sentence (args[0][0]) instead of over the "
             "sentences at <cls> (args[0][:, 0])", with_values(ref[0, :, heads].mean(0)),
             "W_o's input is (M, L', H * d_k): position 0 of every sentence is args[0][:, 0]; args[0][0] is every "
             "position of the first sentence."),
            ("the median over the reference sentences instead of their mean",
             with_values(cls_ref[:, heads].median(0).values), "Take the mean: .mean(dim=0)."),
            ("a mean weighted by the sentences' lengths instead of the plain mean over the reference sentences",
             with_values((cls_ref[:, heads] * real[:, :, 0].sum(1)[:, None]).sum(0) / real[:, :, 0].sum()),
             "Every reference sentence counts once: .mean(dim=0) over the sentences."),
            ("resample-ablation (one reference sentence per evaluated sentence) instead of the mean",
             with_values(cls_ref[pick][:, heads]), "how='mean' writes the same mean vector for every sentence."),
        ]
    else:
        specific = [
            ("every head was replaced, not only those in `heads`", with_values(cls_ref[pick], everyone),
             "Replace only the heads listed in `heads`; the others keep their own outputs."),
            ("no shuffle: sentence b took reference sentence b", with_values(cls_ref[torch.arange(B) % M][:, heads]),
             "Draw the reference sentences at random: pick = torch.randint(M, (B,), generator=generator)."),
            ("the resampled outputs came from the evaluated sentences (`tokens`), not the reference sentences",
             lambda: [with_values(own[:, 0][draw(state, B, (B,))][:, heads])(),
                      with_values(own[:, 0][pick % B][:, heads])()],
             "Draw among the reference sentences (pick in [0, M)) and read the heads' outputs on `reference`."),
            ("a different reference sentence for each head (one draw per head)",
             lambda: _per_head(model, tokens, heads, cls_ref, state, M, B),
             "Draw once per call: pick = torch.randint(M, (B,), generator=generator); every head in `heads` takes "
             "its output on the same reference sentence pick[b], a whole report about one other sentence."),
            ("a permutation (torch.randperm) instead of torch.randint",
             lambda: with_values(cls_ref[_permutation(state, M)[:B]][:, heads])(),
             "Draw with replacement, as the exercise says: pick = torch.randint(M, (B,), generator=generator), the "
             "draw every resampled model is compared with."),
            ("one reference sentence for the whole batch", with_values(cls_ref[draw(state, M, (1,))[0]][heads]),
             "One reference sentence per evaluated sentence: pick = torch.randint(M, (B,), generator=generator)."),
            ("the mean of the reference outputs instead of a resampled one", with_values(cls_ref[:, heads].mean(0)),
             "how='resample' writes, for sentence b, the heads' outputs on reference sentence pick[b]."),
            ("the generator was re-seeded inside your function",
             lambda: [with_values(cls_ref[torch.randint(M, (B,), generator=torch.Generator().manual_seed(s))]
                                  [:, heads])() for s in sorted({seed, 0})],
             "Use the generator as it is handed to you (it may have drawn numbers before): no manual_seed, and "
             "no torch.Generator() of your own."),
            ("the heads' slices were replaced after W_o (in its output) instead of before it",
             with_values(_after_w_o(model, reference)[pick][:, heads], after=True),
             "W_o mixes every head into every output feature: replace the head's slice of W_o's *input* (a forward "
             "pre-hook on W_o), not of its output."),
        ]
    return common + specific


def _permutation(state: Tensor, M: int) -> Tensor:
    g = torch.Generator()
    g.set_state(state)
    return torch.randperm(M, generator=g)


def _per_head(model: nn.Module, tokens: Tensor, heads: list[int], cls_ref: Tensor, state: Tensor, M: int,
              B: int) -> list[Tensor]:
    g = torch.Generator()
    g.set_state(state)
    one_by_one = torch.stack([torch.randint(M, (B,), generator=g) for _ in heads], 1)  # (B, len(heads))
    at_once = draw(state, M, (B, len(heads)))
    transposed = draw(state, M, (len(heads), B)).T
    who = torch.tensor(heads)
    return [logits_with(model, tokens, heads, cls_ref[picks, who]) for picks in (one_by_one, at_once, transposed)]


def _interleaved(model: nn.Module, tokens: Tensor, heads: list[int], values: Tensor) -> Tensor:
    """The logits when the heads' features are written as a (d_k, H) view of W_o's input at <cls>."""
    H = model.num_heads

    def swap(module: nn.Module, args: Any) -> tuple[Tensor, ...]:
        x = args[0].clone()
        at_cls = x[:, 0].view(x.size(0), -1, H)  # (B, d_k, H): the mistaken view
        at_cls[:, :, heads] = values.to(x.dtype).transpose(-1, -2)
        return (x, *args[1:])

    was_training = model.training
    model.eval()
    handle = model.layers[0].self_attn.W_o.register_forward_pre_hook(swap)
    try:
        with torch.no_grad():
            return model(tokens)
    finally:
        handle.remove()
        model.train(was_training)


def named_draw(model: nn.Module, tokens: Tensor, heads: list[int], reference: Tensor, state: Tensor,
               out: Tensor, label: str) -> str | None:
    """When every sentence of a resampled answer got the heads' outputs on *some* reference sentence, which
    ones, and the mistake that drew them (None when some sentence got anything else)."""
    cls_ref = outputs(model, reference)[:, 0]  # (M, H, d_k)
    M, B = cls_ref.size(0), tokens.size(0)
    tol = 1e-7 if out.dtype == torch.float64 else 1e-4
    each = torch.stack([logits_with(model, tokens, heads, cls_ref[m, heads]) for m in range(M)])  # (M, B, 2)
    fits = torch.isclose(each.double(), out.detach().to("cpu", torch.float64)[None], atol=tol, rtol=tol).all(-1)
    if not fits.any(0).all():
        return None
    g = torch.Generator()
    g.set_state(state)
    twice = [torch.randint(M, (B,), generator=g) for _ in range(2)][1]
    g.set_state(state)
    from_one = torch.randint(1, M, (B,), generator=g)
    candidates = [("pick was drawn from [0, M - 1) (torch.randint(M - 1, ...)): the last reference sentence is never "
                   "drawn", draw(state, M - 1, (B,))),
                  ("pick was drawn from [1, M): the first reference sentence is never drawn", from_one),
                  ("the generator was drawn from twice (pick is the second draw)", twice)]
    if B < M:  # torch.randint(B, ...): the number of evaluated sentences where the reference's M belongs
        candidates.append(("pick was drawn from [0, B) (torch.randint(tokens.size(0), ...)): its upper end is the "
                           "number of evaluated sentences, not of reference sentences", draw(state, B, (B,))))
    for name, pick in candidates:
        if bool(fits[pick, torch.arange(B)].all()):
            return f"wrong logits ({label}): it looks like {name}"
    return (f"wrong logits ({label}): each sentence got the heads' outputs on a reference sentence, but not on "
            f"pick[b]: yours fit {[int(fits[:, b].nonzero()[0]) for b in range(B)]}, pick = "
            f"{draw(state, M, (B,)).tolist()}")
