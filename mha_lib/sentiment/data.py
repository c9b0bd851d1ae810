"""The task: sentences with negations, generated in code, their vocabulary and batches of ids.

:func:`make_datasets` draws sentences such as "the movie was not bad" (positive) or
"i did not find the plot very clever" (negative) from a few templates, with a seed. The
label is the sentiment *after* negation: "not" flips it. Train and held-out sentences
never overlap. :class:`Vocab` turns tokens into ids and back, :func:`tokenize` splits a
sentence, :func:`batch_examples` makes a padded batch of ids, each row starting with ``<cls>``.

The negation example comes from *Transformers in Action* (Manning), section 1.1.4.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..validation import check_positive_int, check_whole

__all__ = [
    "MAX_SENTENCES",
    "NEGATION",
    "NEGATIVE",
    "POSITIVE",
    "Example",
    "Sentence",
    "Vocab",
    "batch_examples",
    "make_datasets",
    "tokenize",
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
        raise TypeError(f"tokenize expects a string, got {type(text).__name__}: text must be a str, "
                        "e.g. 'a good film'")
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


def check_examples(examples: object, name: str) -> None:
    """A clear error unless ``examples`` is a non-empty list of :class:`Example` s (labelled sentences)."""
    if isinstance(examples, (str, Example)) or not isinstance(examples, Sequence):
        raise TypeError(f"{name} must be a list of Examples (from make_datasets), got {type(examples).__name__}")
    if not examples:
        raise ValueError(f"{name} needs at least one example")
    wrong = next((e for e in examples if not isinstance(e, Example)), None)
    if wrong is not None:
        raise TypeError(f"{name} must hold Examples, which carry their labels (from make_datasets), got a "
                        f"{type(wrong).__name__}: {wrong!r}; predict takes plain sentences")


def make_datasets(n_train: int = 2000, n_test: int = 500, seed: int = 0) -> tuple[list[Example], list[Example]]:
    """Draw ``n_train + n_test`` *different* sentences; the first ``n_train`` are for training.

    Deterministic: the same arguments give the same sentences on every machine
    (Python's ``random.Random(seed)``). No held-out sentence occurs in training.
    The templates allow far more than ``MAX_SENTENCES = 100_000`` sentences, the most
    one call may ask for.
    """
    n_train, n_test, seed = check_whole(n_train, "n_train"), check_whole(n_test, "n_test"), check_whole(seed, "seed")
    for name, n in (("n_train", n_train), ("n_test", n_test)):
        if n < 0:
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
        if isinstance(words, str) or not isinstance(words, Iterable):
            raise TypeError(f"words must be a list of words, got {type(words).__name__}; for a text use tokenize(text)")
        words = list(words)
        if not all(isinstance(w, str) for w in words):
            bad = next(w for w in words if not isinstance(w, str))
            raise TypeError(f"words must be strings, got {bad!r} (a {type(bad).__name__}); e.g. tokenize(text)")
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
        if not isinstance(tokens, Sequence):
            raise TypeError(f"tokens must be a sentence or a list of words, got {type(tokens).__name__}")
        return [self.stoi.get(token, self.unk_id) for token in tokens]

    def decode(self, ids: Iterable[int] | Tensor) -> list[str]:
        """Ids to tokens, dropping the padding."""
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        if not isinstance(ids, Iterable):
            raise TypeError(f"ids must be a list or 1-D tensor of token ids, got {type(ids).__name__}")
        ids = list(ids)
        bad = [i for i in ids if not 0 <= i < len(self)]  # a negative id would silently count from the end
        if bad:
            raise ValueError(f"ids must be token ids in [0, {len(self)}), got {bad[:5]}")
        return [self.itos[i] for i in ids if i != self.pad_id]


Sentence = Example | Sequence[str] | str


def batch_examples(sentences: Sequence[Sentence], vocab: Vocab, max_len: int | None = None) -> Tensor:
    """Encode sentences into one padded batch ``(B, L)`` of ids: ``<cls>``, the words, ``<pad>`` s.

    Accepts :class:`Example` s, token lists or plain strings. ``L`` is one more than the
    longest sentence (or ``max_len``). Word ``i`` of a sentence sits at position ``i + 1``.
    """
    if isinstance(sentences, (str, Example)) or not isinstance(sentences, Iterable):
        raise TypeError(f"sentences must be a list of sentences, got {type(sentences).__name__}; "
                        "for one sentence pass [sentence]")
    if not isinstance(vocab, Vocab):
        raise TypeError(f"vocab must be a Vocab, e.g. Vocab.for_task(), got {type(vocab).__name__}")
    ids = []
    for item in sentences:
        tokens = item.tokens if isinstance(item, Example) else item
        if not isinstance(tokens, (str, Sequence)) or not all(isinstance(t, str) for t in tokens):
            raise TypeError(f"each sentence must be an Example, a string or a list of words, got {item!r}")
        ids.append([vocab.cls_id, *vocab.encode(tokens)])
    if not ids:
        raise ValueError("batch_examples needs at least one sentence")
    longest = max(len(seq) for seq in ids)
    max_len = longest if max_len is None else check_positive_int(max_len, "max_len")
    if max_len < longest:
        raise ValueError(f"max_len={max_len} is too short for the longest sentence (<cls> + {longest - 1} words)")
    batch = torch.full((len(ids), max_len), vocab.pad_id, dtype=torch.long)
    for row, seq in enumerate(ids):
        batch[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return batch  # (B, L)
