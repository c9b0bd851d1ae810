"""Chapter 09's language model: the tokenizer, the model, training, the scores and the checkpoint."""

from __future__ import annotations

import math

import pytest
import torch

from mha_lib.heads import silence_heads
from mha_lib.textlm import (ModelConfig, TextTransformer, Tokenizer, TrainConfig, batches, load_checkpoint,
                            save_checkpoint, split_words, train_lm)
from mha_lib.textlm.corpus import load_text
from mha_lib.textlm.scores import (LOCAL_WINDOW, delimiter_keys, first_token_score, key_class_score, local_score,
                                   uniform_first_token_score, uniform_key_class_score, uniform_local_score)

TEXT = ("def test_add(self):\n    self.assertEqual(add(1, 2), 3)\n\n"
        "def test_sub(self):\n    self.assertEqual(sub(3, 2), 1)\n") * 5


def test_split_words_covers_the_text_and_keeps_words_whole() -> None:
    words = split_words(TEXT)
    assert "".join(words) == TEXT
    assert "def" in words and " test_add" in words and "(self):" not in words
    with pytest.raises(ValueError, match="tab"):
        split_words("a\tb")


def test_split_words_attaches_one_space_to_a_word() -> None:
    assert split_words("x = self.y\n") == ["x", " =", " self", ".", "y", "\n"]


def test_the_tokenizer_round_trips_and_merges_what_is_frequent() -> None:
    tok = Tokenizer.train(TEXT, 45)
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert len(tok) == 45 and len(ids) < 0.6 * len(TEXT)  # merges shorten the text
    assert Tokenizer.train(TEXT, 45).vocab == tok.vocab  # deterministic
    every = Tokenizer.train(TEXT, 10_000)
    assert len(every) < 10_000  # stops when no pair occurs twice
    assert "assertEqual" in every.vocab and "(self" not in every.vocab  # a word is merged, never across words
    with pytest.raises(ValueError, match="no token for"):
        tok.encode("Z")
    with pytest.raises(ValueError, match="at least the"):
        Tokenizer.train(TEXT, 3)


def test_the_tokenizer_saves_and_loads(tmp_path) -> None:
    tok = Tokenizer.train(TEXT, 50)
    tok.save(tmp_path / "t.json")
    again = Tokenizer.load(tmp_path / "t.json")
    assert again.vocab == tok.vocab and again.encode(TEXT) == tok.encode(TEXT)


def test_the_shipped_corpus_is_ascii_text_of_test_files() -> None:
    text = load_text()
    assert 800_000 < len(text) < 1_100_000
    assert set(text) <= {"\n", *map(chr, range(32, 127))}
    assert text.count("import unittest") >= 50


def _model(**kw) -> TextTransformer:
    torch.manual_seed(0)
    return TextTransformer(ModelConfig(**{"vocab_size": 30, "d_model": 16, "num_heads": 2, "max_len": 12, **kw})).eval()


@pytest.mark.parametrize("kw", [{}, {"mlp": False}, {"positions": "learned"}])
def test_the_model_is_causal_and_returns_one_map_per_layer(kw) -> None:
    model = _model(**kw)
    x = torch.randint(30, (3, 12))
    logits, weights = model(x, return_weights=True)
    assert logits.shape == (3, 12, 30) and len(weights) == 2 and weights[0].shape == (3, 2, 12, 12)
    torch.testing.assert_close(weights[1].sum(-1), torch.ones(3, 2, 12))
    assert torch.all(weights[0].triu(1) == 0)
    y = x.clone()
    y[:, 7] = (y[:, 7] + 1) % 30
    torch.testing.assert_close(model(y)[:, :7], logits[:, :7])  # earlier positions never see token 7
    assert not torch.allclose(model(y)[:, 7:], logits[:, 7:])


def test_silencing_a_head_changes_the_output() -> None:
    model = _model()
    x = torch.randint(30, (2, 12))
    before = model(x)
    with silence_heads(model.blocks[0].attn, [1]):
        during = model(x)
    assert not torch.allclose(before, during)
    torch.testing.assert_close(model(x), before)


def test_bad_tokens_are_refused_with_what_was_wrong() -> None:
    model = _model()
    with pytest.raises(ValueError, match="max_len=12"):
        model(torch.zeros(1, 13, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 30\)"):
        model(torch.full((1, 3), 30))
    with pytest.raises(ValueError, match="torch.long"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="positions"):
        TextTransformer(ModelConfig(vocab_size=5, d_model=8, num_heads=2, positions="sinusoidal"))


def test_generate_appends_tokens_and_greedy_is_deterministic() -> None:
    model = _model()
    x = torch.randint(30, (1, 5))
    a, b = model.generate(x, 10, temperature=0), model.generate(x, 10, temperature=0)
    assert a.shape == (1, 15) and torch.equal(a, b) and torch.equal(a[:, :5], x)


def test_training_beats_the_uniform_baseline_and_leaves_eval_mode() -> None:
    tok = Tokenizer.train(TEXT, 40)
    ids = torch.tensor(tok.encode(TEXT))
    model = TextTransformer(ModelConfig(vocab_size=len(tok), d_model=32, num_heads=2, max_len=16))
    inputs, targets = batches(ids, 8, 16, torch.Generator().manual_seed(1))
    history = train_lm(model, ids, inputs, targets, TrainConfig(steps=60, batch_size=8, warmup=5, eval_every=20),
                       progress=False)
    assert history["step"] == [0, 20, 40, 60] and not model.training
    assert history["val_loss"][-1] < 0.5 * math.log(len(tok))  # far below uniform guessing, ln V


def test_scores_of_uniform_attention_equal_their_baselines() -> None:
    L = 10
    uniform = torch.tril(torch.ones(L, L)) / torch.arange(1, L + 1)[:, None]
    weights = uniform.expand(2, 3, L, L)
    is_class = torch.rand(2, L, generator=torch.Generator().manual_seed(0)) < 0.3
    assert torch.allclose(first_token_score(weights), torch.full((3,), uniform_first_token_score(L)))
    assert torch.allclose(key_class_score(weights, is_class), torch.full((3,), uniform_key_class_score(is_class)),
                          atol=1e-6)
    assert torch.allclose(local_score(weights), torch.full((3,), uniform_local_score(L)))
    sink = torch.zeros(1, 1, L, L)
    sink[..., 0] = 1.0
    assert first_token_score(sink).item() == 1.0


def test_the_local_score_is_the_weight_on_the_last_four_keys_of_the_queries_that_see_more() -> None:
    B, H, L = 2, 3, 12
    logits = torch.randn(B, H, L, L, generator=torch.Generator().manual_seed(1))
    weights = logits.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    by_hand = torch.zeros(H)
    for h in range(H):
        per_query = [weights[b, h, t, t - LOCAL_WINDOW + 1 : t + 1].sum() for b in range(B) for t in range(LOCAL_WINDOW, L)]
        by_hand[h] = torch.stack(per_query).mean()
    torch.testing.assert_close(local_score(weights), by_hand)
    assert math.isclose(uniform_local_score(L), sum(4 / (t + 1) for t in range(4, L)) / (L - 4))
    for back, expected in ((0, 1.0), (3, 1.0), (4, 0.0)):  # a head that looks `back` tokens back
        one_hot = torch.zeros(1, 1, L, L)
        t = torch.arange(L)
        one_hot[0, 0, t, (t - back).clamp(min=0)] = 1.0
        assert local_score(one_hot).item() == expected, back
    with pytest.raises(ValueError, match="longer than its window"):
        local_score(torch.ones(1, 1, 4, 4) / 4)
    with pytest.raises(ValueError, match="longer than its window"):
        uniform_local_score(4)
    with pytest.raises(ValueError, match="window"):
        local_score(weights, window=0)
    with pytest.raises(ValueError, match=r"\(B, H, L, L\)"):
        local_score(weights[0])


def test_delimiter_keys_mark_quotes_indentation_and_punctuation() -> None:
    text = "x = 'a'\n    y = \"b\"\n" * 10
    tok = Tokenizer.train(text, 40)
    ids = torch.tensor([tok.encode(text)[:12]])
    keys = delimiter_keys(tok, ids)
    assert set(keys) == {"quote", "indent", "punctuation"}
    pieces = tok.tokens(ids[0].tolist())
    assert keys["quote"][0].tolist() == [("'" in p or '"' in p) for p in pieces]
    assert keys["indent"][0].tolist() == [p.strip(" ") == "" and "\n" not in p for p in pieces]
    assert any(keys["quote"][0]) and any(keys["indent"][0]) and any(keys["punctuation"][0])


def test_a_checkpoint_round_trips(tmp_path) -> None:
    tok = Tokenizer.train(TEXT, 40)
    model = TextTransformer(ModelConfig(vocab_size=len(tok), d_model=16, num_heads=2, max_len=12)).eval()
    path = save_checkpoint(tmp_path / "m.pt", model, tok, TrainConfig(steps=1), {"val_loss": [1.0]})
    again, tok2, info = load_checkpoint(path)
    x = torch.randint(len(tok), (2, 12))
    torch.testing.assert_close(again(x), model(x))
    assert tok2.vocab == tok.vocab and info["history"] == {"val_loss": [1.0]}
    with pytest.raises(FileNotFoundError, match="textlm train"):
        load_checkpoint(tmp_path / "missing.pt")


def test_head_scores_of_an_untrained_model_stay_near_uniform_and_find_no_role() -> None:
    from mha_lib.textlm import head_scores, repeat_batch, roles

    model = _model(max_len=40)
    text = torch.randint(30, (8, 40), generator=torch.Generator().manual_seed(2))
    scores = head_scores(model, text, newline_id=3, repeats=repeat_batch(30, 40, batch_size=16))
    assert set(scores) == {"previous", "self", "local", "first", "newline", "induction", "duplicate", "uniform"}
    assert len(scores["previous"]) == 2 and len(scores["previous"][0]) == 2
    for role in ("previous", "self", "local", "first", "induction"):  # small random weights: close to uniform attention
        for row in scores[role]:
            assert all(abs(s - scores["uniform"][role]) < 0.05 for s in row), (role, row, scores["uniform"][role])
    assert all(found == [] for found in roles(scores).values())
    quotes = text % 7 == 0  # more roles scored like newline, each against its own baseline
    more = head_scores(model, text, newline_id=3, repeats=repeat_batch(30, 40, batch_size=16),
                       delimiters={"quote": quotes})
    assert set(more) == set(scores) | {"quote"} and more["previous"] == scores["previous"]
    assert more["uniform"]["quote"] == pytest.approx(uniform_key_class_score(quotes))
    with pytest.raises(ValueError, match=r"delimiters\['quote'\] must be a bool tensor shaped like text_ids"):
        head_scores(model, text, newline_id=3, repeats=repeat_batch(30, 40, batch_size=16),
                    delimiters={"quote": quotes[:, :5]})


def test_the_train_command_saves_a_model_that_samples(tmp_path, capsys) -> None:
    from mha_lib.textlm.__main__ import main

    assert main(["train", "--steps", "2", "--output", str(tmp_path / "m.pt"), "--threads", "1"]) == 0
    assert "saved" in capsys.readouterr().out
    assert main(["sample", "    def test_", "--tokens", "5", "--model", str(tmp_path / "m.pt")]) == 0
    assert capsys.readouterr().out.startswith("    def test_")


def test_lace_repeats_copies_a_span_into_the_window_and_keeps_targets_one_ahead() -> None:
    from mha_lib.textlm.train import lace_repeats

    ids = torch.arange(10_000)  # every token different: any repeat in a window was laced in
    inputs, targets = batches(ids, 16, 64, torch.Generator().manual_seed(0))
    before = inputs.clone(), targets.clone()
    laced, next_tokens = lace_repeats(inputs, targets, 1.0, torch.Generator().manual_seed(1))
    assert torch.equal(inputs, before[0]) and torch.equal(targets, before[1])  # the arguments are left alone
    assert torch.equal(laced[:, 1:], next_tokens[:, :-1])  # still the next token
    for row in torch.cat([laced, next_tokens[:, -1:]], dim=1).tolist():
        repeated = len(row) - len(set(row))
        assert 64 // 8 <= repeated <= 64 // 4, row  # one span of L/8 to L/4 tokens, copied once
        first = next(i for i, t in enumerate(row) if row.count(t) > 1)
        assert first < 64 // 2  # copied from the first half
    untouched, _ = lace_repeats(inputs, targets, 0.0, torch.Generator().manual_seed(1))
    assert torch.equal(untouched, inputs)
    with pytest.raises(ValueError, match="share must be between 0 and 1"):
        lace_repeats(inputs, targets, 1.5, torch.Generator())
    with pytest.raises(ValueError, match="at least 16 tokens"):
        lace_repeats(inputs[:, :8], targets[:, :8], 0.5, torch.Generator())


def test_training_with_repeats_laced_in_differs_and_without_them_is_unchanged() -> None:
    torch.manual_seed(0)
    ids = torch.randint(0, 20, (3_000,))
    val = ids[:8 * 33].view(8, 33)
    losses = {}
    for repeat in (0.0, 0.5):
        torch.manual_seed(0)
        model = TextTransformer(ModelConfig(vocab_size=20, d_model=16, num_heads=2, num_layers=1, max_len=32))
        history = train_lm(model, ids, val[:, :-1], val[:, 1:],
                           TrainConfig(steps=6, batch_size=4, warmup=1, eval_every=3, repeat=repeat), progress=False)
        losses[repeat] = history["train_loss"][-1]
    assert losses[0.0] != losses[0.5]  # the laced windows are other data
    assert TrainConfig().repeat == 0.0  # the shipped configuration trains on the text as it is


def test_the_configurations_command_names_an_unknown_configuration() -> None:
    from mha_lib.textlm.__main__ import main
    from mha_lib.textlm.configurations import CONFIGURATIONS, run_configurations

    with pytest.raises(SystemExit, match=r"unknown configurations \['context 16'\]; the known ones are"):
        main(["configurations", "--only", "context 16"])
    with pytest.raises(ValueError, match="attention only"):  # the message lists the known ones
        run_configurations(["nope"])
    assert all(set(model) <= {"mlp", "max_len", "d_model", "num_heads", "num_layers", "positions"}
               and set(train) <= {"steps", "batch_size", "lr", "warmup", "weight_decay", "final_lr", "repeat"}
               for model, train in CONFIGURATIONS.values())  # each entry changes what run_seed can change
