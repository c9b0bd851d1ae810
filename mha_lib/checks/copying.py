"""Check for exercise 8.5 (chapter 08): a head's OV circuit read through the unembedding, and its
copying score.

The references are :func:`mha_lib.induction.circuits.ov_circuit` and
:func:`~mha_lib.induction.circuits.copying_score`, computed on a float64 copy of the model. The
models (:mod:`._circuits`) are seeded untrained ones with biases everywhere (one with ``V = D``,
so that a transposed embedding or unembedding runs instead of failing), handed over in training
mode with gradients on and a hook of their own, and the shipped trained model; between two calls
the check rewrites one model's unembedding so that a head copies, and its score must follow.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..induction import circuits as _circuits
from ._circuits import CheckModel, Witness, call_leaving_model_alone, seeded_model, trained_model
from ._core import (CheckResult, Mistake, check_device_care, close, diagnose, expect_tensor, fail, on_meta,
                    run_check)

CIRCUIT_DEFINITION = ("ov_circuit(model, layer, head) = W_U @ W_o^h @ W_v^h @ E.T, (V, V), entry [a, b] = what the "
                      "head adds to logit a when it attends fully to token b: W_U = model.unembed.weight (V, D), "
                      "W_o^h = model.layers[layer].W_o.weight[:, rows] (D, d_k), W_v^h = model.layers[layer].W_v"
                      ".weight[rows] (d_k, D), E = model.token_embedding.weight (V, D), rows = head * d_k ... "
                      "(head + 1) * d_k - 1; no biases, no positions.")
SCORE_DEFINITION = ("copying_score(model, layer, head) is the share of tokens b whose own logit is the highest in "
                    "column b of the circuit: (circuit.argmax(dim=0) == torch.arange(V)).float().mean().item().")
DEVICE_HINT = ("Make every tensor you create on the weights' device, e.g. torch.arange(V, device=circuit.device): "
               "the notebook calls this on the model's device.")
FORBIDDEN = [_circuits.ov_circuit, _circuits.copying_score, _circuits.copying_eigenvalues]


class _Pieces:
    """The weights of one head, in float64, from a copy of the model."""

    def __init__(self, model: CheckModel, layer: int, head: int) -> None:
        m = copy.deepcopy(model).double().eval()
        self.model, self.layer, self.head = m, layer, head
        attention = m.layers[layer]
        self.H, self.d_k = attention.num_heads, attention.d_k
        with torch.no_grad():
            self.E = m.token_embedding.weight.detach()  # (V, D)
            self.W_U, self.b_U = m.unembed.weight.detach(), m.unembed.bias.detach()
            self.table = m.position_embedding.detach()
            self.attention = [(a.W_v.weight.detach(), a.W_v.bias.detach(), a.W_o.weight.detach(), a.W_o.bias.detach())
                              for a in m.layers]
            self.reference = _circuits.ov_circuit(m, layer, head)

    def rows(self, h: int, start: int | None = None) -> slice:
        s = h * self.d_k if start is None else start
        return slice(s, s + self.d_k)

    def circuit(self, *, layer: int | None = None, h_v: int | None = None, h_o: int | None = None,
                Wv: Tensor | None = None, Wo: Tensor | None = None, E: Tensor | None = None, b_v: bool = False,
                b_o: bool = False, b_U: bool = False) -> Tensor:
        W_v, bv, W_o, bo = self.attention[self.layer if layer is None else layer]
        h = self.head
        Wv = W_v[self.rows(h if h_v is None else h_v)] if Wv is None else Wv  # (d_k, D)
        Wo = W_o[:, self.rows(h if h_o is None else h_o)] if Wo is None else Wo  # (D, d_k)
        E = self.E if E is None else E
        values = Wv @ E.T  # (d_k, V)
        if b_v:
            values = values + bv[self.rows(h if h_v is None else h_v)][:, None]
        written = Wo @ values  # (D, V)
        if b_o:
            written = written + bo[:, None]
        logits = self.W_U @ written  # (V, V)
        return logits + self.b_U[:, None] if b_U else logits


def _circuit_mistakes(p: _Pieces) -> list[Mistake]:
    C, h, H = p.reference, p.head, p.H
    others = [g for g in range(H) if g != h]
    W_v, bv, W_o, bo = p.attention[p.layer]
    return [
        ("the circuit is transposed: entry [b, a] (source token, logit), not [a, b]", lambda: C.T,
         "Rows are logits, columns source tokens: W_U @ W_o^h @ W_v^h @ E.T, where column b is what attending to "
         "token b does to every logit."),
        ("the unembedding's bias was included", lambda: [p.circuit(b_U=True), p.reference + p.b_U[None, :]],
         "The circuit is what the head adds to the logits; the unembedding's bias is added whatever the head does: "
         "use model.unembed.weight alone."),
        ("W_v's bias was included", lambda: [p.circuit(b_v=True), p.circuit(b_v=True, b_o=True),
                                             p.circuit(b_v=True, b_U=True), p.circuit(b_v=True, b_o=True, b_U=True)],
         "The OV circuit maps the attended token's embedding to logits through the weights only: W_v's bias adds the "
         "same vector whatever the token, so it is left out."),
        ("W_o's bias was included", lambda: [p.circuit(b_o=True), p.circuit(b_o=True, b_U=True)],
         "W_o's bias belongs to no head (it is added once to the layer's output): leave it out."),
        ("the positional embeddings were added to E",
         lambda: [p.circuit(E=p.E + p.table[0]), p.circuit(E=p.E + p.table.mean(0))]
         + ([p.circuit(E=p.E + p.table[:p.E.size(0)])] if p.table.size(0) >= p.E.size(0) else []),
         "The circuit reads the token embeddings alone, E = model.token_embedding.weight: it asks what the head "
         "does with *which token* it attends to, wherever that token sits."),
        ("the slices of another head", lambda: [p.circuit(h_v=g, h_o=g) for g in others],
         "Head h's rows of W_v and columns of W_o are h * d_k ... (h + 1) * d_k - 1."),
        ("W_v's rows of one head and W_o's columns of another",
         lambda: [p.circuit(h_v=g) for g in others] + [p.circuit(h_o=g) for g in others],
         "Take the same slice, rows = slice(head * d_k, (head + 1) * d_k), for W_v's rows and W_o's columns."),
        ("the slice head : head + d_k instead of head * d_k : (head + 1) * d_k",
         lambda: p.circuit(Wv=W_v[p.rows(0, start=h)], Wo=W_o[:, p.rows(0, start=h)]),
         "Head h owns the d_k features h * d_k ... (h + 1) * d_k - 1: slice(head * d_k, (head + 1) * d_k)."),
        ("an empty slice (e.g. the rows of head + 1, past the last head): the circuit is all zeros",
         lambda: torch.zeros_like(C),
         "Head h's rows of W_v and columns of W_o are h * d_k ... (h + 1) * d_k - 1 (heads count from 0): "
         "slice(head * d_k, (head + 1) * d_k)."),
        ("the head of the other layer", lambda: [p.circuit(layer=l) for l in range(len(p.attention)) if l != p.layer],
         "Use model.layers[layer]: the layer you are given."),
        ("the whole layer's OV circuit (every head), not one head's", lambda: p.W_U @ W_o @ W_v @ p.E.T,
         "Slice one head: W_v.weight[rows] and W_o.weight[:, rows]."),
        ("W_o's rows of head h were used, not its columns", lambda: p.circuit(Wo=W_o[p.rows(h), :].T),
         "nn.Linear stores W_o.weight as (out, in) = (D, H * d_k): head h's slice is its columns, W_o.weight[:, rows]."),
        ("W_v's columns were sliced instead of its rows", lambda: p.circuit(Wv=W_v[:, p.rows(h)].T),
         "nn.Linear stores W_v.weight as (out, in) = (H * d_k, D): head h's slice is its rows, W_v.weight[rows]."),
        ("E or W_U was used untransposed (E where E.T belongs, or W_U.T)",
         lambda: [p.W_U @ W_o[:, p.rows(h)] @ W_v[p.rows(h)] @ p.E, p.W_U.T @ W_o[:, p.rows(h)] @ W_v[p.rows(h)] @ p.E.T,
                  p.W_U.T @ W_o[:, p.rows(h)] @ W_v[p.rows(h)] @ p.E],
         "Both are stored (V, D): W_U = model.unembed.weight maps D -> V as it is, and the embeddings enter as "
         "columns, E.T (D, V)."),
        ("a softmax was applied", lambda: [C.softmax(0), C.softmax(1)],
         "Return the raw circuit: what the head adds to each logit. A softmax belongs to the whole model's logits, "
         "not to one head's contribution."),
        ("the circuit was scaled by 1 / sqrt(d_k)", lambda: C / p.d_k ** 0.5,
         "1 / sqrt(d_k) scales the attention *scores* (the QK circuit); the OV circuit has no such scale."),
    ]


def _score_mistakes(p: _Pieces, model: CheckModel, layer: int, head: int) -> list[tuple[str, Callable[[], Any], str]]:
    C = p.reference
    V = C.size(0)
    own = torch.arange(V)
    share = lambda circuit: (circuit.argmax(0) == own).double().mean().item()  # noqa: E731
    from_circuits = [(name, (lambda compute=compute: [share(c) for c in _as_list(compute())]),
                      hint + " (in the circuit your copying_score builds)")
                     for name, compute, hint in _circuit_mistakes(p)
                     if name not in ("a softmax was applied", "the circuit was scaled by 1 / sqrt(d_k)")]
    return [
        ("the diagonal was compared with its row, not its column", lambda: [share(C.T)],
         "Column b holds what attending to token b does to every logit: compare circuit[b, b] with the rest of column "
         "b, circuit.argmax(dim=0) == b."),
        ("a percentage (100 times the share)", lambda: [100 * share(C)],
         "Return the share itself, a number between 0 and 1 (baseline 1 / V), not a percentage."),
        ("the number of tokens, not their share", lambda: [float((C.argmax(0) == own).sum())],
         "Divide by V: the share is a number between 0 and 1, comparable across vocabularies (baseline 1 / V)."),
        ("the share of positive diagonal entries, not of tokens whose own logit is the highest",
         lambda: [(C.diagonal() > 0).double().mean().item()],
         "A positive entry raises a logit, but the head copies only if it raises token b's own logit *more than any "
         "other*: circuit.argmax(dim=0) == b."),
        ("the diagonal compared with its column's mean, not its maximum",
         lambda: [(C.diagonal() > C.mean(0)).double().mean().item(), (C.diagonal() > C.mean(1)).double().mean().item()],
         "Compare with the largest entry of the column: circuit.argmax(dim=0) == b."),
        ("the mean of the diagonal, not a share of tokens", lambda: [C.diagonal().mean().item()],
         "Count the tokens b for which circuit[b, b] is the highest of column b, and divide by V."),
        ("a softmax over each row before the column's maximum", lambda: [share(C.softmax(1))],
         "Leave the circuit as it is: a softmax over a row rescales each logit differently and moves the columns' "
         "maxima. (A softmax over a column changes nothing, but isn't needed.)"),
        ("the score of the other layer's head",
         lambda: [_circuits.copying_score(p.model, l, head) for l in range(model.num_layers) if l != layer],
         "Use the layer you are given: model.layers[layer]."),
        ("the score of another head",
         lambda: [_circuits.copying_score(p.model, layer, g) for g in range(model.num_heads) if g != head],
         "Use the head you are given: rows = slice(head * d_k, (head + 1) * d_k)."),
    ] + from_circuits


def _as_list(value: Any) -> list[Tensor]:
    return [value] if isinstance(value, Tensor) else list(value)


def _number(out: Any, what: str) -> float:
    """A Python number or a one-element tensor, as a float; anything else fails."""
    if out is None:
        raise fail(f"{what} is None", "Does your function end with a return statement?")
    if isinstance(out, bool):
        raise fail(f"{what} is a bool, expected a share (a float between 0 and 1)")
    if isinstance(out, Tensor):
        if out.numel() != 1:
            raise fail(f"{what} is a tensor of shape {tuple(out.shape)}, expected one number",
                       "Average over the V tokens and return the share as a Python float: .item().")
        return float(out.detach().double().cpu())
    if isinstance(out, (int, float)):
        return float(out)
    raise fail(f"{what} is {type(out).__name__}, expected a Python float")


def _check_circuit(fn: Callable[..., Any], model: CheckModel, layer: int, head: int, witness: Witness,
                   label: str, previous: Tensor | None = None) -> Tensor:
    V = model.vocab_size
    dtype = next(model.parameters()).dtype
    out = call_leaving_model_alone(fn, model, layer, head, what=f"your function ({label})", witness=witness,
                                   forbidden=FORBIDDEN)
    what = f"the circuit ({label})"
    if isinstance(out, Tensor) and out.dim() == 3 and tuple(out.shape[1:]) == (V, V):
        raise fail(f"{what} has shape {tuple(out.shape)}: one circuit per head, expected head `head`'s only (V, V)",
                   "Slice one head: W_v.weight[rows] and W_o.weight[:, rows].")
    out = expect_tensor(out, what, (V, V), dtype=dtype, explain=" (V, V): [logit, source token]")
    p = _Pieces(model, layer, head)
    if previous is not None and torch.equal(out, previous) and not close(previous, p.reference):
        raise fail(f"your function ({label}) returned the same circuit as before the weights changed: it remembers an "
                   "earlier call", "Compute it from the model you are given, every call: no cache, nothing kept from an "
                   "earlier call.")
    if not close(out, p.reference):
        raise diagnose(out, _circuit_mistakes(p), f"wrong circuit ({label})", CIRCUIT_DEFINITION,
                       expected=p.reference, dim=-1, axis="column (source token)")
    return out


def _score_call(fn: Callable[..., Any], model: CheckModel, layer: int, head: int, witness: Witness,
                label: str) -> tuple[float, tuple[float, float], Callable[[], list[tuple[str, Any, str]]]]:
    """The learner's score, the right one (float64, and in the model's dtype: a near-tie may fall either way in
    float32), and each mistake's scores on this model (None where the mistake can't happen)."""
    out = call_leaving_model_alone(fn, model, layer, head, what=f"your function ({label})", witness=witness,
                                   forbidden=FORBIDDEN)
    value = _number(out, f"the copying score ({label})")
    p = _Pieces(model, layer, head)
    expected = (_circuits.copying_score(p.model, layer, head), _circuits.copying_score(model, layer, head))

    def mistakes() -> list[tuple[str, list[float] | None, str]]:  # computed only for a wrong answer
        found = []
        for name, compute, hint in _score_mistakes(p, model, layer, head):
            try:
                found.append((name, [float(c) for c in compute()], hint))
            except Exception:  # a mistake that can't happen with these shapes
                found.append((name, None, hint))
        return found

    return value, expected, mistakes


def _judge_scores(results: list[tuple[str, float, tuple[float, float], list[Any]]]) -> None:
    """Fail unless every score is right; a mistake is named when it gives every score the learner gave."""
    near = lambda a, b: abs(a - b) <= 1e-6  # noqa: E731
    wrong = [(label, value, expected) for label, value, expected, _ in results
             if not any(near(value, e) for e in expected)]
    if not wrong:
        return
    tables = [mistakes() for _, _, _, mistakes in results]  # the model changed between calls: its pieces didn't
    for i, (name, _, hint) in enumerate(tables[0]):
        seen = [(value, table[i][1]) for (_, value, _, _), table in zip(results, tables) if table[i][1] is not None]
        if seen and all(any(near(value, c) for c in found) for value, found in seen):
            label, value, _ = wrong[0]
            raise fail(f"wrong copying score ({label}): yours is {value:.4f}, it looks like {name}", hint)
    label, value, expected = wrong[0]
    raise fail(f"wrong copying score ({label}): yours is {value:.4f}, expected {expected[0]:.4f}", SCORE_DEFINITION)


def _cases() -> tuple[list[tuple[CheckModel, int, int, Witness, str]], list[Witness]]:
    """The models and heads both checks run: (model, layer, head, witness, label)."""
    first = seeded_model(87, V=12, D=12, H=3, max_len=8, dtype=torch.float64, dropout=0.3)
    second = seeded_model(88, V=10, D=8, H=2, max_len=6, dtype=torch.float32).eval()
    second.unembed.weight.requires_grad_(False)  # requires_grad must come back as it was, not all True
    trained = trained_model()
    witnesses = [Witness(m) for m in (first, second, trained)]
    cases = [
        (first, 1, 2, witnesses[0], "an untrained 3-head model with V = D = 12, float64, training mode, layer 1 "
                                    "(the second), head 2"),
        (first, 0, 0, witnesses[0], "the same model, layer 0, head 0"),
        (second, 1, 1, witnesses[1], "an untrained 2-head model, float32, evaluation mode, a frozen unembedding, "
                                     "layer 1, head 1"),
        (trained, 1, 3, witnesses[2], "the shipped trained model, layer 1, head 3"),
        (trained, 0, 2, witnesses[2], "the shipped trained model, layer 0, head 2"),
    ]
    return cases, witnesses


def _make_copy(model: CheckModel) -> str:
    """Rewrite the unembedding so that head 0 of layer 0 copies: W_U = E (W_OV)^T, so the circuit
    E W_OV^T W_OV E^T is a Gram matrix, its diagonal large. Returns the case's label."""
    with torch.no_grad():
        attention = model.layers[0]
        W_ov = attention.W_o.weight[:, :attention.d_k] @ attention.W_v.weight[:attention.d_k]  # (D, D)
        model.unembed.weight.copy_(model.token_embedding.weight @ W_ov.T)
    return "the first model again, its unembedding rewritten so that layer 0's head 0 copies"


def _one_thread(body: Callable[[], str]) -> Callable[[], str]:
    def run() -> str:  # matrices this small are many times faster on one thread of a busy CPU
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return body()
        finally:
            torch.set_num_threads(threads)

    return run


def check_ov_circuit(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(model, layer, head) -> (V, V)``: ``W_U W_o^h W_v^h E^T`` (entry ``[a, b]``: logit ``a``,
    source token ``b``; no biases, no positions; the model's dtype and device), as
    :func:`mha_lib.induction.circuits.ov_circuit`; the model left as it was found."""

    def body() -> str:
        cases, witnesses = _cases()
        first = cases[0][0]
        try:
            before = [_check_circuit(fn, model, layer, head, witness, label)
                      for model, layer, head, witness, label in cases][1]  # the first model, layer 0, head 0
            label = _make_copy(first)
            _check_circuit(fn, first, 0, 0, witnesses[0], label, previous=before)
        finally:
            for witness in witnesses:
                witness.remove()
        meta = on_meta(copy.deepcopy(cases[2][0]).eval())
        check_device_care(fn, meta, 1, 0, what="your function", hint=DEVICE_HINT)
        return ("right on 3 models (2 untrained, float64 and float32, and the trained one), 2 layers, several heads, "
                "once more after the check changed the weights, and on another device; the models are left as they were")

    return run_check("OV circuit", _one_thread(body))


def check_copying_score(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(model, layer, head) -> float``: the share of tokens ``b`` whose own logit is the highest in
    column ``b`` of the head's OV circuit (:func:`mha_lib.induction.circuits.copying_score`), also after the
    check made a head copy; the model left as it was found."""

    def body() -> str:
        cases, witnesses = _cases()
        first = cases[0][0]
        try:
            results = []
            for model, layer, head, witness, label in cases:
                results.append((label, *_score_call(fn, model, layer, head, witness, label)))
            before = results[1][1]
            label = _make_copy(first)
            results.append((label, *_score_call(fn, first, 0, 0, witnesses[0], label)))
            after, expected_after = results[-1][1], results[-1][2][0]
            right_before = any(abs(before - e) <= 1e-6 for e in results[1][2])
            if right_before and after == before and abs(expected_after - results[1][2][0]) > 1e-6:
                raise fail(f"your function ({label}) returned the same score as before the weights changed: it "
                           "remembers an earlier call", "Compute it from the model you are given, every call: no "
                           "cache, nothing kept from an earlier call.")
            _judge_scores(results)
        finally:
            for witness in witnesses:
                witness.remove()
        meta = on_meta(copy.deepcopy(cases[2][0]).eval())
        check_device_care(fn, meta, 1, 0, what="your function", hint=DEVICE_HINT)
        return ("right on 3 models (2 untrained, float64 and float32, and the trained one), 2 layers, several heads "
                "(a copying head among them), once more after the check made a head copy, and on another device; the "
                "models are left as they were")

    return run_check("copying score", _one_thread(body))
