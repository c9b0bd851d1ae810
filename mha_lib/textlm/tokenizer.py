"""A byte-pair-encoding tokenizer, trained on the corpus in seconds.

Byte-pair encoding (Sennrich et al., 2016; GPT-2's tokenizer is one) starts from single
characters and merges, again and again, the pair of neighbouring symbols seen most often,
until the vocabulary has the size asked for. Frequent words become one token (``" return"``,
``" self"``); rare ones stay split into pieces, so any text can be encoded and nothing is
"unknown".

As GPT-2 does, the text is first cut into *words* (a run of letters, of digits or of
punctuation, each with its one leading space; a run of newlines; a run of spaces) and merges never cross a
word's edge. So a token is part of one word, and the pair counts are taken over the distinct
words weighted by how often each occurs, which keeps training fast.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["Tokenizer", "split_words"]

WORD = re.compile(r" ?[A-Za-z_]+| ?\d+| ?[^\sA-Za-z_\d]+|\n+| +(?=[^ \n])| +")


def split_words(text: str) -> list[str]:
    """Cut ``text`` into the pieces merges may not cross; ``"".join(split_words(t)) == t``."""
    words = WORD.findall(text)
    if sum(map(len, words)) != len(text):
        raise ValueError("text holds characters the tokenizer can't split (a tab or another white space "
                         "than spaces and newlines?)")
    return words


class Tokenizer:
    """Token ids for text and back: ``decode(encode(text)) == text`` for text made of its symbols.

    Args:
        vocab: the tokens, id ``i`` is ``vocab[i]``; single characters first, then one token
            per merge, in the order the merges were learned.
        merges: the pairs merged, in order; ``vocab`` holds each pair's concatenation.
    """

    def __init__(self, vocab: Sequence[str], merges: Sequence[tuple[str, str]]) -> None:
        self.vocab = list(vocab)
        self.merges = [tuple(pair) for pair in merges]
        self.ids = {token: i for i, token in enumerate(self.vocab)}
        if len(self.ids) != len(self.vocab):
            raise ValueError("vocab lists a token twice")
        self._rank = {pair: i for i, pair in enumerate(self.merges)}
        self._cache: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self.vocab)

    def __repr__(self) -> str:
        return f"Tokenizer({len(self.vocab)} tokens, {len(self.merges)} merges)"

    @classmethod
    def train(cls, text: str, vocab_size: int) -> Tokenizer:
        """Learn merges on ``text`` until the vocabulary holds ``vocab_size`` tokens (or no pair is left)."""
        counts = Counter(split_words(text))
        vocab = sorted(set(text))
        if vocab_size < len(vocab):
            raise ValueError(f"vocab_size must be at least the {len(vocab)} distinct characters of the text, "
                             f"got {vocab_size}")
        words = [list(w) for w in counts]  # each distinct word as its current symbols
        freq = list(counts.values())
        pairs: Counter[tuple[str, str]] = Counter()
        where: defaultdict[tuple[str, str], set[int]] = defaultdict(set)  # pair -> words holding it
        for i, symbols in enumerate(words):
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] += freq[i]
                where[pair].add(i)
        merges = []
        while len(vocab) < vocab_size and pairs:
            best = max(pairs, key=lambda p: (pairs[p], p))  # ties broken by the pair itself: deterministic
            if pairs[best] < 2:
                break
            merges.append(best)
            vocab.append(best[0] + best[1])
            for i in list(where[best]):
                symbols = words[i]
                for pair in zip(symbols, symbols[1:]):  # take the word's pairs out ...
                    pairs[pair] -= freq[i]
                merged, j = [], 0
                while j < len(symbols):
                    if j + 1 < len(symbols) and (symbols[j], symbols[j + 1]) == best:
                        merged.append(best[0] + best[1])
                        j += 2
                    else:
                        merged.append(symbols[j])
                        j += 1
                words[i] = merged
                for pair in zip(merged, merged[1:]):  # ... and put the new ones in
                    pairs[pair] += freq[i]
                    where[pair].add(i)
            for pair in [p for p, n in pairs.items() if n <= 0]:
                del pairs[pair]
                where.pop(pair, None)
        return cls(vocab, merges)

    def _encode_word(self, word: str) -> list[int]:
        if word not in self._cache:
            unknown = sorted(set(word) - set(self.ids))
            if unknown:
                raise ValueError(f"the tokenizer has no token for {unknown!r}: it was trained on text without them")
            symbols = list(word)
            while len(symbols) > 1:
                ranked = [(self._rank.get(pair, len(self._rank)), j) for j, pair in enumerate(zip(symbols, symbols[1:]))]
                rank, j = min(ranked)
                if rank == len(self._rank):
                    break
                symbols[j : j + 2] = [symbols[j] + symbols[j + 1]]
            self._cache[word] = [self.ids[s] for s in symbols]
        return self._cache[word]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        return [i for word in split_words(text) for i in self._encode_word(word)]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of token ids (a tensor, a list)."""
        return "".join(self.vocab[int(i)] for i in ids)

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """Each id's text, e.g. to label an attention map."""
        return [self.vocab[int(i)] for i in ids]

    def to_dict(self) -> dict:
        return {"vocab": self.vocab, "merges": [list(m) for m in self.merges]}

    @classmethod
    def from_dict(cls, data: dict) -> Tokenizer:
        return cls(data["vocab"], [tuple(m) for m in data["merges"]])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False))

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        return cls.from_dict(json.loads(Path(path).read_text()))
