"""The generated sentiment task, its vocabulary and batches, the classifier, and the head tools."""

from __future__ import annotations

import math

import pytest
import torch

from torch import nn

import mha_lib.heads
from mha_lib import EfficientMultiHeadAttention, MultiHeadAttention, seed_everything
from mha_lib.sentiment import (
    NEGATIVE,
    POSITIVE,
    Example,
    SentimentClassifier,
    Vocab,
    attention_shares,
    batch_examples,
    evaluate,
    feed_forward_off,
    four_groups,
    make_datasets,
    predict,
    silence_heads,
    tokenize,
    train_model,
)
from mha_lib.sentiment.probes import halves_for_batch, halves_group, halves_groups


@pytest.fixture(scope="module")
def data() -> tuple[list[Example], list[Example]]:
    return make_datasets(300, 100, seed=5)


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return Vocab.for_task()


@pytest.fixture
def one_thread():
    """Train on one thread, as the chapters do (the library leaves the thread count to its caller)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small_model(vocab: Vocab, **kw) -> SentimentClassifier:
    kw = {"d_model": 16, "num_heads": 2, "d_ff": 32} | kw
    return SentimentClassifier(len(vocab), **kw)


# --- the data -------------------------------------------------------------------------------


def test_generator_is_deterministic():
    assert make_datasets(50, 20, seed=3) == make_datasets(50, 20, seed=3)
    assert make_datasets(50, 20, seed=3) != make_datasets(50, 20, seed=4)


def test_labels_follow_the_negation(data):
    for e in [*data[0], *data[1]]:
        words = set(e.tokens)
        assert len(words & set(POSITIVE + NEGATIVE)) == 1, e.text  # exactly one sentiment word
        word = e.tokens[e.sentiment_pos]
        assert word in POSITIVE + NEGATIVE, e.text
        assert e.negated == ("not" in e.tokens), e.text
        assert e.word_is_positive == (word in POSITIVE)
        assert e.label == int((word in POSITIVE) != e.negated), e.text  # "not" flips the sentiment
        if e.negated:
            assert e.tokens[e.negation_pos] == "not" and e.negation_pos < e.sentiment_pos
        else:
            assert e.negation_pos is None
        for article, following in zip(e.tokens, e.tokens[1:]):  # "an awful", "a good"
            if article in ("a", "an"):
                assert (article == "an") == (following[0] in "aeiou"), e.text


def test_held_out_sentences_are_not_in_training(data):
    train, test = data
    assert len(train) == 300 and len(test) == 100
    assert not {e.tokens for e in train} & {e.tokens for e in test}
    assert len({e.tokens for e in train}) == len(train)
    for split in data:  # both groups and both labels, roughly balanced
        share_negated = sum(e.negated for e in split) / len(split)
        share_positive = sum(e.label for e in split) / len(split)
        assert 0.3 < share_negated < 0.7 and 0.3 < share_positive < 0.7


def test_make_datasets_errors():
    with pytest.raises(ValueError, match="n_train must be a non-negative int, got -1"):
        make_datasets(-1, 10)
    with pytest.raises(ValueError, match="n_train \\+ n_test = 100001 is more than MAX_SENTENCES = 100000"):
        make_datasets(100_000, 1)


# --- tokens, ids, batches -------------------------------------------------------------------


def test_tokenizer_round_trip(data, vocab):
    assert tokenize("The movie was  NOT bad") == ["the", "movie", "was", "not", "bad"]
    for e in data[0]:
        ids = vocab.encode(e.tokens)
        assert vocab.unk_id not in ids, e.text  # every generated word is in the vocabulary
        assert vocab.decode(ids) == list(e.tokens)
    assert vocab.encode("the movie was not horrible")[-1] == vocab.unk_id
    assert vocab.itos[: 3] == ["<pad>", "<unk>", "<cls>"] and len(set(vocab.itos)) == len(vocab)
    with pytest.raises(TypeError, match="tokenize expects a string, got int"):
        tokenize(3)


def test_batches_start_with_cls_and_end_with_padding(vocab):
    sentences = ["the movie was not bad", "a good film", ["not", "a", "dull", "story"]]
    batch = batch_examples(sentences, vocab)
    assert batch.shape == (3, 6) and batch.dtype == torch.long
    assert (batch[:, 0] == vocab.cls_id).all()
    assert batch[1, 4:].tolist() == [vocab.pad_id] * 2
    assert vocab.decode(batch[1]) == ["<cls>", "a", "good", "film"]
    assert batch_examples(sentences, vocab, max_len=9).shape == (3, 9)
    with pytest.raises(ValueError, match=r"max_len=4 is too short for the longest sentence \(<cls> \+ 5 words\)"):
        batch_examples(sentences, vocab, max_len=4)
    with pytest.raises(ValueError, match="needs at least one sentence"):
        batch_examples([], vocab)


# --- the model ------------------------------------------------------------------------------


@pytest.mark.parametrize("num_layers", [1, 2])
def test_model_shapes(num_layers, vocab, data, device):
    model = small_model(vocab, num_layers=num_layers, num_heads=4).to(device)
    tokens = batch_examples(data[0][:5], vocab).to(device)
    logits, weights = model(tokens, return_weights=True)
    B, L = tokens.shape
    assert logits.shape == (5, 2) and len(weights) == num_layers
    assert all(w.shape == (B, 4, L, L) for w in weights)
    assert model(tokens).shape == (5, 2)


def test_padding_does_not_change_the_prediction(vocab, device):
    model = small_model(vocab).to(device, torch.float64).eval()
    short, long = "not a bad film", "i did not find the long plot very boring in the end"
    alone = model(batch_examples([short], vocab).to(device))
    padded, weights = model(batch_examples([short, long], vocab, max_len=16).to(device), return_weights=True)
    torch.testing.assert_close(padded[0], alone[0], atol=1e-10, rtol=1e-9)
    assert (weights[0][0, :, :, 5:] == 0).all()  # nobody attends to the padding


def test_extra_mask_is_combined_with_padding(vocab, device):
    """Chapter 12's per-head mask: (H, L, L), True = may attend."""
    model = small_model(vocab).to(device)
    tokens = batch_examples(["the movie was not bad", "a good film"], vocab).to(device)  # L = 6
    mask = torch.zeros(2, 6, 6, dtype=torch.bool, device=device)
    mask[0, :, :3] = True  # head 0: the first half
    mask[1, :, 3:] = True  # head 1: the second half
    _, (w,) = model(tokens, mask=mask, return_weights=True)
    assert (w[:, 0, :, 3:] == 0).all() and (w[:, 1, :, :3] == 0).all()
    assert (w[1, 1, :, 4:] == 0).all()  # sentence 2 has 4 real tokens: head 1 only sees position 3
    torch.testing.assert_close(w[1, 1, :, 3], torch.ones(6, device=device))


def test_mask_may_be_a_function_of_the_batch(vocab, data):
    """predict, evaluate and train_model accept mask=fn(tokens) (chapter 12's per-sentence halves)."""
    model = small_model(vocab)
    calls = []

    def first_key_only(tokens):
        calls.append(tuple(tokens.shape))
        mask = torch.zeros(tokens.size(1), tokens.size(1), dtype=torch.bool)
        mask[:, 0] = True
        return mask

    sentences = data[1][:20]
    fixed = first_key_only(batch_examples(sentences, vocab))
    torch.testing.assert_close(predict(model, sentences, vocab, mask=first_key_only),
                               predict(model, sentences, vocab, mask=fixed))
    calls.clear()
    train_model(model, data[0][:64], vocab, test=sentences, epochs=1, batch_size=32, mask=first_key_only, reports=0)
    assert len(calls) == 3  # two training batches and one held-out evaluation


def test_model_errors(vocab):
    model = small_model(vocab, max_len=8)
    with pytest.raises(ValueError, match=r"tokens must be a \(B, L\) tensor of token ids, got shape \(5,\)"):
        model(torch.tensor([2, 3, 4, 5, 6]))
    with pytest.raises(ValueError, match="got list"):
        model([[2, 3]])
    with pytest.raises(ValueError, match=r"integer token ids \(torch.long\), got dtype torch.float32"):
        model(torch.tensor([[2.0, 5.0, 6.0]]))
    with pytest.raises(ValueError, match=r"tokens of shape \(3, 0\) hold no token: every row needs at least <cls>"):
        model(torch.zeros(3, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=rf"token ids must lie in \[0, {len(vocab)}\).*from 2 to {len(vocab)}"):
        model(torch.tensor([[2, len(vocab)]]))
    with pytest.raises(ValueError, match=r"from -1 to 5"):
        model(torch.tensor([[2, -1, 5]]))
    with pytest.raises(ValueError, match="must start with <cls> \\(id 2\\); use batch_examples"):
        model(torch.tensor([[5, 6, 7]]))
    with pytest.raises(ValueError, match="inputs of 9 tokens are longer than max_len=8"):
        model(torch.full((1, 9), 2))
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        model(torch.tensor([[2, 5, 6]]), mask=torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 4, 4\) does not broadcast .* \(1, 2, 3, 3\)"):
        model(torch.tensor([[2, 5, 6]]), mask=torch.ones(3, 4, 4, dtype=torch.bool))


# --- training and evaluation ----------------------------------------------------------------


def test_short_training_beats_chance(vocab, capsys, one_thread):
    train, test = make_datasets(2000, 300, seed=1)
    seed_everything(0)
    model = small_model(vocab, d_model=48, d_ff=96)
    history = train_model(model, train, vocab, test=test, epochs=3, seed=0, reports=2)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[-1].startswith("epoch  3/3  loss")
    assert history["loss"][-1] < history["loss"][0] - 0.2
    accuracy = evaluate(model, test, vocab)
    assert accuracy["all"] >= 0.65, accuracy  # chance is 0.5 (+- 0.03 on 300 sentences)
    assert history["test_plain"][-1] == pytest.approx(accuracy["plain"])
    assert not model.training


def test_evaluate_splits_the_groups(vocab, data):
    model = small_model(vocab)
    negated = [e for e in data[1] if e.negated]
    accuracy = evaluate(model, negated, vocab)
    assert math.isnan(accuracy["plain"]) and accuracy["negated"] == accuracy["all"]
    labels = torch.tensor([e.label for e in negated])
    assert accuracy["all"] == pytest.approx((predict(model, negated, vocab) == labels).float().mean().item())
    with pytest.raises(ValueError, match="needs at least one example"):
        evaluate(model, [], vocab)


# --- silencing heads and measuring attention ------------------------------------------------


def test_silence_heads_zeroes_exactly_that_heads_slice(vocab, device):
    torch.manual_seed(0)
    model = small_model(vocab).to(device, torch.float64).eval()
    attn = model.layers[0].self_attn
    tokens = batch_examples(["the movie was not bad", "a good film"], vocab).to(device)

    captured = []

    def capture(module, args):  # registered after silence_heads' hook, it sees what W_o gets
        captured.append(args[0])

    with silence_heads(attn, [1]):
        hook = attn.W_o.register_forward_pre_hook(capture)
        silenced = model(tokens)
    model(tokens)
    hook.remove()
    concat_silenced, concat = captured  # (B, L, H * d_k): the heads side by side, as W_o gets them
    d_k = attn.d_k
    torch.testing.assert_close(concat_silenced[..., :d_k], concat[..., :d_k], atol=0, rtol=0)
    assert (concat_silenced[..., d_k:] == 0).all() and (concat[..., d_k:] != 0).any()

    assert not torch.allclose(silenced, model(tokens))
    assert not attn.W_o._forward_pre_hooks  # the hook is gone after the block
    with silence_heads(attn, [0, 1]):  # all heads silent: attention adds only W_o's bias
        all_silent = model(tokens)
    with torch.no_grad():
        attn.W_o.weight.zero_()
    torch.testing.assert_close(all_silent, model(tokens))


def test_silence_heads_errors(vocab):
    attn = small_model(vocab).layers[0].self_attn
    with pytest.raises(ValueError, match=r"heads must be ints in \[0, 2\), got \[2\]"):
        with silence_heads(attn, [0, 2]):
            pass


def test_attention_shares(vocab, data):
    torch.manual_seed(0)
    model = small_model(vocab, num_heads=4)
    negated = [e for e in data[1] if e.negated]
    plain = [e for e in data[1] if not e.negated]
    shares = attention_shares(model, negated, vocab)
    assert list(shares) == ["<cls>", "not", "sentiment word", "other words"]
    total = sum(shares.values())
    torch.testing.assert_close(total, torch.ones(4))
    assert all(((s >= 0) & (s <= 1)).all() for s in shares.values())
    assert (attention_shares(model, plain, vocab)["not"] == 0).all()

    # Check one number by hand: head 2's attention from "not" to the sentiment word.
    e = negated[0]
    _, (w,) = model(batch_examples([e], vocab), return_weights=True)
    by_hand = w[0, 2, e.negation_pos + 1, e.sentiment_pos + 1]
    one = attention_shares(model, [e], vocab, query="not")["sentiment word"][2]
    torch.testing.assert_close(one, by_hand.detach())

    with pytest.raises(ValueError, match='query="not" needs negated examples only'):
        attention_shares(model, plain, vocab, query="not")
    with pytest.raises(ValueError, match="query must be one of"):
        attention_shares(model, plain, vocab, query="bad")


def test_silence_heads_lives_next_to_the_heads_code():
    import mha_lib.sentiment

    assert mha_lib.sentiment.silence_heads is mha_lib.heads.silence_heads


def test_silence_heads_works_for_the_efficient_module():
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 3).double().eval()
    fast = EfficientMultiHeadAttention.from_module(mha).eval()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    for heads in ([1], [0, 2]):
        with silence_heads(mha, heads), silence_heads(fast, heads):
            torch.testing.assert_close(fast(x, x, x), mha(x, x, x))
    with pytest.raises(TypeError, match="silence_heads needs a multi-head module .* got Linear"):
        with silence_heads(nn.Linear(4, 4), [0]):
            pass


def test_no_library_call_changes_the_thread_count(vocab, data, monkeypatch):
    """Training and probing run on the caller's threads: the library never sets them."""
    threads = torch.get_num_threads()

    def refuse(n):
        raise AssertionError(f"a library call set the number of threads to {n}")

    monkeypatch.setattr(torch, "set_num_threads", refuse)
    model = small_model(vocab)
    train_model(model, data[0][:64], vocab, test=data[1][:20], epochs=1, reports=0)
    predict(model, data[1][:20], vocab)
    evaluate(model, data[1][:20], vocab)
    attention_shares(model, data[1][:20], vocab)
    assert torch.get_num_threads() == threads


def test_probes_restore_the_training_mode(vocab, data):
    model = small_model(vocab).train()
    predict(model, data[1][:5], vocab)
    attention_shares(model, data[1][:5], vocab)
    assert model.training
    with pytest.raises(ValueError):  # an error inside does not leave the model in eval mode either
        predict(model, data[1][:5], vocab, mask=torch.ones(3, 3, dtype=torch.bool))
    assert model.training


def test_feed_forward_off_leaves_attention_only(vocab, device):
    torch.manual_seed(0)
    model = small_model(vocab).to(device, torch.float64).eval()
    tokens = batch_examples(["the movie was not bad", "a good film"], vocab).to(device)
    layer = model.layers[0]

    def without_feed_forward():  # the model's forward pass with the feed-forward sublayer left out
        x = model.token_embedding(tokens) + model.position_embedding(torch.arange(tokens.size(1), device=device))
        h = layer.norm1(x)
        x = x + layer.self_attn(h, h, h, mask=(tokens != vocab.pad_id)[:, None, None, :])
        return model.classifier(model.norm(x[:, 0]))

    with torch.no_grad(), feed_forward_off(model):
        off = model(tokens)
    torch.testing.assert_close(off, without_feed_forward())
    assert not torch.allclose(model(tokens), off)  # back on after the block
    assert not layer.feed_forward._forward_hooks
    with pytest.raises(TypeError, match="feed_forward_off needs a model whose .layers have a feed_forward"):
        with feed_forward_off(nn.Linear(3, 3)):
            pass


def test_four_groups(data):
    groups = four_groups(data[1])
    assert list(groups) == ["plain+", "plain-", "negated+", "negated-"]
    assert sum(map(len, groups.values())) == len(data[1])
    for name, examples in groups.items():
        assert all(e.negated == name.startswith("negated") for e in examples)
        assert all(e.word_is_positive == name.endswith("+") for e in examples)
        assert {e.label for e in examples} == {int(name in ("plain+", "negated-"))}


def test_halves_groups_and_mask(vocab):
    """Each sentence is cut by its own length, <cls> included: head 0 gets [0, n // 2)."""
    not_bad = Example(("the", "movie", "was", "not", "bad"), 1, True, 4, 3)  # n = 6: head 0 <cls> the movie
    not_a_good_film = Example(("not", "a", "good", "film"), 0, True, 2, 0)  # n = 5: head 0 <cls> not
    plain = Example(("a", "good", "film"), 1, False, 1, None)
    assert halves_group(not_bad) == "same half"  # "not" (4) and "bad" (5) both in [3, 6)
    assert halves_group(not_a_good_film) == "different halves"  # "not" (1) < 2 <= "good" (3)
    assert halves_group(plain) == "plain"
    assert halves_groups([plain, not_bad, not_a_good_film]) == {
        "plain": [0], "same half": [1], "different halves": [2]}

    tokens = batch_examples([not_bad, not_a_good_film, plain], vocab)  # (3, 6)
    mask = halves_for_batch(tokens)
    assert mask.shape == (3, 2, 6, 6) and mask.dtype == torch.bool
    first = mask[:, 0, 0]  # (B, L): head 0's keys, the same for every query
    assert first.tolist() == [[True] * 3 + [False] * 3, [True] * 2 + [False] * 4, [True] * 2 + [False] * 4]
    assert torch.equal(mask[:, 1], ~mask[:, 0]) and (mask == mask[:, :, :1]).all()
    with pytest.raises(ValueError, match=r"tokens must be a \(B, L\) tensor"):
        halves_for_batch(tokens[0])
