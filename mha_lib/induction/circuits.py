"""The mechanism, measured: what a layer-1 head's output is made of, what an induction head
copies, and how strongly heads compose by their weights alone.

Layer 1 reads the embeddings, ``x_j = E[t_j] + P_j`` (token plus learned position), so head
``h``'s output at query ``i`` splits into three terms that add up to it exactly:

    sum_j A_ij E[t_j] W_v^h W_o^h   (token)  +  sum_j A_ij P_j W_v^h W_o^h   (position)
    + b_v^h W_o^h   (bias; the rows of A sum to 1)

- :func:`head_parts`: the three terms, ``(B, H, L, D)`` each; their sum is
  ``model.head_outputs(tokens)[0]``. W_o's own bias belongs to no head and to no part.
- :func:`remove_parts`: logits with chosen parts of chosen layer-1 heads removed from the later
  layers' query, key or value input only (removing all three parts is ``remove_from``).
- :func:`mean_ablate`: the same for whole heads, replaced by their mean over the batch (at each
  position) instead of removed (zero).
- :func:`ov_circuit`, :func:`copying_score`, :func:`copying_eigenvalues`: what a head's OV
  circuit does to the logits of the token it attends to (Elhage et al. 2021).
- :func:`qk_matrix`, :func:`ov_matrix`, :func:`composition_scores`,
  :func:`random_composition_scores`: Elhage et al.'s weight-based Q-, K- and V-composition
  scores, and what random matrices of the same shapes score.

Conventions (Elhage et al.): a head's attention score is ``x_q^T W_QK x_k`` with
``W_QK = W_Q^T W_K`` ``(D, D)``, and it writes ``W_OV x`` with ``W_OV = W_O W_V`` ``(D, D)``,
for column vectors ``x``. With rotary positions ``W_QK`` is not the whole story (a rotation by
the distance sits between ``W_Q`` and ``W_K``), so :func:`composition_scores` refuses them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from ..masks import causal_mask
from ..multi_head import MultiHeadAttention
from ..validation import as_index
from .model import INPUTS, AttentionOnlyTransformer

__all__ = ["PARTS", "composition_scores", "copying_eigenvalues", "copying_score", "head_parts", "mean_ablate",
           "ov_circuit", "ov_matrix", "qk_matrix", "random_composition_scores", "remove_parts"]

PARTS = ("token", "position", "bias")  # what a layer-1 head's output is made of
PartRef = tuple[int, str]  # (layer-1 head, part)


def _check_model(model: object) -> AttentionOnlyTransformer:
    if not isinstance(model, AttentionOnlyTransformer):
        raise TypeError(f"model must be an AttentionOnlyTransformer, got {type(model).__name__}")
    return model


def _head_slice(layer: MultiHeadAttention, head: int) -> slice:
    index = as_index(head)  # an int, a NumPy int or a 0-d integer tensor
    if index is None or not 0 <= index < layer.num_heads:
        raise ValueError(f"head must be an int in [0, {layer.num_heads}), got {head!r}")
    return slice(index * layer.d_k, (index + 1) * layer.d_k)


def head_parts(model: AttentionOnlyTransformer, tokens: Tensor) -> dict[str, Tensor]:
    """Layer 1's head outputs split by what their values read: ``{"token", "position", "bias"}``.

    Args:
        model: the model; layer 1 (``model.layers[0]``) reads ``E[t] + P``.
        tokens: ``(B, L)`` token ids.

    Returns:
        three ``(B, H, L, D)`` tensors: head ``h``'s output at query ``i`` from the token
        embeddings ``sum_j A_ij E[t_j] W_v^h W_o^h``, from the positions (zeros without a
        position table, e.g. rotary) and from ``W_v``'s bias ``b_v^h W_o^h``. They add up to
        ``model.head_outputs(tokens)[0]``.
    """
    model = _check_model(model)
    layer = model.layers[0]
    x = model.embed(tokens)  # (B, L, D); checks the tokens
    B, L, D = x.shape
    _, weights = layer(x, x, x, causal_mask(L, device=tokens.device), return_weights=True)  # (B, H, L, L)
    H, d_k = layer.num_heads, layer.d_k
    W_v = layer.W_v.weight  # (H * d_k, D)
    W_o = layer.W_o.weight.reshape(D, H, d_k)  # (D, H, d_k): head h's slice of W_o

    def through_ov(source: Tensor) -> Tensor:  # (B, L, D) -> (B, H, L, D): sum_j A_ij source_j W_v^h W_o^h
        values = (source @ W_v.T).reshape(B, L, H, d_k).transpose(1, 2)  # (B, H, L, d_k)
        return torch.einsum("bhlk,dhk->bhld", weights @ values, W_o)

    token = through_ov(model.token_embedding(tokens))
    if model.position_embedding is not None:
        position = through_ov(model.position_embedding[:L].expand(B, L, D))
    else:
        position = torch.zeros_like(token)
    b_v = layer.W_v.bias if layer.W_v.bias is not None else torch.zeros_like(W_v[:, 0])
    bias_out = torch.einsum("hk,dhk->hd", b_v.reshape(H, d_k), W_o)  # (H, D): b_v^h W_o^h
    bias = weights.sum(-1)[..., None] * bias_out[None, :, None, :]  # (B, H, L, D); the rows sum to 1
    return {"token": token, "position": position, "bias": bias}


def _check_refs(remove: Mapping[str, Iterable[PartRef]], num_heads: int) -> dict[str, list[PartRef]]:
    checked: dict[str, list[PartRef]] = {}
    for name, refs in remove.items():
        if name not in INPUTS:
            raise ValueError(f"keys must be among {INPUTS} (the later layers' query, key, value input, the "
                             f"unembedding's input), got {name!r}")
        checked[name] = []
        for ref in refs:
            head = as_index(ref[0]) if isinstance(ref, tuple) and len(ref) == 2 else None
            ok = head is not None and 0 <= head < num_heads and isinstance(ref[1], str) and ref[1] in PARTS
            if not ok:
                raise ValueError(f"remove[{name!r}] must list (head, part) pairs with head in [0, {num_heads}) "
                                 f"and part in {PARTS}, got {ref!r}")
            checked[name].append((head, ref[1]))
    return checked


def remove_parts(model: AttentionOnlyTransformer, tokens: Tensor, remove: Mapping[str, Iterable[PartRef]],
                 return_weights: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
    """Logits ``(B, L, V)`` with parts of layer-1 heads removed from some inputs of the later layers only.

    Args:
        remove: e.g. ``{"q": [(1, "position")]}``: the position part of layer 1's head 1 is
            subtracted from the *query* input of every later layer, and nothing else changes.
            Keys ``"q"``, ``"k"``, ``"v"``, ``"out"`` as in ``remove_from``; removing a head's
            three parts equals ``model(tokens, remove_from={...: [(0, head)]})``.
        return_weights: also return each layer's attention weights, as ``model`` does.
    """
    model = _check_model(model)
    refs = _check_refs(remove, model.num_heads)
    parts = head_parts(model, tokens)
    subtract = {name: sum(parts[part][:, head] for head, part in chosen) for name, chosen in refs.items() if chosen}
    return model(tokens, return_weights, subtract=subtract)


def mean_ablate(model: AttentionOnlyTransformer, tokens: Tensor, remove: Mapping[str, Iterable[int]],
                return_weights: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
    """Logits ``(B, L, V)`` with layer-1 heads *mean-ablated* in some inputs of the later layers only.

    ``remove={"q": [1]}`` replaces layer 1's head 1 in the later layers' query input by its
    mean over the batch, position by position (``(L, D)``, what the head writes there on
    average), instead of removing it (``remove_from``, which replaces it by zero).
    """
    model = _check_model(model)
    refs = _check_refs({name: [(h, "token") for h in heads] for name, heads in remove.items()}, model.num_heads)
    outputs = model.head_outputs(tokens)[0]  # (B, H, L, D)
    centred = outputs - outputs.mean(0, keepdim=True)  # (B, H, L, D): output minus its mean over the batch
    subtract = {name: sum(centred[:, h] for h, _ in chosen) for name, chosen in refs.items() if chosen}
    return model(tokens, return_weights, subtract=subtract)


def ov_circuit(model: AttentionOnlyTransformer, layer: int, head: int) -> Tensor:
    """``(V, V)``: column ``b`` is what the head adds to every logit when it attends fully to token
    ``b``'s embedding: ``W_U W_o^h W_v^h E[b]`` (no biases; the token path of Elhage et al.'s OV circuit)."""
    model = _check_model(model)
    attention = model.layers[layer]
    rows = _head_slice(attention, head)
    W_v = attention.W_v.weight[rows]  # (d_k, D)
    W_o = attention.W_o.weight[:, rows]  # (D, d_k)
    E = model.token_embedding.weight  # (V, D)
    return model.unembed.weight @ W_o @ W_v @ E.T  # (V, V): [logit a, source token b]


def copying_score(model: AttentionOnlyTransformer, layer: int, head: int) -> float:
    """The share of tokens ``b`` whose own logit is the one the head raises most when it attends to ``b``:
    ``argmax_a ov_circuit[a, b] == b``. A head that copies scores 1; random weights ``1 / V``."""
    circuit = ov_circuit(model, layer, head)  # (V, V)
    own = torch.arange(circuit.size(0), device=circuit.device)
    return (circuit.argmax(0) == own).double().mean().item()


def copying_eigenvalues(model: AttentionOnlyTransformer, layer: int, head: int) -> float:
    """Elhage et al.'s positive-eigenvalue measure of copying: ``sum(λ) / sum(|λ|)`` over the eigenvalues
    of :func:`ov_circuit`, in ``[-1, 1]``; 1 when all are positive (the circuit copies), about 0 for random weights."""
    eigenvalues = torch.linalg.eigvals(ov_circuit(model, layer, head).double())  # (V,) complex
    return (eigenvalues.sum().real / eigenvalues.abs().sum()).item()


def qk_matrix(attention: MultiHeadAttention, head: int) -> Tensor:
    """``(D, D)`` ``W_QK = W_Q^h^T W_K^h``: head ``head``'s score is ``x_q^T W_QK x_k`` (times ``1/sqrt(d_k)``, no biases)."""
    rows = _head_slice(attention, head)
    return attention.W_q.weight[rows].T @ attention.W_k.weight[rows]


def ov_matrix(attention: MultiHeadAttention, head: int) -> Tensor:
    """``(D, D)`` ``W_OV = W_O^h W_V^h``: head ``head`` writes ``W_OV x`` for the value input ``x`` it attends to."""
    rows = _head_slice(attention, head)
    return attention.W_o.weight[:, rows] @ attention.W_v.weight[rows]


def _score(product: Tensor, a: Tensor, b: Tensor) -> Tensor:
    return torch.linalg.matrix_norm(product) / (torch.linalg.matrix_norm(a) * torch.linalg.matrix_norm(b))


def _scores(qk2: Tensor, ov2: Tensor, ov1: Tensor) -> dict[str, Tensor]:
    """Batched over leading axes: ``qk2``, ``ov2`` ``(..., D, D)`` of the later head, ``ov1`` of the earlier."""
    return {"q": _score(qk2.mT @ ov1, qk2, ov1), "k": _score(qk2 @ ov1, qk2, ov1), "v": _score(ov2 @ ov1, ov2, ov1)}


@torch.no_grad()
def composition_scores(model: AttentionOnlyTransformer, later: int = 1, earlier: int = 0) -> dict[str, Tensor]:
    """Elhage et al.'s weight-based composition scores of every (earlier head, later head) pair.

    Returns ``{"q", "k", "v"}``, each ``(H, H)`` indexed ``[earlier head, later head]``:

    - Q: ``||W_QK^{h2 T} W_OV^{h1}||_F / (||W_QK^{h2}||_F ||W_OV^{h1}||_F)``;
    - K: ``||W_QK^{h2} W_OV^{h1}||_F / (...)``, the same norms;
    - V: ``||W_OV^{h2} W_OV^{h1}||_F / (||W_OV^{h2}||_F ||W_OV^{h1}||_F)``.

    Each lies in ``[0, 1]``; what random matrices score is :func:`random_composition_scores`.
    """
    model = _check_model(model)
    if model.positions == "rotary":
        raise ValueError("composition scores read W_QK = W_Q^T W_K, which leaves out the rotation of rotary "
                         "positions; use a model with learned or sinusoidal positions")
    if not 0 <= earlier < later < model.num_layers:
        raise ValueError(f"need 0 <= earlier < later < {model.num_layers}, got earlier={earlier}, later={later}")
    one, two = model.layers[earlier], model.layers[later]
    H = model.num_heads
    ov1 = torch.stack([ov_matrix(one, h) for h in range(H)])[:, None]  # (H, 1, D, D): earlier head on axis 0
    qk2 = torch.stack([qk_matrix(two, h) for h in range(H)])[None]  # (1, H, D, D): later head on axis 1
    ov2 = torch.stack([ov_matrix(two, h) for h in range(H)])[None]
    return _scores(qk2, ov2, ov1)


def random_composition_scores(d_model: int, d_k: int, draws: int = 1000, seed: int = 0) -> dict[str, Tensor]:
    """The composition scores of random heads: every ``W_Q, W_K, W_V`` ``(d_k, D)`` and ``W_O`` ``(D, d_k)``
    drawn with independent N(0, 1) entries (the norms make the scale irrelevant), ``draws`` pairs.

    Returns ``{"q", "k", "v"}``, each ``(draws,)``: the baseline a trained score is read against.
    """
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape: int) -> Tensor:
        return torch.randn(draws, *shape, generator=generator, dtype=torch.float64)

    qk2 = draw(d_k, d_model).mT @ draw(d_k, d_model)  # (draws, D, D)
    ov2 = draw(d_model, d_k) @ draw(d_k, d_model)
    ov1 = draw(d_model, d_k) @ draw(d_k, d_model)
    return _scores(qk2, ov2, ov1)
