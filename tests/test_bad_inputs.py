"""A gallery of the public API called as users call it: bad inputs are refused, valid edge inputs work.

Each bad call must raise a ValueError or TypeError whose message names the argument (or
what was expected of it), never a raw error from deep inside Python, NumPy or PyTorch, and
never a silently wrong result. Each valid edge call (NumPy integers for sizes, slices of one
tensor for self-attention, ...) must give what the plain call gives.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mha_lib import (
    AttentionHead,
    EfficientMultiHeadAttention,
    EncoderLayer,
    KVCache,
    MultiHeadAttention,
    apply_rotary,
    causal_mask,
    combine_heads,
    kv_cache_bytes,
    padding_mask,
    plot_attention,
    repeat_kv,
    scaled_dot_product_attention,
    seed_everything,
    sinusoidal_positions,
    sliding_window_mask,
    split_heads,
)
from mha_lib import sentiment
from mha_lib.heads import silence_heads
from mha_lib.induction import AttentionOnlyTransformer

BAD = (TypeError, ValueError)
MODULES = (MultiHeadAttention, EfficientMultiHeadAttention)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


# --- what the calls are made on -------------------------------------------------------------


def x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape or (2, 5, 8))


def weights() -> torch.Tensor:
    return torch.softmax(torch.randn(3, 3), dim=-1)


def vocab() -> sentiment.Vocab:
    return sentiment.Vocab.for_task()


def examples(n: int = 8) -> list[sentiment.Example]:
    return sentiment.make_datasets(n, 0, seed=0)[0]


def classifier(**kw) -> sentiment.SentimentClassifier:
    return sentiment.SentimentClassifier(len(vocab()), d_model=8, num_heads=2, d_ff=16, **kw)


def enter(context) -> None:
    with context:
        pass


def train(**kw):
    return sentiment.train_model(classifier(), examples(), vocab(), **{"epochs": 1, "reports": 0, **kw})


def shared_cache():
    """Two layers of one size, one cache: the second would read the first one's keys."""
    cache, first, second = KVCache(), MultiHeadAttention(8, 2), MultiHeadAttention(8, 2)
    inputs = x()
    first(inputs, inputs, inputs, cache=cache)
    second(inputs, inputs, inputs, cache=cache)


# --- bad inputs: (call, words the error must contain) ----------------------------------------

REFUSED = [
    # masks.py
    pytest.param(lambda: padding_mask(None), "lengths", id="padding_mask(None)"),
    pytest.param(lambda: padding_mask("3 5"), "lengths", id="padding_mask(str)"),
    pytest.param(lambda: padding_mask({2, 3}), "lengths", id="padding_mask(set)"),
    pytest.param(lambda: padding_mask(["a", "b"]), "lengths", id="padding_mask(list of str)"),
    pytest.param(lambda: padding_mask([2.0, 3.0]), "lengths", id="padding_mask(floats)"),
    pytest.param(lambda: padding_mask([True, False]), "lengths", id="padding_mask(bools)"),
    pytest.param(lambda: padding_mask([2, -1]), "lengths", id="padding_mask(negative)"),
    pytest.param(lambda: padding_mask([2, 3], 4.0), "max_len", id="padding_mask(max_len=4.0)"),
    pytest.param(lambda: padding_mask([2, 3], "4"), "max_len", id="padding_mask(max_len=str)"),
    pytest.param(lambda: padding_mask([2, 3], 2), "max_len", id="padding_mask(max_len<longest)"),
    pytest.param(lambda: causal_mask(None), "seq_len", id="causal_mask(None)"),
    pytest.param(lambda: causal_mask(2.5), "seq_len", id="causal_mask(2.5)"),
    pytest.param(lambda: causal_mask(0), "seq_len", id="causal_mask(0)"),
    pytest.param(lambda: causal_mask(True), "seq_len", id="causal_mask(True)"),
    pytest.param(lambda: sliding_window_mask(0, 2), "seq_len", id="sliding_window_mask(0, 2)"),
    pytest.param(lambda: sliding_window_mask(4, 0), "window", id="sliding_window_mask(4, 0)"),
    pytest.param(lambda: sliding_window_mask(4, 2.0), "window", id="sliding_window_mask(4, 2.0)"),
    pytest.param(lambda: sliding_window_mask(4, None), "window", id="sliding_window_mask(4, None)"),
    pytest.param(lambda: causal_mask(4, device="gpu"), "device", id="causal_mask(device='gpu')"),
    pytest.param(lambda: sliding_window_mask(4, 2, device="gpu"), "device", id="sliding_window_mask(device='gpu')"),
    # device.py
    pytest.param(lambda: seed_everything(1.5), "seed", id="seed_everything(1.5)"),
    pytest.param(lambda: seed_everything(None), "seed", id="seed_everything(None)"),
    pytest.param(lambda: seed_everything("1"), "seed", id="seed_everything(str)"),
    pytest.param(lambda: seed_everything(True), "seed", id="seed_everything(True)"),
    pytest.param(lambda: seed_everything(-1), "seed", id="seed_everything(-1)"),
    pytest.param(lambda: seed_everything(2**32), "seed", id="seed_everything(2**32)"),
    # plotting.py
    pytest.param(lambda: plot_attention(weights(), query_labels=3), "query_labels", id="plot(query_labels=3)"),
    pytest.param(lambda: plot_attention(weights(), key_labels=3), "key_labels", id="plot(key_labels=3)"),
    pytest.param(lambda: plot_attention(weights(), head_titles=3), "head_titles", id="plot(head_titles=3)"),
    pytest.param(lambda: plot_attention(weights(), ["a", "b"]), "query_labels has 2 labels", id="plot(2 labels)"),
    pytest.param(lambda: plot_attention(weights(), "the cat sat"), r"text\.split\(\)", id="plot(labels=sentence)"),
    pytest.param(lambda: plot_attention(None), "weights", id="plot(None)"),
    pytest.param(lambda: plot_attention("abc"), "weights", id="plot(str)"),
    pytest.param(lambda: plot_attention([[0.5, "x"]]), "weights", id="plot(list with str)"),
    pytest.param(lambda: plot_attention(torch.zeros(0, 3)), "weights", id="plot(empty)"),
    pytest.param(lambda: plot_attention(torch.zeros(2, 2, dtype=torch.complex64)), "weights", id="plot(complex)"),
    pytest.param(lambda: plot_attention(torch.rand(3)), "weights", id="plot(1-D)"),
    pytest.param(lambda: plot_attention(torch.rand(2, 2, 3, 3)), r"weights\[0\]", id="plot(4-D)"),
    pytest.param(lambda: plot_attention(weights(), panel_size=-1), "panel_size", id="plot(panel_size=-1)"),
    pytest.param(lambda: plot_attention(weights(), panel_size="3"), "panel_size", id="plot(panel_size=str)"),
    pytest.param(lambda: plot_attention(weights(), vmax=-1), "vmax", id="plot(vmax=-1)"),
    pytest.param(lambda: plot_attention(weights(), vmax="1"), "vmax", id="plot(vmax=str)"),
    pytest.param(lambda: plot_attention(weights(), annotate="no"), "annotate", id="plot(annotate=str)"),
    # heads.py
    pytest.param(lambda: split_heads(x().numpy(), 2), "ndarray", id="split_heads(ndarray, 2)"),
    pytest.param(lambda: split_heads(None, 2), "NoneType", id="split_heads(None, 2)"),
    pytest.param(lambda: split_heads(x(5, 8), 2), r"\(B, L, D\)", id="split_heads(2-D)"),
    pytest.param(lambda: split_heads(x(), 2.0), "num_heads", id="split_heads(x, 2.0)"),
    pytest.param(lambda: split_heads(x(), 0), "num_heads", id="split_heads(x, 0)"),
    pytest.param(lambda: split_heads(x(), 3), "num_heads", id="split_heads(x, 3)"),
    pytest.param(lambda: combine_heads(np.zeros((1, 2, 3, 4))), "ndarray", id="combine_heads(ndarray)"),
    pytest.param(lambda: combine_heads(x()), r"\(B, H, L, d_k\)", id="combine_heads(3-D)"),
    pytest.param(lambda: enter(silence_heads(MultiHeadAttention(8, 2), 1)), "heads", id="silence_heads(mha, 1)"),
    pytest.param(lambda: enter(silence_heads(MultiHeadAttention(8, 2), None)), "heads", id="silence_heads(mha, None)"),
    pytest.param(lambda: enter(silence_heads(MultiHeadAttention(8, 2), [2])), "heads", id="silence_heads(mha, [2])"),
    pytest.param(lambda: enter(silence_heads(MultiHeadAttention(8, 2), [1.0])), "heads",
                 id="silence_heads(mha, [1.0])"),
    pytest.param(lambda: enter(silence_heads(None, [0])), "multi-head module", id="silence_heads(None, [0])"),
    # positions.py
    pytest.param(lambda: sinusoidal_positions(0, 8), "seq_len", id="sinusoidal_positions(0, 8)"),
    pytest.param(lambda: sinusoidal_positions(4, 8.0), "d_model", id="sinusoidal_positions(4, 8.0)"),
    pytest.param(lambda: sinusoidal_positions(4, 8, device="gpu"), "device", id="sinusoidal_positions(device='gpu')"),
    pytest.param(lambda: apply_rotary(torch.arange(8).reshape(2, 4)), "floating-point", id="apply_rotary(int64)"),
    pytest.param(lambda: apply_rotary(torch.ones(2, 4, dtype=torch.bool)), "floating-point", id="apply_rotary(bool)"),
    pytest.param(lambda: apply_rotary(np.zeros((2, 4))), "ndarray", id="apply_rotary(ndarray)"),
    pytest.param(lambda: apply_rotary(x(2, 3)), "d_k", id="apply_rotary(odd d_k)"),
    pytest.param(lambda: apply_rotary(x(2, 4), positions=[0, 1]), "positions", id="apply_rotary(positions=list)"),
    pytest.param(lambda: apply_rotary(x(2, 4), positions=torch.arange(3)), "positions", id="apply_rotary(3 positions)"),
    pytest.param(lambda: apply_rotary(x(2, 4), base=float("inf")), "base", id="apply_rotary(base=inf)"),
    pytest.param(lambda: apply_rotary(x(2, 4), base=float("nan")), "base", id="apply_rotary(base=nan)"),
    pytest.param(lambda: apply_rotary(x(2, 4), base=1), "base", id="apply_rotary(base=1)"),
    pytest.param(lambda: apply_rotary(x(2, 4), base=0.5), "base", id="apply_rotary(base=0.5)"),
    pytest.param(lambda: apply_rotary(x(2, 4), base="10000"), "base", id="apply_rotary(base=str)"),
    # attention.py
    pytest.param(lambda: scaled_dot_product_attention(x(2, 2, 5, 4), x(2, 5, 4), x(2, 5, 4)), "query, key and value",
                 id="sdpa(4-D q, 3-D k/v)"),
    pytest.param(lambda: scaled_dot_product_attention(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 3))), "query",
                 id="sdpa(ndarray)"),
    pytest.param(lambda: scaled_dot_product_attention(x(2, 3), x(2, 3), x(2, 3), dropout_p=1), "dropout_p",
                 id="sdpa(dropout_p=1)"),
    pytest.param(lambda: scaled_dot_product_attention(
        x(5, 4), x(5, 4), x(5, 4), mask=torch.zeros(5, 5).fill_diagonal_(float("inf"))), r"\+inf",
        id="sdpa(+inf mask)"),
    pytest.param(lambda: scaled_dot_product_attention(
        x(5, 4), x(5, 4), x(5, 4), mask=torch.full((5, 5), float("nan"))), "NaN", id="sdpa(NaN mask)"),
    pytest.param(lambda: scaled_dot_product_attention(
        x(5, 4), x(5, 4), x(5, 4), mask=torch.ones(5, 5, dtype=torch.long)), "mask", id="sdpa(int mask)"),
    pytest.param(lambda: scaled_dot_product_attention(
        x(5, 4), x(5, 4), x(5, 4), mask=torch.ones(5, 5)), "mask", id="sdpa(float 0/1 mask)"),
    pytest.param(lambda: scaled_dot_product_attention(
        x(5, 4), x(5, 4), x(5, 4), mask=torch.ones(5, 5, dtype=torch.bool, device="meta")), "mask",
        id="sdpa(mask on meta)"),
    # inference.py
    pytest.param(lambda: repeat_kv(np.zeros((1, 2, 3, 4)), 2), "ndarray", id="repeat_kv(ndarray, 2)"),
    pytest.param(lambda: repeat_kv(x(1, 2, 3, 4), 0), "n_rep", id="repeat_kv(x, 0)"),
    pytest.param(lambda: repeat_kv(x(1, 2, 3, 4), 2.0), "n_rep", id="repeat_kv(x, 2.0)"),
    pytest.param(lambda: kv_cache_bytes(2.0, 2, 4, 8), "num_layers", id="kv_cache_bytes(2.0, ...)"),
    pytest.param(lambda: KVCache().update(np.zeros((1, 1, 1, 1)), np.zeros((1, 1, 1, 1))), "keys",
                 id="KVCache.update(ndarray)"),
    pytest.param(shared_cache, "one KVCache per layer", id="one KVCache, two layers"),
    # single_head.py
    pytest.param(lambda: AttentionHead(8, 0), "d_k", id="AttentionHead(8, 0)"),
    pytest.param(lambda: AttentionHead(8, 4.0), "d_k", id="AttentionHead(8, 4.0)"),
    pytest.param(lambda: AttentionHead(8, 4, d_v=0), "d_v", id="AttentionHead(d_v=0)"),
    pytest.param(lambda: AttentionHead("8", 4), "d_model", id="AttentionHead('8', 4)"),
    pytest.param(lambda: AttentionHead(8, 4, bias="no"), "bias", id="AttentionHead(bias='no')"),
    pytest.param(lambda: AttentionHead(8, 4, bias=None), "bias", id="AttentionHead(bias=None)"),
    pytest.param(lambda: AttentionHead(8, 4)(x().numpy(), x(), x()), "query", id="AttentionHead(ndarray)"),
    pytest.param(lambda: AttentionHead(8, 4)(x().double(), x(), x()), "query", id="AttentionHead(float64)"),
    pytest.param(lambda: AttentionHead(8, 4)(x().to("meta"), x(), x()), "query", id="AttentionHead(on meta)"),
    pytest.param(lambda: AttentionHead(8, 4)(x(), x(), x(), mask=padding_mask([5, 3])), "mask",
                 id="AttentionHead(4-D mask)"),
    pytest.param(lambda: AttentionHead(8, 4)(x(), x(), x(), mask=[[True]]), "mask", id="AttentionHead(mask=list)"),
    # encoder.py
    pytest.param(lambda: EncoderLayer(8, 2, -1), "d_ff", id="EncoderLayer(d_ff=-1)"),
    pytest.param(lambda: EncoderLayer(8, 2, 16.0), "d_ff", id="EncoderLayer(d_ff=16.0)"),
    pytest.param(lambda: EncoderLayer(8, 3, 16), "num_heads", id="EncoderLayer(8, 3)"),
    pytest.param(lambda: EncoderLayer(8, 2, 16, dropout=1), "dropout", id="EncoderLayer(dropout=1)"),
    pytest.param(lambda: EncoderLayer(8, 2, 16, dropout="0.1"), "dropout", id="EncoderLayer(dropout=str)"),
    pytest.param(lambda: EncoderLayer(8, 2, 16)(x().numpy()), "x", id="EncoderLayer(ndarray)"),
    pytest.param(lambda: EncoderLayer(8, 2, 16)(x(5, 8)), "x", id="EncoderLayer(2-D)"),
    pytest.param(lambda: EncoderLayer(8, 2, 16)(x().to("meta")), "x", id="EncoderLayer(on meta)"),
    pytest.param(lambda: EncoderLayer(8, 2, 16)(x(), mask=torch.ones(5, 5, dtype=torch.long)), "mask",
                 id="EncoderLayer(int mask)"),
    # sentiment/
    pytest.param(lambda: sentiment.SentimentClassifier(vocab_size=-1), "vocab_size", id="SentimentClassifier(-1)"),
    pytest.param(lambda: sentiment.SentimentClassifier(vocab_size=0), "vocab_size", id="SentimentClassifier(0)"),
    pytest.param(lambda: sentiment.SentimentClassifier(vocab_size=vocab()), "vocab_size",
                 id="SentimentClassifier(vocab)"),
    pytest.param(lambda: sentiment.SentimentClassifier(10, num_layers=-1), "num_layers", id="num_layers=-1"),
    pytest.param(lambda: sentiment.SentimentClassifier(10, num_layers=0), "num_layers", id="num_layers=0"),
    pytest.param(lambda: sentiment.SentimentClassifier(10, num_layers=1.5), "num_layers", id="num_layers=1.5"),
    pytest.param(lambda: sentiment.SentimentClassifier(10, max_len=0), "max_len", id="max_len=0"),
    pytest.param(lambda: sentiment.SentimentClassifier(10, max_len=-3), "max_len", id="max_len=-3"),
    pytest.param(lambda: sentiment.SentimentClassifier(10, d_model=-8), "d_model", id="d_model=-8"),
    pytest.param(lambda: sentiment.SentimentClassifier(10, d_model=8.0, num_heads=2), "d_model", id="d_model=8.0"),
    pytest.param(lambda: sentiment.SentimentClassifier(10, pad_id=None), "pad_id", id="pad_id=None"),
    pytest.param(lambda: sentiment.SentimentClassifier(10, pad_id=-1), "pad_id", id="pad_id=-1"),
    pytest.param(lambda: sentiment.SentimentClassifier(10, cls_id=10), "cls_id", id="cls_id=vocab_size"),
    pytest.param(lambda: sentiment.SentimentClassifier(10, cls_id=0), "pad_id and cls_id", id="cls_id=pad_id"),
    pytest.param(lambda: classifier()(np.array([[2, 3, 0]])), "tokens", id="classifier(ndarray)"),
    pytest.param(lambda: classifier()(torch.tensor([[2.0, 3.0]])), "tokens", id="classifier(float tokens)"),
    pytest.param(lambda: classifier()(torch.tensor([[2, 3]], device="meta")), "tokens", id="classifier(on meta)"),
    pytest.param(lambda: classifier()(torch.tensor([[2, 3]]), mask=torch.zeros(2, 2)), "mask",
                 id="classifier(float mask)"),
    pytest.param(lambda: sentiment.make_datasets(2.0), "n_train", id="make_datasets(2.0)"),
    pytest.param(lambda: sentiment.make_datasets(-1), "n_train", id="make_datasets(-1)"),
    pytest.param(lambda: sentiment.make_datasets(2, None), "n_test", id="make_datasets(n_test=None)"),
    pytest.param(lambda: sentiment.make_datasets(2, 2, seed=None), "seed", id="make_datasets(seed=None)"),
    pytest.param(lambda: sentiment.batch_examples("the movie was good", vocab()), "sentences",
                 id="batch_examples(str)"),
    pytest.param(lambda: sentiment.batch_examples(["good"], None), "vocab", id="batch_examples(vocab=None)"),
    pytest.param(lambda: sentiment.batch_examples([None], vocab()), "sentence", id="batch_examples([None])"),
    pytest.param(lambda: sentiment.batch_examples(["good"], vocab(), max_len=2.0), "max_len",
                 id="batch_examples(max_len=2.0)"),
    pytest.param(lambda: sentiment.Vocab("abc"), "words", id="Vocab(str)"),
    pytest.param(lambda: sentiment.Vocab(None), "words", id="Vocab(None)"),
    pytest.param(lambda: vocab().encode(None), "tokens", id="vocab.encode(None)"),
    pytest.param(lambda: vocab().decode([999]), "ids", id="vocab.decode([999])"),
    pytest.param(lambda: vocab().decode([-1]), "ids", id="vocab.decode([-1])"),
    pytest.param(lambda: sentiment.train_model(None, examples(), vocab()), "model", id="train_model(None)"),
    pytest.param(lambda: sentiment.train_model(classifier(), ["good"], vocab()), "train", id="train_model(strings)"),
    pytest.param(lambda: sentiment.train_model(classifier(), [], vocab()), "train", id="train_model([])"),
    pytest.param(lambda: train(epochs=2.0), "epochs", id="train_model(epochs=2.0)"),
    pytest.param(lambda: train(batch_size=0), "batch_size", id="train_model(batch_size=0)"),
    pytest.param(lambda: train(batch_size=-1), "batch_size", id="train_model(batch_size=-1)"),
    pytest.param(lambda: train(lr="0.1"), "lr", id="train_model(lr=str)"),
    pytest.param(lambda: train(lr=-1), "lr", id="train_model(lr=-1)"),
    pytest.param(lambda: train(weight_decay=float("nan")), "weight_decay", id="train_model(weight_decay=nan)"),
    pytest.param(lambda: train(seed=1.5), "seed", id="train_model(seed=1.5)"),
    pytest.param(lambda: train(reports=-1), "reports", id="train_model(reports=-1)"),
    pytest.param(lambda: train(test=["good"]), "test", id="train_model(test=strings)"),
    pytest.param(lambda: sentiment.evaluate(None, examples(), vocab()), "model", id="evaluate(None)"),
    pytest.param(lambda: sentiment.evaluate(classifier(), ["good"], vocab()), "examples", id="evaluate(strings)"),
    pytest.param(lambda: sentiment.evaluate(classifier(), [], vocab()), "examples", id="evaluate([])"),
    pytest.param(lambda: sentiment.predict(None, ["good"], vocab()), "model", id="predict(None)"),
    pytest.param(lambda: sentiment.attention_shares(classifier(), examples(), vocab(), layer=1), "layer",
                 id="attention_shares(layer=1)"),
    pytest.param(lambda: sentiment.attention_shares(classifier(), examples(), vocab(), layer=1.0), "layer",
                 id="attention_shares(layer=1.0)"),
    pytest.param(lambda: sentiment.attention_shares(None, examples(), vocab()), "model",
                 id="attention_shares(None)"),
    pytest.param(lambda: sentiment.attention_shares(classifier(), ["good"], vocab()), "examples",
                 id="attention_shares(strings)"),
    # induction/
    pytest.param(lambda: AttentionOnlyTransformer(10, d_model=-1), "d_model",
                 id="AttentionOnlyTransformer(d_model=-1)"),
    pytest.param(lambda: AttentionOnlyTransformer(10, d_model=8.0), "d_model", id="AttentionOnlyTransformer(8.0)"),
    pytest.param(lambda: AttentionOnlyTransformer(10, positions=None), "positions",
                 id="AttentionOnlyTransformer(positions=None)"),
]


@pytest.mark.parametrize(("call", "words"), REFUSED)
def test_bad_input_is_refused_with_a_message_that_names_it(call, words):
    with pytest.raises(BAD, match=words):
        call()


# --- the multi-head modules, both of them ----------------------------------------------------

MODULE_REFUSED = [
    pytest.param(lambda M: M(8, 2, rotary="False"), "rotary", id="rotary='False'"),
    pytest.param(lambda M: M(8, 2, bias="no"), "bias", id="bias='no'"),
    pytest.param(lambda M: M(8, 2, bias=None), "bias", id="bias=None"),
    pytest.param(lambda M: M(8, 3), "num_heads", id="(8, 3)"),
    pytest.param(lambda M: M(8, 0), "num_heads", id="(8, 0)"),
    pytest.param(lambda M: M(8.0, 2), "d_model", id="(8.0, 2)"),
    pytest.param(lambda M: M(8, 2, True), "dropout", id="dropout=True"),
    pytest.param(lambda M: M(8, 2, num_kv_heads=0), "num_kv_heads", id="num_kv_heads=0"),
    pytest.param(lambda M: M(8, 4, num_kv_heads=3), "num_kv_heads", id="num_kv_heads=3"),
    pytest.param(lambda M: M(6, 2, rotary=True), "rotary", id="rotary with odd d_k"),
    pytest.param(lambda M: M(8, 2, rotary=True, rope_base=-10000), "rope_base must be a finite number above 1",
                 id="rope_base<0"),
    pytest.param(lambda M: M(8, 2, rope_base=500000), "rope_base is a setting of RoPE: pass rotary=True",
                 id="rope_base without rotary"),
    pytest.param(lambda M: M(8, 2, rotary=True, rope_interleaved="yes"), "rope_interleaved", id="rope_interleaved=str"),
    pytest.param(lambda M: M(8, 2, qk_norm="rms"), "qk_norm", id="qk_norm=str"),
    pytest.param(lambda M: M(8, 2, rotary=True)(x(), x(), x(), positions=torch.arange(5.0)), "integer tensor",
                 id="float positions"),
    pytest.param(lambda M: M(8, 2, rotary=True)(x(), x(), x(), positions=torch.arange(4)), r"\(L,\) = \(5,\)",
                 id="positions (4,) for 5 tokens"),
    pytest.param(lambda M: M(8, 2, rotary=True)(x(), x(), x(), positions=torch.zeros(3, 5, dtype=torch.long)),
                 r"\(B, L\) = \(2, 5\)", id="positions for 3 sequences of 2"),
    pytest.param(lambda M: M(8, 2, rotary=True)(x(), x(), x(), positions=torch.arange(5, device="meta")),
                 "positions is on meta", id="positions on meta"),
    pytest.param(lambda M: M(8, 2)(x(), x(), x(), positions=torch.arange(5)), "rotary=True", id="positions, no RoPE"),
    pytest.param(lambda M: M(8, 2)(x().numpy(), x(), x()), "query", id="ndarray"),
    pytest.param(lambda M: M(8, 2)(x(5, 8), x(5, 8), x(5, 8)), "query", id="2-D"),
    pytest.param(lambda M: M(8, 2)(x().double(), x().double(), x().double()), "query", id="float64"),
    pytest.param(lambda M: M(8, 2)(x().to("meta"), x(), x()), "query", id="on meta"),
    pytest.param(lambda M: M(8, 2)(x(), x(2, 4, 8), x(2, 5, 8)), "key and value", id="key/value lengths"),
    pytest.param(lambda M: M(8, 2)(x(), x(), x(), mask=[[True]]), "mask", id="mask=list"),
    pytest.param(lambda M: M(8, 2)(x(), x(), x(), mask=torch.ones(5, 5, dtype=torch.long)), "mask", id="int mask"),
    pytest.param(lambda M: M(8, 2)(x(), x(), x(), mask=torch.ones(2, 5, dtype=torch.bool)), "mask",
                 id="(B, Lk) mask"),
    pytest.param(lambda M: M(8, 2)(x(), x(), x(), mask=torch.zeros(5, 5).fill_diagonal_(float("inf"))), r"\+inf",
                 id="+inf mask"),
    pytest.param(lambda M: M(8, 2)(x(), x(), x(), cache="cache"), "cache", id="cache=str"),
    pytest.param(lambda M: (lambda a, b: M(8, 2)(a, b, b, cache=KVCache()))(x(), x()), "self-attention",
                 id="cross-attention with a cache"),
]


@pytest.mark.parametrize("module", MODULES, ids=lambda M: M.__name__)
@pytest.mark.parametrize(("call", "words"), MODULE_REFUSED)
def test_bad_module_input_is_refused(module, call, words):
    with pytest.raises(BAD, match=words):
        call(module)


# --- valid edge inputs: (call, the plain call it must equal) ---------------------------------


def _seeded(seed) -> torch.Tensor:
    seed_everything(seed)
    return torch.rand(3)


def _silenced(heads) -> torch.Tensor:
    torch.manual_seed(0)
    mha, inputs = MultiHeadAttention(8, 2), x()
    with silence_heads(mha, heads):
        return mha(inputs, inputs, inputs)


def _module(M, *args, **kw) -> torch.Tensor:
    torch.manual_seed(0)
    module = M(*args, **kw)
    torch.manual_seed(1)
    inputs = x(2, 5, 8)
    return module(inputs, inputs, inputs) if not isinstance(module, EncoderLayer) else module(inputs)


def _classifier(**kw) -> torch.Tensor:
    torch.manual_seed(0)
    return sentiment.SentimentClassifier(10, **kw)(torch.tensor([[2, 3, 4, 0]]))


def _induction(**kw) -> torch.Tensor:
    torch.manual_seed(0)
    return AttentionOnlyTransformer(10, **kw)(torch.tensor([[1, 2, 3]]))


def _figure(**kw) -> list[str]:
    """The row labels of the first panel."""
    figure = plot_attention(**{"weights": weights(), **kw})
    return [label.get_text() for label in figure.axes[0].get_yticklabels()]


def _shares(layer) -> torch.Tensor:
    torch.manual_seed(0)
    return sentiment.attention_shares(classifier(), examples(), vocab(), layer=layer)["<cls>"]


def _history(**kw) -> list[float]:
    torch.manual_seed(0)
    return train(**kw)["loss"]


N = np.int64
KEYS = torch.randn(1, 2, 3, 4)

ACCEPTED = [
    pytest.param(lambda: causal_mask(N(4)), lambda: causal_mask(4), id="causal_mask(np.int64)"),
    pytest.param(lambda: sliding_window_mask(N(4), N(2)), lambda: sliding_window_mask(4, 2),
                 id="sliding_window_mask(np.int64, np.int64)"),
    pytest.param(lambda: padding_mask(np.array([2, 3]), N(4)), lambda: padding_mask([2, 3], 4),
                 id="padding_mask(ndarray, np.int64)"),
    pytest.param(lambda: padding_mask(torch.tensor([2, 3]), torch.tensor(4)), lambda: padding_mask([2, 3], 4),
                 id="padding_mask(tensor, 0-d tensor)"),
    pytest.param(lambda: padding_mask([N(2), N(3)]), lambda: padding_mask([2, 3]), id="padding_mask([np.int64])"),
    pytest.param(lambda: split_heads(KEYS[0], N(2)), lambda: split_heads(KEYS[0], 2), id="split_heads(x, np.int64)"),
    pytest.param(lambda: repeat_kv(KEYS, N(2)), lambda: repeat_kv(KEYS, 2), id="repeat_kv(x, np.int64)"),
    pytest.param(lambda: sinusoidal_positions(N(4), N(8)), lambda: sinusoidal_positions(4, 8),
                 id="sinusoidal_positions(np.int64, np.int64)"),
    pytest.param(lambda: kv_cache_bytes(N(2), N(2), N(4), N(8)), lambda: kv_cache_bytes(2, 2, 4, 8),
                 id="kv_cache_bytes(np.int64, ...)"),
    pytest.param(lambda: _seeded(N(3)), lambda: _seeded(3), id="seed_everything(np.int64)"),
    pytest.param(lambda: _seeded(2**32 - 1), lambda: _seeded(2**32 - 1), id="seed_everything(2**32 - 1)"),
    pytest.param(lambda: _silenced([N(1)]), lambda: _silenced([1]), id="silence_heads(mha, [np.int64])"),
    pytest.param(lambda: _silenced((1,)), lambda: _silenced([1]), id="silence_heads(mha, tuple)"),
    pytest.param(lambda: _silenced(range(1, 2)), lambda: _silenced([1]), id="silence_heads(mha, range)"),
    pytest.param(lambda: _module(MultiHeadAttention, N(8), N(2), num_kv_heads=N(1)),
                 lambda: _module(MultiHeadAttention, 8, 2, num_kv_heads=1), id="MultiHeadAttention(np.int64)"),
    pytest.param(lambda: _module(EfficientMultiHeadAttention, N(8), N(2), num_kv_heads=N(1)),
                 lambda: _module(EfficientMultiHeadAttention, 8, 2, num_kv_heads=1),
                 id="EfficientMultiHeadAttention(np.int64)"),
    pytest.param(lambda: _module(MultiHeadAttention, 8, 2, rotary=np.True_),
                 lambda: _module(MultiHeadAttention, 8, 2, rotary=True), id="MultiHeadAttention(rotary=np.True_)"),
    pytest.param(lambda: _module(AttentionHead, N(8), N(4), N(2)), lambda: _module(AttentionHead, 8, 4, 2),
                 id="AttentionHead(np.int64)"),
    pytest.param(lambda: _module(AttentionHead, 8, 4, bias=np.False_), lambda: _module(AttentionHead, 8, 4, bias=False),
                 id="AttentionHead(bias=np.False_)"),
    pytest.param(lambda: _module(EncoderLayer, N(8), N(2), N(16)), lambda: _module(EncoderLayer, 8, 2, 16),
                 id="EncoderLayer(np.int64)"),
    pytest.param(lambda: _classifier(d_model=N(8), num_heads=N(2), num_layers=N(1), d_ff=N(16), max_len=N(8),
                                     pad_id=N(0), cls_id=N(2)),
                 lambda: _classifier(d_model=8, num_heads=2, num_layers=1, d_ff=16, max_len=8),
                 id="SentimentClassifier(np.int64)"),
    pytest.param(lambda: _induction(d_model=N(8), num_heads=N(2), num_layers=N(1), max_len=N(8)),
                 lambda: _induction(d_model=8, num_heads=2, num_layers=1, max_len=8),
                 id="AttentionOnlyTransformer(np.int64)"),
    pytest.param(lambda: sentiment.make_datasets(N(3), N(2), seed=N(1)), lambda: sentiment.make_datasets(3, 2, seed=1),
                 id="make_datasets(np.int64)"),
    pytest.param(lambda: sentiment.make_datasets(0, 2), lambda: ([], sentiment.make_datasets(0, 2)[1]),
                 id="make_datasets(n_train=0)"),
    pytest.param(lambda: sentiment.batch_examples(["good"], vocab(), max_len=N(4)),
                 lambda: sentiment.batch_examples(["good"], vocab(), max_len=4), id="batch_examples(max_len=np.int64)"),
    pytest.param(lambda: _history(epochs=N(1), batch_size=N(4), seed=N(0)), lambda: _history(epochs=1, batch_size=4),
                 id="train_model(np.int64)"),
    pytest.param(lambda: _shares(N(0)), lambda: _shares(0), id="attention_shares(layer=np.int64)"),
    pytest.param(lambda: _figure(query_labels=iter("abc")), lambda: _figure(query_labels=["a", "b", "c"]),
                 id="plot(labels=iterator)"),
    pytest.param(lambda: _figure(query_labels="abc"), lambda: _figure(query_labels=["a", "b", "c"]),
                 id="plot(labels=characters)"),
    pytest.param(lambda: _figure(query_labels=np.arange(3)), lambda: _figure(query_labels=["0", "1", "2"]),
                 id="plot(labels=ndarray)"),
    pytest.param(lambda: _figure(weights=causal_mask(3)), lambda: _figure(), id="plot(a bool mask)"),
    pytest.param(lambda: _figure(weights=torch.rand(3, 3, requires_grad=True).bfloat16()), lambda: _figure(),
                 id="plot(bfloat16 with grad)"),
    pytest.param(lambda: _figure(annotate=np.True_), lambda: _figure(annotate=True), id="plot(annotate=np.True_)"),
]


@pytest.mark.parametrize(("call", "plain"), ACCEPTED)
def test_valid_edge_input_is_accepted(call, plain):
    got, expected = call(), plain()
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected)
    else:
        assert got == expected


# --- self-attention with a cache: the same tensor, recognised by what it is ------------------


@pytest.mark.parametrize("module", MODULES, ids=lambda M: M.__name__)
def test_a_cache_takes_slices_of_one_tensor_as_self_attention(module):
    """``x[:, :3]`` three times is three objects but one tensor: the cached forward must accept it."""
    mha, inputs = module(8, 2).eval(), x()
    expected = mha(inputs[:, :3], inputs[:, :3], inputs[:, :3], mask=causal_mask(3))
    torch.testing.assert_close(mha(inputs[:, :3], inputs[:, :3], inputs[:, :3], cache=KVCache()), expected)


# --- NaN or inf where attention doesn't look -------------------------------------------------


def test_nan_in_a_masked_value_reaches_the_output_as_documented():
    """Documented, not guarded (scaled_dot_product_attention's docstring; PyTorch's kernels do
    the same): a blocked key's value enters ``weights @ value`` with weight 0, and 0 x NaN is NaN.
    Padding filled with zeros, as the docstring asks, is harmless."""
    q, k, v = x(1, 3, 4), x(1, 3, 4), x(1, 3, 4)
    v[0, 2] = float("nan")  # the value of a key nobody may attend to
    mask = torch.tensor([True, True, False])
    output, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert (weights[..., 2] == 0).all() and output.isnan().all()
    v[0, 2] = 0.0
    assert scaled_dot_product_attention(q, k, v, mask=mask)[0].isfinite().all()


@pytest.mark.parametrize("module", MODULES, ids=lambda M: M.__name__)
def test_finite_padding_leaves_the_real_tokens_alone(module):
    """Whatever finite values the padding holds, the real tokens' outputs don't change."""
    layer = module(8, 2).eval()
    inputs = x()
    mask = padding_mask([5, 3])
    reference = layer(inputs, inputs, inputs, mask)
    inputs[1, 3:] = 1e4 * torch.randn(2, 8)  # other padding
    output = layer(inputs, inputs, inputs, mask)
    torch.testing.assert_close(output[0], reference[0])
    torch.testing.assert_close(output[1, :3], reference[1, :3])


def test_float16_scores_that_overflow_before_scaling_stay_finite():
    """``QKᵀ`` of float16 vectors of size 40 and length 64 is 102400 > 65504; scaled, 12800 fits."""
    q = torch.full((1, 2, 64), 40.0, dtype=torch.float16)
    output, _ = scaled_dot_product_attention(q, q, q)
    assert output.isfinite().all()
