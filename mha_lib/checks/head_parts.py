"""Check for exercise 8.4 (chapter 08): a layer-1 head's output split into its token, position and
bias parts.

The reference is :func:`mha_lib.induction.circuits.head_parts`, computed in evaluation mode on a
float64 copy of the model. The models (:mod:`._circuits`) are seeded untrained ones, handed over in
training mode with attention dropout on, gradients on and a hook of their own, one in evaluation
mode with a frozen embedding, and the shipped trained model; between two calls the check changes
the weights of one model. A wrong answer is compared with the known mistakes, as a whole and part
by part; otherwise the verdict says which part differs, at which queries, and whether the three
still add up to the head's output.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..induction import circuits as _circuits
from ..induction.data import repeated_segments
from ._circuits import CheckModel, Witness, call_leaving_model_alone, evaluated, seeded_model, trained_model
from ._core import (CheckResult, Mistake, Verdict, check_device_care, close, expect_tensor, fail, float32_close,
                    gen, on_meta, run_check, where_differs, PRECISION_HINT)

PARTS = ("token", "position", "bias")
DEFINITION = ("With A = head `head`'s attention weights in layer 1 (model(tokens, return_weights=True)[1][0][:, head], "
              "in evaluation mode), W_v^h = model.layers[0].W_v.weight[rows], b_v^h = model.layers[0].W_v.bias[rows], "
              "W_o^h = model.layers[0].W_o.weight[:, rows], rows = head * d_k ... (head + 1) * d_k - 1: token = "
              "A @ E @ W_v^h.T @ W_o^h.T with E = model.token_embedding(tokens); position = the same with the first L "
              "rows of model.position_embedding; bias = b_v^h @ W_o^h.T at every (b, i). W_o's own bias is in no part.")
DEVICE_HINT = ("Make every tensor you create on the model's device (torch.zeros(..., device=tokens.device), "
               "torch.arange(L, device=tokens.device)): the notebook calls this on the model's device.")
FORBIDDEN = [_circuits.head_parts]


def _unpack(out: Any, what: str) -> list[Any]:
    """The three parts, from a tuple, a list or a dict with the keys token, position, bias."""
    if isinstance(out, dict):
        missing = [k for k in PARTS if k not in out]
        if missing:
            raise fail(f"{what}: a dict without the key(s) {', '.join(map(repr, missing))}",
                       "Return the three parts as a tuple: return token, position, bias.")
        return [out[k] for k in PARTS]
    if isinstance(out, Tensor) and out.dim() >= 1 and out.size(0) == 3 and out.dim() == 4:
        return list(out)  # a stacked (3, B, L, D) tensor is three parts too
    if out is None or isinstance(out, Tensor) or not isinstance(out, (tuple, list)) or len(out) != 3:
        if out is None:
            raise Verdict("not implemented", f"not implemented yet ({what} returned None)",
                          "Does your function end with a return statement?")
        got = (f"one tensor {tuple(out.shape)}" if isinstance(out, Tensor)
               else f"{type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else type(out).__name__)
        raise fail(f"{what} returned {got}; expected three tensors (token, position, bias)",
                   "End with: return token, position, bias, each (B, L, D).")
    return list(out)


def _shape_hint(part: Any, name: str, B: int, H: int, L: int, D: int, what: str) -> None:
    if not isinstance(part, Tensor):
        return
    shape = tuple(part.shape)
    if shape == (B, H, L, D):
        raise fail(f"the {name} part {what} has shape {shape}: every head's, expected head `head`'s only "
                   f"(B, L, D) = {(B, L, D)}", "Keep one head: index the head axis with [:, head].")
    if name == "bias" and shape in ((D,), (1, D), (1, 1, D), (L, D), (1, L, D)):
        raise fail(f"the bias part {what} has shape {shape}, expected (B, L, D) = {(B, L, D)}",
                   "It is the same vector at every query of every sequence: .expand(B, L, D) it (the rows of A sum "
                   "to 1, so sum_j A_ij b_v^h W_o^h = b_v^h W_o^h).")
    if name == "position" and shape in ((L, D), (1, L, D)):
        raise fail(f"the position part {what} has shape {shape}, expected (B, L, D) = {(B, L, D)}",
                   "Each sequence has its own attention weights A, so its own mix of the positions: A @ P gives "
                   "(B, L, D) when A is (B, L, L).")
    if name == "position" and len(shape) == 3 and shape[0] == B and shape[2] == D and shape[1] != L:
        raise fail(f"the position part {what} has shape {shape}: {shape[1]} positions for {L} tokens",
                   "A sequence of L tokens reads the first L rows of model.position_embedding: [:L].")


class _Pieces:
    """Everything the right answer and the mistakes are made of, in float64, in evaluation mode."""

    def __init__(self, model: CheckModel, tokens: Tensor, head: int) -> None:
        m = copy.deepcopy(model).double().eval()
        for layer in m.layers:
            layer.dropout = 0.0
        self.model, self.tokens, self.head = m, tokens, head
        layer = m.layers[0]
        B, L = tokens.shape
        H, d_k, D = layer.num_heads, layer.d_k, layer.d_model
        self.B, self.L, self.H, self.d_k, self.D = B, L, H, d_k, D
        with torch.no_grad():
            self.E = m.token_embedding(tokens)  # (B, L, D)
            self.table = m.position_embedding.detach().clone()  # (max_len, D)
            self.P = self.table[:L]  # (L, D)
            x = self.E + self.P
            q = layer.W_q(x).view(B, L, H, d_k).transpose(1, 2)  # (B, H, L, d_k)
            k = layer.W_k(x).view(B, L, H, d_k).transpose(1, 2)
            self.raw = q @ k.transpose(-2, -1)  # (B, H, L, L), unscaled
            self.causal = torch.ones(L, L, dtype=torch.bool).tril()
            self.A_all = self.soft(self.raw / math.sqrt(d_k))  # (B, H, L, L)
            _, weights = m(tokens, return_weights=True)
            self.A_layer2 = weights[1] if len(weights) > 1 else None
            self.Wv_full, self.bv_full = layer.W_v.weight.detach(), layer.W_v.bias.detach()
            self.Wo_full, self.bo = layer.W_o.weight.detach(), layer.W_o.bias.detach()
            self.reference = {k: v[:, head] for k, v in _circuits.head_parts(m, tokens).items()}
            self.total = m.head_outputs(tokens)[0][:, head]

    def soft(self, scores: Tensor, masked: bool = True) -> Tensor:
        return (scores.masked_fill(~self.causal, float("-inf")) if masked else scores).softmax(-1)

    def rows(self, h: int) -> slice:
        return slice(h * self.d_k, (h + 1) * self.d_k)

    def triple(self, *, A: Tensor | None = None, h_v: int | None = None, h_o: int | None = None,
               Wv: Tensor | None = None, bv: Tensor | None = None, Wo: Tensor | None = None, P: Tensor | None = None,
               bias_weights: str = "one") -> Tensor:
        """``(3, B, L, D)``: token, position, bias parts, each piece replaceable. ``Wv`` ``(d_k, D)`` is used as
        ``x @ Wv.T``, ``Wo`` ``(D, d_k)`` as ``v @ Wo.T``; ``bias_weights``: ``"one"`` (the rows of A sum to 1),
        ``"rows"`` (the sum of A's row), ``"count"`` (the i + 1 keys unweighted), ``"all"`` (all L keys)."""
        h = self.head
        A = self.A_all[:, h] if A is None else A
        rv, ro = self.rows(h if h_v is None else h_v), self.rows(h if h_o is None else h_o)
        Wv = self.Wv_full[rv] if Wv is None else Wv
        bv = self.bv_full[rv] if bv is None else bv
        Wo = self.Wo_full[:, ro] if Wo is None else Wo
        P = self.P if P is None else P
        token = A @ (self.E @ Wv.T @ Wo.T)
        position = A @ (P @ Wv.T @ Wo.T)
        one = bv @ Wo.T  # (D,)
        count = {"one": torch.ones(self.B, self.L, 1, dtype=A.dtype), "rows": A.sum(-1, keepdim=True),
                 "count": torch.arange(1, self.L + 1, dtype=A.dtype)[None, :, None].expand(self.B, self.L, 1),
                 "all": torch.full((self.B, self.L, 1), float(self.L), dtype=A.dtype)}[bias_weights]
        return torch.stack([token, position, count * one])


def _mistakes(p: _Pieces) -> list[Mistake]:
    t, pos, b = p.triple()
    zero = torch.zeros_like(b)
    h, H, B, L = p.head, p.H, p.B, p.L
    others = [g for g in range(H) if g != h]
    bo = p.bo.expand_as(b)
    eye = torch.eye(L, dtype=t.dtype).expand(B, L, L)
    causal = p.causal.to(t.dtype)
    uniform = causal / causal.sum(-1, keepdim=True)
    unmasked = p.soft(p.raw[:, h] / math.sqrt(p.d_k), masked=False)
    stack = lambda *parts: torch.stack(parts)  # noqa: E731
    return [
        ("W_o's bias was added to the bias part", lambda: [stack(t, pos, b + bo), stack(t, pos, b + bo / H)],
         "W_o's bias is added once to the layer's output, after the heads are summed: it belongs to no head, so to "
         "none of head h's parts. The bias part is b_v^h W_o^h only."),
        ("W_o's bias was added to the token or the position part",
         lambda: [stack(t + bo, pos, b), stack(t, pos + bo, b), stack(t + bo / H, pos, b), stack(t, pos + bo / H, b),
                  stack(t + bo, pos + bo, b)],
         "W_o's bias belongs to no head: it is added once to the layer's output, after the heads are summed. Use "
         "only W_o's weight columns of head h."),
        ("W_v's bias was left out (the bias part is zero)", lambda: stack(t, pos, zero),
         "W_v has a bias: each value is x_j W_v^h.T + b_v^h, and sum_j A_ij b_v^h W_o^h.T = b_v^h W_o^h.T, since the "
         "weights of a row sum to 1. That is the bias part."),
        ("W_v's bias was counted in the token or the position part, not in the bias part",
         lambda: [stack(t + b, pos, zero), stack(t, pos + b, zero), stack(t + b, pos + b, zero),
                  stack(t + b, pos + b, b), stack(t + b, pos, b), stack(t, pos + b, b)],
         "Keep the three apart: the token part is A @ (E W_v^h.T) W_o^h.T without the bias, the position part the "
         "same with P, and b_v^h W_o^h.T alone is the bias part."),
        ("W_v's bias was summed over the keys without the attention weights",
         lambda: [p.triple(bias_weights="count"), p.triple(bias_weights="all")],
         "Weighted by A, the bias of every key adds up to b_v^h W_o^h.T once (a row of A sums to 1); summed without "
         "the weights it counts once per key."),
        ("the position rows don't line up with the tokens (token j must read row j of the table)",
         lambda: [p.triple(P=p.table[-L:]), p.triple(P=p.table[1:L + 1]), p.triple(P=p.table.flip(0)[:L]),
                  p.triple(P=p.table[:L].flip(0))],
         "Layer 1 reads x_j = E[t_j] + P_j: position j of every sequence reads row j, the first L rows: "
         "model.position_embedding[:L]."),
        ("the positions were looked up by token id (model.position_embedding[tokens])",
         lambda: p.triple(P=p.table[p.tokens]),
         "Token j sits at position j whatever its id: P_j is row j of model.position_embedding, the first L rows "
         "[:L], the same for every sequence."),
        ("the attention weights of another head",
         lambda: [p.triple(A=p.A_all[:, g]) for g in others],
         "Take head h's weights from layer 1: weights[0][:, head] of model(tokens, return_weights=True)."),
        ("the attention weights of layer 2, not layer 1",
         lambda: [p.triple(A=p.A_layer2[:, g]) for g in range(H)],
         "model(tokens, return_weights=True) returns one weights tensor per layer; layer 1's is the first, "
         "weights[0]."),
        ("the attention weights were not applied: each query took only its own token's value",
         lambda: p.triple(A=eye),
         "Head h's output at query i is a weighted sum over the keys j <= i: A @ values, with A (B, L, L)."),
        ("uniform attention weights (the mean over keys 0 ... i), not the head's own",
         lambda: p.triple(A=uniform.expand(B, L, L)),
         "Use the head's own weights: weights[0][:, head] of model(tokens, return_weights=True)."),
        ("the values were summed over the keys without the attention weights",
         lambda: [p.triple(A=causal.expand(B, L, L)), p.triple(A=causal.expand(B, L, L), bias_weights="count"),
                  p.triple(A=torch.ones(B, L, L, dtype=t.dtype), bias_weights="all"),
                  p.triple(A=torch.ones(B, L, L, dtype=t.dtype) / L)],
         "Weight each key's value by A[b, i, j] and sum over the keys: A @ values."),
        ("the causal mask was left out (every query also reads the keys after it)",
         lambda: [p.triple(A=unmasked), p.triple(A=unmasked * causal), p.triple(A=unmasked * causal, bias_weights="rows")],
         "The model's attention is causal: a query reads only keys j <= i. Take the weights from the model "
         "(model(tokens, return_weights=True)), or mask the scores with -inf above the diagonal before the softmax."),
        ("the scores were not divided by sqrt(d_k) before the softmax",
         lambda: p.triple(A=p.soft(p.raw[:, h])),
         "Take the weights from the model: model(tokens, return_weights=True)[1][0][:, head]."),
        ("W_o's columns of another head",
         lambda: [p.triple(h_o=g) for g in others],
         "Head h's slice of W_o is its columns h * d_k ... (h + 1) * d_k - 1: W_o.weight[:, rows], the same rows as "
         "W_v's."),
        ("W_v's rows (and b_v) of another head",
         lambda: [p.triple(h_v=g) for g in others] + [p.triple(h_v=g, h_o=g) for g in others],
         "Head h reads W_v's rows h * d_k ... (h + 1) * d_k - 1 (and the same entries of b_v)."),
        ("the slice head : head + d_k instead of head * d_k : (head + 1) * d_k",
         lambda: p.triple(Wv=p.Wv_full[h:h + p.d_k], bv=p.bv_full[h:h + p.d_k], Wo=p.Wo_full[:, h:h + p.d_k]),
         "Head h owns the d_k features h * d_k ... (h + 1) * d_k - 1: slice(head * d_k, (head + 1) * d_k)."),
        ("W_o was not transposed: its rows of head h were used, not its columns",
         lambda: [p.triple(Wo=p.Wo_full[p.rows(h), :].T)],
         "nn.Linear stores W_o.weight as (out, in) = (D, H * d_k): head h's slice is its columns, "
         "W_o.weight[:, rows], applied as v @ W_o_h.T."),
        ("W_v's columns were sliced instead of its rows",
         lambda: [p.triple(Wv=p.Wv_full[:, p.rows(h)].T)],
         "nn.Linear stores W_v.weight as (out, in) = (H * d_k, D): head h's slice is its rows, W_v.weight[rows], "
         "applied as x @ W_v_h.T."),
        ("the token part read the positions too (E[t] + P), not the token embeddings alone",
         lambda: [stack(t + pos, pos, b), stack(t + pos, zero, b)],
         "Split x_j = E[t_j] + P_j: the token part reads E[t_j] only (model.token_embedding(tokens), not "
         "model.embed(tokens)), the position part P_j only."),
        ("the position part read the wrong rows of the position table (reversed, or its last L rows), not its "
         "first L",
         lambda: [p.triple(P=p.P.flip(0))] + ([p.triple(P=p.table[-L:])] if p.table.size(0) > L else []),
         "Position j reads row j of model.position_embedding: the first L rows, in order, "
         "model.position_embedding[:L]."),
        ("the parts are in the wrong order",
         lambda: [torch.stack([(t, pos, b)[i] for i in order]) for order in itertools.permutations(range(3))
                  if order != (0, 1, 2)],
         "Return them in the order token, position, bias."),
    ]


def _diagnose(parts: list[Tensor], p: _Pieces, label: str) -> Verdict:
    actual = torch.stack([x.detach().to("cpu", torch.float64) for x in parts])
    dtype = parts[0].dtype
    mistakes = _mistakes(p)
    candidates: list[tuple[str, str, list[Tensor]]] = []
    for name, compute, hint in mistakes:
        try:
            found = compute()
        except Exception:  # a mistake that can't happen with these shapes
            continue
        found = [found] if isinstance(found, Tensor) else found
        candidates.append((name, hint, found))
        if any(close(actual.to(dtype), c) for c in found):
            return fail(f"wrong parts ({label}): it looks like {name}", hint)
    expected = torch.stack([p.reference[k] for k in PARTS])
    if dtype == torch.float64 and float32_close(actual, expected):
        return fail(f"wrong parts ({label}): right only up to float32's rounding (about 1e-7 of each value), so part "
                    "of the computation ran in float32 while the model is float64", PRECISION_HINT)
    wrong = [i for i in range(3) if not close(actual[i].to(dtype), expected[i])]
    named = []
    for i in wrong:
        for name, hint, found in candidates:
            if name != "the parts are in the wrong order" and any(close(actual[i].to(dtype), c[i]) for c in found):
                named.append((PARTS[i], name, hint))
                break
    total = actual.sum(0)
    adds_up = close(total.to(dtype), p.total)
    sums = ("together they still add up to model.head_outputs(tokens)[0][:, head], so the split is what's wrong"
            if adds_up else "and together they don't add up to model.head_outputs(tokens)[0][:, head]")
    if named:
        said = "; ".join(f"the {part} part looks like {name}" for part, name, _ in named)
        return fail(f"wrong parts ({label}): {said}", " ".join(hint for _, _, hint in named))
    where = "; ".join(f"the {PARTS[i]} part: {where_differs(actual[i], expected[i], dim=-2, axis='query')}"
                      for i in wrong)
    right = [PARTS[i] for i in range(3) if i not in wrong]
    good = f"the {' and '.join(right)} part{'s are' if len(right) > 1 else ' is'} right; " if right else ""
    return fail(f"wrong parts ({label}): {good}{where}; {sums}", DEFINITION)


def _compare(out: Any, model: CheckModel, tokens: Tensor, head: int, label: str) -> None:
    B, L = tokens.shape
    H, D = model.num_heads, model.d_model
    dtype = next(model.parameters()).dtype
    what = f"your function ({label})"
    parts = _unpack(out, what)
    for name, part in zip(PARTS, parts):
        _shape_hint(part, name, B, H, L, D, f"({label})")
    parts = [expect_tensor(part, f"the {name} part ({label})", (B, L, D), dtype=dtype, explain=" (B, L, D)")
             for name, part in zip(PARTS, parts)]
    p = _Pieces(model, tokens, head)
    if all(close(part, p.reference[name]) for name, part in zip(PARTS, parts)):
        return
    raise _diagnose(parts, p, label)


def _stale_parts(out: Any, earlier: list[tuple[list[Tensor], str]], tokens: Tensor, D: int, label: str) -> None:
    """Fail when the parts are those of an earlier call (with other arguments): a result kept from call to call."""
    if not isinstance(out, (tuple, list)) or not all(isinstance(x, Tensor) for x in out):
        return
    for parts, then in earlier:
        if len(parts) == len(out) and all(x.shape == y.shape and torch.equal(x.detach(), y) for x, y in zip(out, parts)):
            B, L = tokens.shape
            raise fail(f"your function ({label}) returned the parts it returned for an earlier call ({then}), "
                       f"shape {tuple(parts[0].shape)} where this call's are {(B, L, D)}: it looks like a result kept "
                       "from call to call (e.g. a cache keyed on the head only)",
                       "Compute the parts from the model, tokens and head you are given, every call: no cache, no "
                       "global variable, nothing kept from an earlier call.")


def check_head_parts(fn: Callable[[CheckModel, Tensor, int], Any]) -> CheckResult:
    """Check ``fn(model, tokens, head) -> (token, position, bias)``, each ``(B, L, D)`` in the model's
    dtype: layer 1's head ``head`` output split into ``A @ E W_v^h.T W_o^h.T``, ``A @ P W_v^h.T W_o^h.T``
    and ``b_v^h W_o^h.T`` (:func:`mha_lib.induction.circuits.head_parts`), computed in evaluation mode; the
    model left as it was found (mode, requires_grad, hooks, parameters, gradients)."""

    def body() -> str:
        first = seeded_model(84, V=8, D=12, H=3, max_len=9, dtype=torch.float64, dropout=0.3)
        second = seeded_model(85, V=7, D=8, H=2, max_len=12, dtype=torch.float32, dropout=0.3).eval()
        second.token_embedding.weight.requires_grad_(False)  # requires_grad must come back as it was, not all True
        trained = trained_model()
        witnesses = [Witness(m) for m in (first, second, trained)]
        tokens_full = torch.randint(8, (4, 9), generator=gen(84))  # L = max_len: every row of the table
        tokens_short = torch.randint(8, (3, 6), generator=gen(184))
        batch = repeated_segments(6, trained.max_len, trained.vocab_size, (4, 8), generator=gen(86))
        cases = [  # (model, tokens, head, witness, label)
            (first, tokens_full, 1, witnesses[0], "an untrained 3-head model, float64, training mode with attention "
                                                  "dropout, head 1, L = max_len = 9"),
            (first, tokens_short, 2, witnesses[0], "the same model, head 2, L = 6 < max_len = 9"),
            (second, torch.randint(7, (5, 7), generator=gen(85)), 0, witnesses[1],
             "an untrained 2-head model, float32, evaluation mode, a frozen embedding, head 0, L = 7"),
            (trained, batch.tokens, 1, witnesses[2], "the shipped trained model, training mode, head 1"),
        ]
        earlier: list[tuple[list[Tensor], str]] = []
        try:
            for number, (model, tokens, head, witness, label) in enumerate(cases):
                try:
                    out = call_leaving_model_alone(fn, model, tokens.clone(), head, what=f"your function ({label})",
                                                   witness=witness, forbidden=FORBIDDEN)
                except Verdict as verdict:
                    if number == 1 and verdict.status == "error":  # the first, L = max_len, passed
                        raise Verdict(verdict.status, verdict.message + " (the input before, of max_len tokens, "
                                      "passed)", "This input holds fewer tokens than max_len: does your code use every "
                                      "row of model.position_embedding? A sequence of L tokens reads its first L rows, "
                                      "model.position_embedding[:L].") from None
                    raise
                if witness.fired:
                    raise fail(f"your function ran the model in training mode ({label}): its attention dropout was on, "
                               "so the attention weights were random",
                               "Evaluate in evaluation mode: was_training = model.training; model.eval(); ... and, in "
                               "a `finally:` block, model.train(was_training).")
                _stale_parts(out, earlier, tokens, model.d_model, label)
                _compare(out, model, tokens, head, label)
                earlier.append(([x.detach().clone() for x in _unpack(out, label)], cases[number][4]))
                if number == 0:
                    before = earlier[0][0]
            # The weights change between two calls on the same model: nothing may be remembered from the first.
            with torch.no_grad():
                first.layers[0].W_v.weight.mul_(-0.7)
                first.layers[0].W_v.bias.add_(0.4)
                first.position_embedding.mul_(1.3)
            label = "the first model again, its W_v, b_v and positions changed, head 1"
            out = call_leaving_model_alone(fn, first, tokens_full.clone(), 1, what=f"your function ({label})",
                                           witness=witnesses[0], forbidden=FORBIDDEN)
            again = _unpack(out, label)
            if all(isinstance(x, Tensor) and x.shape == y.shape and torch.equal(x.detach(), y)
                   for x, y in zip(again, before)):
                raise fail(f"your function ({label}) returned the same parts as before the weights changed: it "
                           "remembers an earlier call", "Compute the parts from the model you are given, every call: no "
                           "cache, no global variable, nothing kept from an earlier call.")
            _compare(out, first, tokens_full, 1, label)
        finally:
            for witness in witnesses:
                witness.remove()
        meta = on_meta(evaluated(second, lambda: copy.deepcopy(second)))
        with torch.no_grad():
            check_device_care(fn, meta, on_meta(cases[2][1]), 1, what="your function", hint=DEVICE_HINT)
        return ("right on 3 models (2 untrained, float64 and float32, and the trained one), 3 heads, twice on a model "
                "whose weights changed between the calls, and on another device; the models are left as they were")

    def on_one_thread() -> str:  # models this small run many times faster on one thread of a busy CPU
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return body()
        finally:
            torch.set_num_threads(threads)

    return run_check("token, position and bias parts", on_one_thread)
