"""The model: a one-layer transformer classifier that reads the ``<cls>`` token, and its training.

:class:`SentimentClassifier`: token embeddings + learned positions, pre-norm
:class:`~mha_lib.EncoderLayer` s, and a linear classifier on the ``<cls>`` vector.
:func:`train_model` trains it in seconds on a CPU; :func:`evaluate` reports the accuracy
on negated and on plain sentences separately; :func:`predict` gives the labels.

None of these functions changes PyTorch's global state (threads, seeds, grad mode) as
the caller sees it afterwards. A model this small trains fastest on one CPU thread
(its operations are too small to share out): a caller that wants that says so itself,
with ``torch.set_num_threads(1)``, as chapter 07 and the seed study do.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..encoder import EncoderLayer
from ..validation import check_flag, check_heads, check_mask, check_positive_int, check_positive_number, check_whole
from .data import Example, Sentence, Vocab, batch_examples, check_examples

__all__ = ["MaskLike", "SentimentClassifier", "evaluate", "predict", "train_model"]

# An extra attention mask (True = may attend), or a function that makes one from a batch of ids.
MaskLike = Tensor | Callable[[Tensor], Tensor] | None

_ID_DTYPES = (torch.int64, torch.int32)  # what nn.Embedding accepts


def _token_id(value: object, name: str, vocab_size: int) -> int:
    """A token id of the vocabulary, ``0 <= id < vocab_size``."""
    token = check_whole(value, name)
    if not 0 <= token < vocab_size:
        raise ValueError(f"{name} must be a token id in [0, vocab_size={vocab_size}), got {token}")
    return token


def _check_model(model: object) -> None:
    if not isinstance(model, SentimentClassifier):
        raise TypeError(f"model must be a SentimentClassifier, got {type(model).__name__}")


class SentimentClassifier(nn.Module):
    """Token embeddings + learned positions -> encoder layers -> the ``<cls>`` vector -> two logits.

    Every sentence starts with ``<cls>`` (see :func:`batch_examples`), a token without a
    meaning of its own: through attention it gathers what the classifier needs from the
    words, as in BERT (Devlin et al., 2019).

    Args:
        vocab_size: number of token ids.
        d_model: width of the token vectors.
        num_heads: attention heads per layer.
        num_layers: number of :class:`~mha_lib.EncoderLayer` s.
        d_ff: hidden width of each feed-forward network.
        max_len: longest input (``<cls>`` included) the position table covers.
        dropout: dropout inside the encoder layers.
        pad_id, cls_id: ids of ``<pad>`` (masked: nobody attends to it) and ``<cls>``.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 48,
        num_heads: int = 2,
        num_layers: int = 1,
        d_ff: int = 96,
        max_len: int = 16,
        dropout: float = 0.0,
        pad_id: int = Vocab.pad_id,
        cls_id: int = Vocab.cls_id,
    ) -> None:
        super().__init__()
        vocab_size, max_len = check_positive_int(vocab_size, "vocab_size"), check_positive_int(max_len, "max_len")
        num_layers = check_positive_int(num_layers, "num_layers")  # with none, <cls> never sees the words
        d_model, num_heads, _ = check_heads(d_model, num_heads, dropout)  # before the embeddings are made
        check_positive_int(d_ff, "d_ff")
        self.pad_id, self.cls_id = _token_id(pad_id, "pad_id", vocab_size), _token_id(cls_id, "cls_id", vocab_size)
        if self.pad_id == self.cls_id:
            raise ValueError(f"pad_id and cls_id must differ, both are {pad_id}: nobody may attend to <pad>, "
                             "but every query may attend to <cls>")
        self.vocab_size = vocab_size
        self.max_len = max_len
        self.num_heads = num_heads
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_len, d_model)
        self.layers = nn.ModuleList(EncoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)  # pre-norm layers leave their output unnormalized
        self.classifier = nn.Linear(d_model, 2)

    def _check_tokens(self, tokens: Tensor) -> None:
        if not isinstance(tokens, Tensor):
            raise ValueError(f"tokens must be a (B, L) tensor of token ids, got {type(tokens).__name__}")
        if tokens.dtype not in _ID_DTYPES:
            raise ValueError(f"tokens must be integer token ids (torch.long), got dtype {tokens.dtype} "
                             f"(shape {tuple(tokens.shape)}); batch_examples makes them, or use tokens.long()")
        if tokens.device != self.token_embedding.weight.device:
            raise ValueError(f"tokens are on {tokens.device} but the model is on {self.token_embedding.weight.device}; "
                             "move them with tokens.to(next(model.parameters()).device)")
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be a (B, L) tensor of token ids, got shape {tuple(tokens.shape)}")
        B, L = tokens.shape
        if L == 0:
            raise ValueError(f"tokens of shape {(B, L)} hold no token: every row needs at least <cls> "
                             f"(id {self.cls_id}); use batch_examples")
        if L > self.max_len:
            raise ValueError(f"inputs of {L} tokens are longer than max_len={self.max_len}")
        if B and not (tokens[:, 0] == self.cls_id).all():
            raise ValueError(f"every row of tokens must start with <cls> (id {self.cls_id}); use batch_examples")
        if B and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), the model's vocabulary; "
                             f"got ids from {tokens.min().item()} to {tokens.max().item()}")

    def forward(
        self, tokens: Tensor, mask: Tensor | None = None, return_weights: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Classify a batch of sentences.

        Args:
            tokens: ``(B, L)`` ids (``torch.long``) from :func:`batch_examples`: ``<cls>``
                first, padding last.
            mask: optional extra bool mask, True = may attend, broadcastable to
                ``(B, H, L, L)``: ``(L, L)`` for every head, ``(H, L, L)`` per head.
                It is combined (logical and) with the padding mask.
            return_weights: also return each layer's attention weights.

        Returns:
            logits ``(B, 2)`` (index 1 = positive), or ``(logits, weights)`` with
            ``weights`` a list of ``(B, H, L, L)``, one per layer.
        """
        self._check_tokens(tokens)
        return_weights = check_flag(return_weights, "return_weights")
        B, L = tokens.shape
        attn_mask = (tokens != self.pad_id)[:, None, None, :]  # (B, 1, 1, L): nobody attends to padding
        if mask is not None:
            if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
                raise TypeError("mask must be a bool tensor (True = may attend), broadcastable to (B, H, L, L)")
            check_mask(mask, torch.Size((B, self.num_heads, L, L)), tokens.device)
            attn_mask = attn_mask & mask  # (B, H, L, L) or narrower

        positions = torch.arange(L, device=tokens.device)  # (L,)
        x = self.token_embedding(tokens) + self.position_embedding(positions)  # (B, L, D)
        weights = []
        for layer in self.layers:  # each layer's door sees a checked x and mask: a few comparisons, no data read
            x, w = layer(x, attn_mask, return_weights=True)  # (B, L, D), (B, H, L, L)
            weights.append(w)
        logits = self.classifier(self.norm(x[:, 0]))  # the <cls> vector (B, D) -> (B, 2)
        return (logits, weights) if return_weights else logits


def device_of(model: nn.Module) -> torch.device:
    """The device of the model's parameters."""
    return next(model.parameters()).device


def mask_for(mask: MaskLike, tokens: Tensor) -> Tensor | None:
    """The extra mask for a batch: ``mask`` itself, or ``mask(tokens)`` when it is a function."""
    return mask(tokens) if callable(mask) else mask


@torch.no_grad()
def predict(model: SentimentClassifier, sentences: Sequence[Sentence], vocab: Vocab, mask: MaskLike = None) -> Tensor:
    """Predicted labels ``(N,)`` on the CPU (1 = positive), in evaluation mode.

    ``mask``: an extra attention mask for the model, or a function ``tokens (N, L) -> mask``.
    The model's training/evaluation mode is restored afterwards.
    """
    _check_model(model)
    was_training = model.training
    model.eval()
    try:
        tokens = batch_examples(sentences, vocab).to(device_of(model))  # (N, L)
        logits = model(tokens, mask=mask_for(mask, tokens))  # (N, 2)
    finally:
        model.train(was_training)
    return logits.argmax(dim=-1).cpu()


def evaluate(
    model: SentimentClassifier, examples: Sequence[Example], vocab: Vocab, mask: MaskLike = None
) -> dict[str, float]:
    """Accuracy on all, on the negated and on the plain examples: ``{"all", "negated", "plain"}``.

    A group that ``examples`` doesn't contain gets NaN.
    """
    _check_model(model)
    check_examples(examples, "examples")
    correct = predict(model, examples, vocab, mask) == torch.tensor([e.label for e in examples])
    negated = torch.tensor([e.negated for e in examples])
    return {
        "all": correct.float().mean().item(),
        "negated": correct[negated].float().mean().item() if negated.any() else math.nan,
        "plain": correct[~negated].float().mean().item() if (~negated).any() else math.nan,
    }


def train_model(
    model: SentimentClassifier,
    train: Sequence[Example],
    vocab: Vocab,
    *,
    test: Sequence[Example] | None = None,
    epochs: int = 12,
    batch_size: int = 32,
    lr: float = 5e-3,
    weight_decay: float = 0.01,
    seed: int = 0,
    mask: MaskLike = None,
    reports: int = 4,
    on_epoch: Callable[[int, SentimentClassifier], None] | None = None,
) -> dict[str, list[float]]:
    """Train with AdamW and cross-entropy, printing a progress line ``reports`` times.

    Batches are shuffled by a CPU generator seeded with ``seed``, so the order is the
    same on every device. ``mask`` goes to every forward call, training and held-out: a
    tensor, or a function ``tokens (b, L) -> mask`` called on each batch (chapter 12
    trains with restricted heads). The weights' starting values are the caller's: seed
    before building the model (``seed_everything``). ``on_epoch(epoch, model)``, if given, is
    called after each epoch (the seed study records the heads' attention there). Leaves the
    model in eval mode.

    Returns:
        history: per epoch, ``"loss"`` (mean training loss) and ``"train_acc"``
        (accuracy on the training batches while training); when ``test`` is given also
        ``"test_negated"`` and ``"test_plain"`` (held-out accuracy after the epoch).
    """
    _check_model(model)
    check_examples(train, "train")
    if test is not None:
        check_examples(test, "test")
    epochs, batch_size = check_positive_int(epochs, "epochs"), check_positive_int(batch_size, "batch_size")
    seed, reports = check_whole(seed, "seed"), check_whole(reports, "reports")
    if reports < 0:
        raise ValueError(f"reports must be >= 0 (0 prints nothing), got {reports}")
    lr, weight_decay = check_positive_number(lr, "lr"), check_positive_number(weight_decay, "weight_decay", zero=True)
    device = device_of(model)
    tokens = batch_examples(train, vocab).to(device)  # (N, L)
    labels = torch.tensor([e.label for e in train], device=device)  # (N,)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    history: dict[str, list[float]] = {"loss": [], "train_acc": []}
    if test is not None:
        history.update(test_negated=[], test_plain=[])
    report_every = max(1, math.ceil(epochs / max(reports, 1)))
    start = time.perf_counter()

    for epoch in range(1, epochs + 1):
        model.train()
        order = torch.randperm(len(train), generator=generator).to(device)
        total_loss, total_correct = 0.0, 0
        for i in range(0, len(train), batch_size):
            idx = order[i : i + batch_size]
            batch = tokens[idx]  # (b, L)
            logits = model(batch, mask=mask_for(mask, batch))  # (b, 2)
            loss = F.cross_entropy(logits, labels[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * len(idx)
            total_correct += (logits.argmax(-1) == labels[idx]).sum().item()
        history["loss"].append(total_loss / len(train))
        history["train_acc"].append(total_correct / len(train))
        line = (f"epoch {epoch:2d}/{epochs}  loss {history['loss'][-1]:.2f}  "
                f"train acc {history['train_acc'][-1]:4.0%}")
        if test is not None:
            accuracy = evaluate(model, test, vocab, mask)
            history["test_negated"].append(accuracy["negated"])
            history["test_plain"].append(accuracy["plain"])
            line += f"  held-out: negated {accuracy['negated']:4.0%}, plain {accuracy['plain']:4.0%}"
        if reports and (epoch % report_every == 0 or epoch == epochs):
            print(f"{line}  ({time.perf_counter() - start:.1f} s)", flush=True)
        if on_epoch is not None:
            on_epoch(epoch, model)
    model.eval()
    return history
