"""A tiny sentiment task with negations, generated in code, and a small model that learns it.

Chapter 06 trains the model and looks at what its heads do; chapter 08 restricts them.

- :func:`make_datasets` draws sentences such as "the movie was not bad" (positive) or
  "i did not find the plot very clever" (negative) from a few templates, with a seed.
  The label is the sentiment *after* negation: "not" flips it. Train and held-out
  sentences never overlap.
- :class:`Vocab` turns tokens into ids and back; :func:`tokenize` splits a sentence.
- :func:`batch_examples` makes a padded batch of ids, each row starting with ``<cls>``.
- :class:`SentimentClassifier`: token embeddings + learned positions, pre-norm
  :class:`~mha_lib.EncoderLayer` s, and a linear classifier on the ``<cls>`` vector.
- :func:`train_model` trains it in seconds on a CPU; :func:`evaluate` reports the
  accuracy on negated and on plain sentences separately.
- :func:`silence_heads` switches heads off; :func:`attention_shares` measures where a
  token's attention goes (to "not", to the sentiment word, ...), head by head.

The negation example comes from *Transformers in Action* (Manning), section 1.1.4.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import check_mask
from .encoder import EncoderLayer
from .multi_head import MultiHeadAttention

__all__ = [
    "Example",
    "SentimentClassifier",
    "Vocab",
    "attention_shares",
    "batch_examples",
    "evaluate",
    "make_datasets",
    "predict",
    "silence_heads",
    "tokenize",
    "train_model",
]

# The words of the task. Only the sentiment words and "not" decide the label; everything
# else is a distractor the model must learn to ignore.
POSITIVE = ("good", "great", "fun", "brilliant", "enjoyable", "wonderful", "clever")
NEGATIVE = ("bad", "boring", "awful", "dull", "terrible", "weak", "silly")
DETERMINERS = ("the", "this", "that")
DESCRIPTIONS = ("long", "new", "old", "short", "french")  # neutral adjectives
SUBJECTS = ("movie", "film", "plot", "story", "acting", "cast", "script", "ending", "soundtrack", "dialogue")
VERBS = ("was", "is", "seemed", "felt")
INTENSIFIERS = ("really", "very", "quite", "truly")
ENDINGS = ("overall", "to me", "in the end", "honestly")
NEGATION = "not"
MAX_SENTENCES = 100_000


def tokenize(text: str) -> list[str]:
    """Lower-case and split on white space: ``"The movie was not bad" -> ["the", ..., "bad"]``."""
    if not isinstance(text, str):
        raise TypeError(f"tokenize expects a string, got {type(text).__name__}")
    return text.lower().split()


@dataclass(frozen=True)
class Example:
    """One sentence of the task.

    Attributes:
        tokens: the words.
        label: 1 = positive, 0 = negative (after negation).
        negated: whether "not" negates the sentiment word.
        sentiment_pos: index of the sentiment word in ``tokens``.
        negation_pos: index of "not", or None.

    In a batch from :func:`batch_examples`, word ``i`` sits at position ``i + 1``, after ``<cls>``.
    """

    tokens: tuple[str, ...]
    label: int
    negated: bool
    sentiment_pos: int
    negation_pos: int | None

    @property
    def text(self) -> str:
        return " ".join(self.tokens)

    @property
    def word_is_positive(self) -> bool:
        """The sentiment word's own polarity, before negation."""
        return self.tokens[self.sentiment_pos] in POSITIVE


def _draw_example(rng: random.Random) -> Example:
    """Draw one sentence from one of three templates (optional parts in brackets).

    - "the [long] movie was [not] [really] good [overall]"
    - "i [did not find | found] the [long] plot [really] boring [overall]"
    - "[not] a [really] good film [overall]" ("an" before a vowel)
    """
    negated = rng.random() < 0.5
    positive = rng.random() < 0.5
    word = rng.choice(POSITIVE if positive else NEGATIVE)

    def maybe(options: Sequence[str], p: float = 0.5) -> list[str]:
        return rng.choice(options).split() if rng.random() < p else []

    subject = maybe(DESCRIPTIONS, 0.3) + [rng.choice(SUBJECTS)]
    template = rng.choice("abc")
    if template == "a":
        before = [rng.choice(DETERMINERS), *subject, rng.choice(VERBS)] + ([NEGATION] if negated else [])
        before += maybe(INTENSIFIERS, 0.3)
        after = maybe(ENDINGS + (("at all",) if negated else ()), 0.4)
    elif template == "b":
        before = ["i", "did", NEGATION, "find"] if negated else ["i", "found"]
        before += [rng.choice(DETERMINERS), *subject] + maybe(INTENSIFIERS, 0.3)
        after = maybe(ENDINGS, 0.4)
    else:
        before = ([NEGATION] if negated else []) + ["a"] + maybe(INTENSIFIERS, 0.3)
        after = subject[-1:] + maybe(ENDINGS, 0.4)
    tokens = [*before, word, *after]
    for i, token in enumerate(tokens[:-1]):
        if token == "a" and tokens[i + 1][0] in "aeiou":
            tokens[i] = "an"  # "an awful film"
    tokens = tuple(tokens)
    return Example(
        tokens=tokens,
        label=int(positive != negated),
        negated=negated,
        sentiment_pos=len(before),
        negation_pos=tokens.index(NEGATION) if negated else None,
    )


def make_datasets(n_train: int = 2000, n_test: int = 500, seed: int = 0) -> tuple[list[Example], list[Example]]:
    """Draw ``n_train + n_test`` *different* sentences; the first ``n_train`` are for training.

    Deterministic: the same arguments give the same sentences on every machine
    (Python's ``random.Random(seed)``). No held-out sentence occurs in training.
    The templates allow far more than ``MAX_SENTENCES = 100_000`` sentences, the most
    one call may ask for.
    """
    for name, n in (("n_train", n_train), ("n_test", n_test)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{name} must be a non-negative int, got {n!r}")
    if n_train + n_test > MAX_SENTENCES:
        raise ValueError(f"n_train + n_test = {n_train + n_test} is more than MAX_SENTENCES = {MAX_SENTENCES}")
    rng = random.Random(seed)
    seen: dict[tuple[str, ...], Example] = {}
    while len(seen) < n_train + n_test:
        example = _draw_example(rng)
        seen.setdefault(example.tokens, example)  # a repeated sentence is skipped
    examples = list(seen.values())
    return examples[:n_train], examples[n_train:]


class Vocab:
    """Token <-> id. Three special tokens come first: ``<pad>`` = 0 (filler after a
    sentence), ``<unk>`` = 1 (any word the task doesn't use) and ``<cls>`` = 2 (put in
    front of every sentence; the classifier reads its vector)."""

    pad, unk, cls = "<pad>", "<unk>", "<cls>"
    pad_id, unk_id, cls_id = 0, 1, 2

    def __init__(self, words: Iterable[str]) -> None:
        specials = [self.pad, self.unk, self.cls]
        self.itos = specials + sorted(set(words) - set(specials))
        self.stoi = {word: i for i, word in enumerate(self.itos)}

    @classmethod
    def for_task(cls) -> Vocab:
        """Every word the generator can produce, whether or not it was drawn."""
        words = [*POSITIVE, *NEGATIVE, *DETERMINERS, *DESCRIPTIONS, *SUBJECTS, *VERBS, *INTENSIFIERS,
                 NEGATION, "i", "did", "find", "found", "a", "an", "at", "all"]
        words += [w for ending in ENDINGS for w in ending.split()]
        return cls(words)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Sequence[str] | str) -> list[int]:
        """Tokens (or a sentence, which is tokenized first) to ids; unknown words -> ``<unk>``."""
        if isinstance(tokens, str):
            tokens = tokenize(tokens)
        return [self.stoi.get(token, self.unk_id) for token in tokens]

    def decode(self, ids: Iterable[int] | Tensor) -> list[str]:
        """Ids to tokens, dropping the padding."""
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        return [self.itos[i] for i in ids if i != self.pad_id]


Sentence = Example | Sequence[str] | str
# An extra attention mask (True = may attend), or a function that makes one from a batch of ids.
MaskLike = Tensor | Callable[[Tensor], Tensor] | None


def batch_examples(sentences: Sequence[Sentence], vocab: Vocab, max_len: int | None = None) -> Tensor:
    """Encode sentences into one padded batch ``(B, L)`` of ids: ``<cls>``, the words, ``<pad>`` s.

    Accepts :class:`Example` s, token lists or plain strings. ``L`` is one more than the
    longest sentence (or ``max_len``). Word ``i`` of a sentence sits at position ``i + 1``.
    """
    ids = []
    for item in sentences:
        tokens = item.tokens if isinstance(item, Example) else item
        ids.append([vocab.cls_id, *vocab.encode(tokens)])
    if not ids:
        raise ValueError("batch_examples needs at least one sentence")
    longest = max(len(seq) for seq in ids)
    max_len = longest if max_len is None else max_len
    if max_len < longest:
        raise ValueError(f"max_len={max_len} is too short for the longest sentence (<cls> + {longest - 1} words)")
    batch = torch.full((len(ids), max_len), vocab.pad_id, dtype=torch.long)
    for row, seq in enumerate(ids):
        batch[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return batch  # (B, L)


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
        self.pad_id, self.cls_id = pad_id, cls_id
        self.max_len = max_len
        self.num_heads = num_heads
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_len, d_model)
        self.layers = nn.ModuleList(EncoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)  # pre-norm layers leave their output unnormalized
        self.classifier = nn.Linear(d_model, 2)

    def forward(
        self, tokens: Tensor, mask: Tensor | None = None, return_weights: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Classify a batch of sentences.

        Args:
            tokens: ``(B, L)`` ids from :func:`batch_examples`: ``<cls>`` first, padding last.
            mask: optional extra bool mask, True = may attend, broadcastable to
                ``(B, H, L, L)``: ``(L, L)`` for every head, ``(H, L, L)`` per head.
                It is combined (logical and) with the padding mask.
            return_weights: also return each layer's attention weights.

        Returns:
            logits ``(B, 2)`` (index 1 = positive), or ``(logits, weights)`` with
            ``weights`` a list of ``(B, H, L, L)``, one per layer.
        """
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
            got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"tokens must be a (B, L) tensor of token ids, got {got}")
        B, L = tokens.shape
        if L > self.max_len:
            raise ValueError(f"inputs of {L} tokens are longer than max_len={self.max_len}")
        if not (tokens[:, 0] == self.cls_id).all():
            raise ValueError(f"every row of tokens must start with <cls> (id {self.cls_id}); use batch_examples")
        attn_mask = (tokens != self.pad_id)[:, None, None, :]  # (B, 1, 1, L): nobody attends to padding
        if mask is not None:
            if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
                raise TypeError("mask must be a bool tensor (True = may attend), broadcastable to (B, H, L, L)")
            check_mask(mask, torch.Size((B, self.num_heads, L, L)))
            attn_mask = attn_mask & mask  # (B, H, L, L) or narrower

        positions = torch.arange(L, device=tokens.device)  # (L,)
        x = self.token_embedding(tokens) + self.position_embedding(positions)  # (B, L, D)
        weights = []
        for layer in self.layers:
            x, w = layer(x, attn_mask, return_weights=True)  # (B, L, D), (B, H, L, L)
            weights.append(w)
        logits = self.classifier(self.norm(x[:, 0]))  # the <cls> vector (B, D) -> (B, 2)
        return (logits, weights) if return_weights else logits


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _mask_for(mask: MaskLike, tokens: Tensor) -> Tensor | None:
    return mask(tokens) if callable(mask) else mask


@contextmanager
def _one_cpu_thread(device: torch.device) -> Iterator[None]:
    """Run a tiny model on one CPU thread: its operations are too small to share out, and
    on a busy machine, threads waiting for each other make every step many times slower."""
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@torch.no_grad()
def predict(model: SentimentClassifier, sentences: Sequence[Sentence], vocab: Vocab, mask: MaskLike = None) -> Tensor:
    """Predicted labels ``(N,)`` on the CPU (1 = positive), in evaluation mode.

    ``mask``: an extra attention mask for the model, or a function ``tokens (N, L) -> mask``.
    """
    was_training = model.training
    model.eval()
    device = _device_of(model)
    with _one_cpu_thread(device):
        tokens = batch_examples(sentences, vocab).to(device)  # (N, L)
        logits = model(tokens, mask=_mask_for(mask, tokens))  # (N, 2)
    model.train(was_training)
    return logits.argmax(dim=-1).cpu()


def evaluate(
    model: SentimentClassifier, examples: Sequence[Example], vocab: Vocab, mask: MaskLike = None
) -> dict[str, float]:
    """Accuracy on all, on the negated and on the plain examples: ``{"all", "negated", "plain"}``.

    A group that ``examples`` doesn't contain gets NaN.
    """
    if not examples:
        raise ValueError("evaluate needs at least one example")
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
) -> dict[str, list[float]]:
    """Train with AdamW and cross-entropy, printing a progress line ``reports`` times.

    Batches are shuffled by a CPU generator seeded with ``seed``, so the run is the same
    on every device (up to rounding). ``mask`` goes to every forward call, training and
    held-out: a tensor, or a function ``tokens (b, L) -> mask`` called on each batch
    (chapter 08 trains with restricted heads).

    Returns:
        history: per epoch, ``"loss"`` (mean training loss) and ``"train_acc"``
        (accuracy on the training batches while training); when ``test`` is given also
        ``"test_negated"`` and ``"test_plain"`` (held-out accuracy after the epoch).
    """
    if not train:
        raise ValueError("train_model needs at least one training example")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive int, got {epochs!r}")
    device = _device_of(model)
    tokens = batch_examples(train, vocab).to(device)  # (N, L)
    labels = torch.tensor([e.label for e in train], device=device)  # (N,)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    history: dict[str, list[float]] = {"loss": [], "train_acc": []}
    if test is not None:
        history.update(test_negated=[], test_plain=[])
    report_every = max(1, math.ceil(epochs / max(reports, 1)))
    start = time.perf_counter()

    with _one_cpu_thread(device):
        for epoch in range(1, epochs + 1):
            model.train()
            order = torch.randperm(len(train), generator=generator).to(device)
            total_loss, total_correct = 0.0, 0
            for i in range(0, len(train), batch_size):
                idx = order[i : i + batch_size]
                batch = tokens[idx]  # (b, L)
                logits = model(batch, mask=_mask_for(mask, batch))  # (b, 2)
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
    model.eval()
    return history


@contextmanager
def silence_heads(attention: MultiHeadAttention, heads: Iterable[int]) -> Iterator[None]:
    """Switch heads off inside a ``with`` block: zero their outputs just before ``W_o``.

    Head ``h`` owns the features ``[h * d_k, (h + 1) * d_k)`` of the concatenated
    heads (see :func:`~mha_lib.split_heads`). A forward pre-hook on ``W_o`` multiplies
    them by 0, so the output projection receives nothing from the silenced heads; the
    other heads and the rest of the model are untouched. The hook is removed on exit.

        with silence_heads(model.layers[0].self_attn, [1]):
            accuracy = evaluate(model, test, vocab)
    """
    heads = list(heads)
    bad = [h for h in heads if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < attention.num_heads]
    if bad:
        raise ValueError(f"heads must be ints in [0, {attention.num_heads}), got {bad}")
    keep = torch.ones(attention.d_model)  # (H * d_k,)
    for h in heads:
        keep[h * attention.d_k : (h + 1) * attention.d_k] = 0.0

    def zero_heads(module: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        concatenated = args[0]  # (B, L, H * d_k), the heads side by side
        return (concatenated * keep.to(concatenated.device, concatenated.dtype), *args[1:])

    handle = attention.W_o.register_forward_pre_hook(zero_heads)
    try:
        yield
    finally:
        handle.remove()


ROLES = ("<cls>", "not", "sentiment word", "other words")


@torch.no_grad()
def attention_shares(
    model: SentimentClassifier,
    examples: Sequence[Example],
    vocab: Vocab,
    query: str = "<cls>",
    layer: int = 0,
) -> dict[str, Tensor]:
    """Where one token's attention goes, per head, averaged over ``examples``.

    Args:
        query: whose attention: ``"<cls>"``, ``"sentiment word"`` or ``"not"`` (then
            every example must be negated).
        layer: which encoder layer.

    Returns:
        ``{role: (H,) tensor}`` for the roles ``"<cls>"``, ``"not"``, ``"sentiment word"``
        and ``"other words"``: the mean share of the query's attention that goes to
        tokens of that role (0 for "not" in a sentence without it). Per head, the four
        shares sum to 1.
    """
    if query not in ROLES[:3]:
        raise ValueError(f"query must be one of {ROLES[:3]}, got {query!r}")
    if not examples:
        raise ValueError("attention_shares needs at least one example")
    if query == "not" and not all(e.negated for e in examples):
        raise ValueError('query="not" needs negated examples only')
    was_training = model.training
    model.eval()
    device = _device_of(model)
    with _one_cpu_thread(device):
        _, weights = model(batch_examples(examples, vocab).to(device), return_weights=True)
    model.train(was_training)
    w = weights[layer].cpu()  # (N, H, L, L)

    rows = torch.arange(len(examples))
    has_not = torch.tensor([e.negated for e in examples])
    position = {  # in the batch, word i sits at i + 1 (after <cls>)
        "<cls>": torch.zeros(len(examples), dtype=torch.long),
        "not": torch.tensor([e.negation_pos + 1 if e.negated else 0 for e in examples]),
        "sentiment word": torch.tensor([e.sentiment_pos + 1 for e in examples]),
    }
    looking = w[rows, :, position[query]]  # (N, H, L): the query's row of every head
    shares = {role: looking[rows, :, position[role]] for role in ROLES[:3]}  # (N, H) each
    shares["not"] = shares["not"] * has_not[:, None]
    shares["other words"] = looking.sum(-1) - sum(shares.values())
    return {role: shares[role].mean(dim=0) for role in ROLES}  # (H,) each
