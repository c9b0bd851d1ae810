"""The corpus: real text, shipped with the course, the same on every machine.

The text is Python's own test suite (``Lib/test/test_*.py`` of CPython 3.11, the files in
:data:`SOURCE`), under the PSF licence (``corpus_LICENSE.txt``), which allows copying it
with its notice. Why this text: it is real text written by people, it is offline and free to
redistribute, every learner of this course can read it, and it repeats itself more than
prose does (a name defined, then used; a test, then its neighbour). The files are shipped
compressed, so the corpus is the same whatever Python the learner has.

Tabs, carriage returns and characters outside ASCII are dropped (a few dozen out of a
million), so that every symbol is a printable ASCII character, a space or a newline.
"""

from __future__ import annotations

import lzma
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from .tokenizer import Tokenizer

__all__ = ["CORPUS_FILE", "Corpus", "clean", "load_text", "load_corpus"]

HERE = Path(__file__).parent
CORPUS_FILE = HERE / "corpus.txt.xz"
TOKENIZER_FILE = HERE / "tokenizer.json"
SEPARATOR = "\n\n\n"  # between two files; the file list is in corpus_files.txt
VAL_SHARE = 0.1  # the last tenth of the files, by count of characters: held out


def clean(text: str) -> str:
    """Only printable ASCII, spaces and newlines."""
    return "".join(c for c in text if c == "\n" or " " <= c <= "~")


def load_text(path: str | Path = CORPUS_FILE) -> str:
    """The whole corpus as one string."""
    with lzma.open(path, "rt", encoding="ascii") as f:
        return f.read()


@dataclass(frozen=True)
class Corpus:
    """The corpus tokenized: ``train`` and ``val`` ids ``(N,)``, and the tokenizer."""

    tokenizer: Tokenizer
    train: Tensor
    val: Tensor

    def val_windows(self, count: int, length: int, seed: int = 12345) -> tuple[Tensor, Tensor]:
        """``count`` fixed windows of held-out text ``(count, length)`` and their targets."""
        from .train import batches

        return batches(self.val, count, length, torch.Generator().manual_seed(seed))


def load_corpus(vocab_size: int | None = None) -> Corpus:
    """The shipped corpus, tokenized with the shipped tokenizer (or one trained now on the
    training part, when ``vocab_size`` is given), split into training and held-out text.

    The split is by file: the held-out text is files the model never trains on.
    """
    text = load_text()
    files = text.split(SEPARATOR)
    cut, total = len(files), 0
    budget = (1 - VAL_SHARE) * len(text)
    for i, f in enumerate(files):
        total += len(f) + len(SEPARATOR)
        if total > budget:
            cut = i + 1
            break
    train_text, val_text = SEPARATOR.join(files[:cut]), SEPARATOR.join(files[cut:])
    if vocab_size is None:
        tokenizer = Tokenizer.load(TOKENIZER_FILE)
    else:
        tokenizer = Tokenizer.train(train_text, vocab_size)
    as_ids = lambda t: torch.tensor(tokenizer.encode(t), dtype=torch.long)  # noqa: E731
    return Corpus(tokenizer, as_ids(train_text), as_ids(val_text))


def build_corpus(test_dir: str | Path, chars: int = 1_000_000, path: str | Path = CORPUS_FILE,
                 longest: int = 40_000) -> list[str]:
    """Write the corpus from a CPython ``Lib/test`` folder; returns the file names (the
    maintainers' command, not the learner's).

    Whole ``test_*.py`` files of at most ``longest`` characters, spread evenly over the
    alphabet (every k-th file in name order), until ``chars`` characters.
    """
    texts = {}
    for file in sorted(Path(test_dir).glob("test_*.py")):
        text = clean(file.read_text(encoding="utf-8", errors="replace")).strip("\n")
        if len(text) <= longest:
            texts[file.name] = text
    stride = max(1, round(sum(map(len, texts.values())) / chars))
    names, parts, total = [], [], 0
    for name in list(texts)[::stride]:
        if total + len(texts[name]) > chars:
            break
        names.append(name)
        parts.append(texts[name])
        total += len(texts[name]) + len(SEPARATOR)
    with lzma.open(path, "wt", encoding="ascii", preset=9) as f:
        f.write(SEPARATOR.join(parts))
    return names
