"""Issue 34, exercises 7.1, 7.2, 8.1, 8.2 and 8.3: the state, mode and device slips and the mistakes that
the gallery found, each failing with its own hint, while the right answers still pass."""

from __future__ import annotations

import pytest
import torch

from conftest import expect_fail, expect_pass
from mha_lib import checks
from test_checks_induction import segment_batch

# ------------------------------------------------------------------ 8.1 the repeated-segment batch


def one_length_for_the_batch(batch_size, seq_len, vocab_size, segment, generator):
    lo, hi = segment
    tokens = torch.randint(vocab_size, (batch_size, seq_len), generator=generator)
    predictable = torch.zeros(batch_size, seq_len, dtype=torch.bool)
    n = int(torch.randint(lo, hi + 1, (), generator=generator))  # once, for every row
    for b in range(batch_size):
        first = int(torch.randint(0, seq_len - 2 * n + 1, (), generator=generator))
        second = int(torch.randint(first + n, seq_len - n + 1, (), generator=generator))
        tokens[b, second:second + n] = tokens[b, first:first + n].clone()
        predictable[b, second + 1:second + n] = True
    return tokens, predictable


def copy_one_short(batch_size, seq_len, vocab_size, segment, generator):
    lo, hi = segment
    tokens = torch.randint(vocab_size, (batch_size, seq_len), generator=generator)
    predictable = torch.zeros(batch_size, seq_len, dtype=torch.bool)
    for b in range(batch_size):
        n = int(torch.randint(lo, hi + 1, (), generator=generator))
        first = int(torch.randint(0, seq_len - 2 * n + 1, (), generator=generator))
        second = int(torch.randint(first + n, seq_len - n + 1, (), generator=generator))
        tokens[b, second:second + n - 1] = tokens[b, first:first + n - 1].clone()  # one token short
        predictable[b, second + 1:second + n] = True
    return tokens, predictable


def one_empty_row(batch_size, seq_len, vocab_size, segment, generator):
    tokens, predictable = segment_batch(batch_size, seq_len, vocab_size, segment, generator)
    predictable[min(11, batch_size - 1)] = False
    return tokens, predictable


@pytest.mark.parametrize(("fn", "words", "not_words"), [
    (one_length_for_the_batch, ("one length n was drawn for the whole batch", "draw n per row"), ("never draws",)),
    (lambda *a, **k: segment_batch(*a, **k)[::-1], ("pair is swapped", "return tokens, predictable"), ("bool mask (torch.bool)",)),
    (copy_one_short, ("copy is one token short", "second + n"), ("predictable is wrong", "off by one")),
    (one_empty_row, ("row 11 has no token marked predictable",), ("row 11 has a token",)),
], ids=["one length", "swapped pair", "copy one short", "empty row"])
def test_repeated_segment_batch_names_the_real_fault_first(fn, words, not_words):
    result = checks.check_repeated_segment_batch(fn)
    expect_fail(result, *words)
    for word in not_words:
        assert word.lower() not in str(result).lower(), result


def test_repeated_segment_batch_says_how_many_batches_ran():
    result = checks.check_repeated_segment_batch(segment_batch)
    expect_pass(result)
    assert "in 4 batch sizes" in str(result), result
