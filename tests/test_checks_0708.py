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


# ------------------------------------------------------------------ 7.2 silence one head

import mha_lib  # noqa: E402
from test_checks import ablate_by_hand, ablate_with_hook  # noqa: E402


def _heads(mha, x, zero_q=None):
    q, k, v = (mha_lib.split_heads(f(x), mha.num_heads) for f in (mha.W_q, mha.W_k, mha.W_v))
    if zero_q is not None:
        q = q.clone()
        q[:, zero_q] = 0
    return mha_lib.scaled_dot_product_attention(q, k, v)[0]  # (B, H, L, d_k)


def zeroed_queries(mha, x, head):
    return mha.W_o(mha_lib.combine_heads(_heads(mha, x, zero_q=head)))


def batch_axis(mha, x, head):
    heads = _heads(mha, x).clone()
    heads[head] = 0
    return mha.W_o(mha_lib.combine_heads(heads))


def position_axis(mha, x, head):
    heads = _heads(mha, x).clone()
    heads[:, :, head] = 0
    return mha.W_o(mha_lib.combine_heads(heads))


def hook_never_removed(mha, x, head):
    def zero(module, args):
        concat = args[0].clone()
        concat[..., head * mha.d_k:(head + 1) * mha.d_k] = 0
        return (concat,)

    mha.W_o.register_forward_pre_hook(zero)
    return mha(x, x, x)


def leaves_eval_mode(mha, x, head):
    mha.eval()
    return ablate_by_hand(mha, x, head)


def switches_off_requires_grad(mha, x, head):
    for p in mha.parameters():
        p.requires_grad_(False)
    return ablate_by_hand(mha, x, head)


_by_head = {}


def cached_on_the_head(mha, x, head):  # keyed on the module and the head, not on the input
    key = (id(mha), head)
    if key not in _by_head:
        _by_head[key] = ablate_by_hand(mha, x, head)
    return _by_head[key]


_by_shape = {}


def cached_on_the_input_shape(mha, x, head):  # keyed on the input's shape and the head: stale after the weights change
    key = (id(mha), tuple(x.shape), head)
    if key not in _by_shape:
        _by_shape[key] = ablate_by_hand(mha, x, head)
    return _by_shape[key]


def right_in_float64_only(mha, x, head):
    return ablate_by_hand(mha.double(), x.double(), head)


@pytest.mark.parametrize(("fn", "words"), [
    (zeroed_queries, ("queries were zeroed instead of its output",)),
    (batch_axis, ("wrong axis", "a sequence of the batch", "heads[:, h] = 0")),
    (position_axis, ("wrong axis", "a position", "heads[:, h] = 0")),
    (hook_never_removed, ("left a hook registered", "handle.remove()")),
    (leaves_eval_mode, ("changed the mode", "training mode", "model.train(was_training)")),
    (switches_off_requires_grad, ("changed requires_grad", "torch.no_grad()")),
    (cached_on_the_head, ("shape", "of an earlier call's", "keep nothing from one call to the next")),
    (cached_on_the_input_shape, ("earlier call's result came back", "keep nothing from one call to the next")),
], ids=lambda v: getattr(v, "__name__", None))
def test_head_ablation_names_the_mistake(fn, words):
    _by_head.clear()
    _by_shape.clear()
    expect_fail(checks.check_head_ablation(fn), *words)


def test_head_ablation_passes_right_answers_and_says_where_a_wrong_one_differs():
    expect_pass(checks.check_head_ablation(ablate_by_hand))
    expect_pass(checks.check_head_ablation(ablate_with_hook))

    def silence_by_hook_on_w_o_twice(mha, x, head):  # right: the hook removed by a `with`-like try/finally
        return ablate_with_hook(mha, x, head)

    expect_pass(checks.check_head_ablation(silence_by_hook_on_w_o_twice))
    result = checks.check_head_ablation(lambda mha, x, head: ablate_by_hand(mha, x, head) * 1.01)
    expect_fail(result, "wrong output", "every position differs")
    expect_fail(checks.check_head_ablation(right_in_float64_only), "changed the module's dtype", "torch.float32")

    def float64_output(mha, x, head):
        return ablate_by_hand(mha, x, head).double()

    expect_fail(checks.check_head_ablation(float64_output), "dtype torch.float64", "torch.float32")


# ------------------------------------------------------------------ 7.1 the encoder layer's forward pass

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402


class Layer(nn.Module):
    """The exercise's __init__, a forward with a switch for each mistake of the gallery."""

    def __init__(self, d_model, num_heads, d_ff, mistake=None):
        super().__init__()
        self.self_attn = mha_lib.MultiHeadAttention(d_model, num_heads)
        self.feed_forward = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mistake = mistake
        self.cache = {}

    def attend(self, h, mask):
        if self.mistake == "no W_o":
            a = self.self_attn
            q, k, v = (mha_lib.split_heads(f(h), a.num_heads) for f in (a.W_q, a.W_k, a.W_v))
            return mha_lib.combine_heads(mha_lib.scaled_dot_product_attention(q, k, v, mask)[0])
        return self.self_attn(h, h, h, mask=mask)

    def forward(self, x, mask=None):
        m = self.mistake
        if m == "cached":
            key = tuple(x.shape)
            if key not in self.cache:
                self.cache[key] = Layer.forward(self.plain(), x, mask)
            return self.cache[key]
        if m == "missing norm":
            x = x + self.attend(x, mask)
            return x + self.feed_forward(self.norm2(x))
        if m == "parallel":
            return x + self.attend(self.norm1(x), mask) + self.feed_forward(self.norm2(x))
        if m == "ff first":
            x = x + self.feed_forward(self.norm2(x))
            return x + self.attend(self.norm1(x), mask)
        if m == "eval mode":
            self.eval()
        if m == "no grad":
            for p in self.parameters():
                p.requires_grad_(False)
        if m == "hook":
            self.feed_forward.register_forward_hook(lambda *a: None)
        h = self.norm1(x)
        x = x + self.attend(h, mask)
        if m == "dropout":
            x = F.dropout(x, 0.1)  # training=True by default: on in evaluation mode too
        return x + self.feed_forward(self.norm2(x))

    def plain(self):
        other = Layer.__new__(Layer)
        other.__dict__.update(self.__dict__)
        other.mistake = None
        return other


@pytest.mark.parametrize(("mistake", "words"), [
    ("missing norm", ("a norm is missing", "h = norm1(x)")),
    ("parallel", ("a parallel block", "one after the other")),
    ("ff first", ("feed-forward sublayer runs first",)),
    ("dropout", ("other numbers for the same input", "training=self.training")),
    ("no W_o", ("never projected by w_o", "self_attn.W_o")),
    ("eval mode", ("changed the mode", "training mode")),
    ("no grad", ("changed requires_grad",)),
    ("hook", ("left a hook registered",)),
    ("cached", ("earlier call's result came back", "keep nothing from one call to the next")),
])
def test_encoder_layer_names_the_mistake(mistake, words):
    expect_fail(checks.check_encoder_layer(lambda d, h, f: Layer(d, h, f, mistake)), *words)


def test_encoder_layer_passes_right_answers_and_says_where_a_wrong_one_differs():
    result = checks.check_encoder_layer(Layer)
    expect_pass(result)
    assert "correct in 5 calls" in str(result), result
    expect_pass(checks.check_encoder_layer(mha_lib.EncoderLayer))
    expect_pass(checks.check_encoder_layer(lambda d, h, f: mha_lib.EncoderLayer(d, h, f, dropout=0.1)))

    class Scaled(Layer):
        def forward(self, x, mask=None):
            return super().forward(x, mask) * 1.001

    expect_fail(checks.check_encoder_layer(Scaled), "wrong output", "every position differs")


# ------------------------------------------------------------------ 8.3 ablation losses

from test_checks_induction import ablation  # noqa: E402


def leaves_eval_mode_83(model, batch):
    model.eval()
    return ablation(model, batch)


def requires_grad_off_83(model, batch):
    model.requires_grad_(False)
    return ablation(model, batch)


_tables = {}


def cached_on_the_model(model, batch):  # keyed on the model: stale after its weights change, on another batch
    if id(model) not in _tables:
        _tables[id(model)] = ablation(model, batch)
    return _tables[id(model)]


@pytest.mark.parametrize(("fn", "words"), [
    (leaves_eval_mode_83, ("changed the mode", "training mode", "model.train(was_training)")),
    (requires_grad_off_83, ("changed requires_grad", "torch.no_grad()")),
    (cached_on_the_model, ("returned the losses of the earlier call", "keep nothing from one call to the next")),
], ids=["eval mode", "requires_grad off", "cached"])
def test_ablation_losses_names_state_slips(fn, words):
    _tables.clear()
    expect_fail(checks.check_ablation_losses(fn), *words)


def test_ablation_losses_says_how_many_calls_ran():
    result = checks.check_ablation_losses(ablation)
    expect_pass(result)
    assert "in 5 calls" in str(result), result


# ------------------------------------------------------------------ 8.2 scores

from test_checks_induction import induction_loop, prev_diagonal  # noqa: E402

_scores_by_shape = {}


def previous_cached_on_the_shape(weights):
    key = tuple(weights.shape)
    if key not in _scores_by_shape:
        _scores_by_shape[key] = prev_diagonal(weights)
    return _scores_by_shape[key]


def induction_cached_on_the_shape(weights, batch):
    key = tuple(weights.shape)
    if key not in _scores_by_shape:
        _scores_by_shape[key] = induction_loop(weights, batch)
    return _scores_by_shape[key]


def test_score_checks_name_a_result_kept_from_an_earlier_call_and_say_which_heads_differ():
    _scores_by_shape.clear()
    expect_fail(checks.check_previous_token_score(previous_cached_on_the_shape), "earlier call's scores came back")
    _scores_by_shape.clear()
    expect_fail(checks.check_induction_score(induction_cached_on_the_shape), "earlier call's scores came back")
    expect_fail(checks.check_previous_token_score(lambda w: prev_diagonal(w) * 1.01), "every head differs")


def test_head_ablation_fallback_names_the_head_that_differs():
    def doubles_the_next_head(mha, x, head):
        heads = _heads(mha, x).clone()
        heads[:, head] = 0
        heads[:, (head + 1) % mha.num_heads] *= 2
        return mha.W_o(mha_lib.combine_heads(heads))

    expect_fail(checks.check_head_ablation(doubles_the_next_head), "wrong output", "head 1 differs",
                "head 0 should be all zeros")


# ------------------------------------------------------------------ held-out gallery of issues 32/34: more named slips


class ResidualFromNormalizedFirst(Layer):  # only the attention's residual starts from norm1(x)
    def forward(self, x, mask=None):
        h = self.norm1(x)
        x = h + self.self_attn(h, h, h, mask=mask)
        return x + self.feed_forward(self.norm2(x))


class NoFeedForward(Layer):
    def forward(self, x, mask=None):
        h = self.norm1(x)
        return x + self.self_attn(h, h, h, mask=mask)


class KeysAndValuesFromX(Layer):
    def forward(self, x, mask=None):
        h = self.norm1(x)
        x = x + self.self_attn(h, x, x, mask=mask)
        return x + self.feed_forward(self.norm2(x))


class ReturnsAPair(Layer):
    def forward(self, x, mask=None):
        return super().forward(x, mask), None


@pytest.mark.parametrize(("cls", "words"), [
    (ResidualFromNormalizedFirst, ("residual starts from the normalized input",)),
    (NoFeedForward, ("feed-forward sublayer is missing",)),
    (KeysAndValuesFromX, ("only the queries were normalized", "the same h")),
    (ReturnsAPair, ("returned a pair", "output alone")),
])
def test_encoder_layer_names_more_mistakes(cls, words):
    expect_fail(checks.check_encoder_layer(cls), *words)


def silenced_unscaled(mha, x, head):
    q, k, v = (mha_lib.split_heads(f(x), mha.num_heads) for f in (mha.W_q, mha.W_k, mha.W_v))
    heads = (q @ k.transpose(-2, -1)).softmax(-1) @ v
    heads[:, head] = 0
    return mha.W_o(mha_lib.combine_heads(heads))


def silenced_without_the_bias(mha, x, head):
    heads = _heads(mha, x).clone()
    heads[:, head] = 0
    return mha_lib.combine_heads(heads) @ mha.W_o.weight.T


def only_the_head_kept(mha, x, head):
    heads = _heads(mha, x)
    keep = torch.zeros(mha.num_heads, 1, 1, dtype=x.dtype, device=x.device)
    keep[head] = 1
    return mha.W_o(mha_lib.combine_heads(heads * keep))


def four_heads_assumed(mha, x, head):  # d_k from the example's 4 heads
    concat = mha_lib.combine_heads(_heads(mha, x)).clone()
    d_k = x.size(-1) // 4
    concat[..., head * d_k:(head + 1) * d_k] = 0
    return mha.W_o(concat)


def silenced_with_weights(mha, x, head):
    return ablate_by_hand(mha, x, head), None


@pytest.mark.parametrize(("fn", "words"), [
    (silenced_unscaled, ("not scaled by 1/sqrt(d_k)",)),
    (silenced_without_the_bias, ("w_o's bias was left out",)),
    (only_the_head_kept, ("only head h was kept",)),
    (four_heads_assumed, ("slice of the wrong width", "mha.d_k")),
    (silenced_with_weights, ("returned a pair", "output alone")),
])
def test_head_ablation_names_more_mistakes(fn, words):
    expect_fail(checks.check_head_ablation(fn), *words)
    expect_pass(checks.check_head_ablation(ablate_by_hand))
