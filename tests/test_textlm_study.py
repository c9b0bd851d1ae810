"""Chapter 09's study machinery: token classes, mean ablation, the in-context learning score, one run."""

from __future__ import annotations

import pytest
import torch

from mha_lib.textlm import ModelConfig, TextTransformer, Tokenizer
from mha_lib.textlm.ablation import (CLASSES, ablation_losses, class_losses, head_means, mean_ablated,
                                     token_classes)
from mha_lib.textlm.study import icl_score

TEXT = ("def test_add(self):\n    self.assertEqual(add(1, 2), 3)\n\n"
        "def test_sub(self):\n    self.assertEqual(sub(3, 2), 1)\n") * 5


def _classes_of(tok: Tokenizer, text: str) -> list[tuple[str, str]]:
    ids = torch.tensor([tok.encode(text)])
    classes = token_classes(tok, ids[:, :-1], ids[:, 1:])
    return list(zip(tok.tokens(ids[0, 1:].tolist()), [CLASSES[c] for c in classes[0].tolist()]))


def test_token_classes_name_what_the_target_is() -> None:
    tok = Tokenizer.train(TEXT, 60)
    pairs = _classes_of(tok, "    self.assertEqual(add(1, 2), 3)\n")
    names = dict(pairs)
    assert names["\n"] == "newline"
    assert names["."] == "punctuation" and names[","] == "punctuation"
    assert names[" self"] == "word start" if " self" in names else names["self"] == "word start"
    # the pieces of a word after its first are word pieces, whatever the merges made of it
    word = _classes_of(tok, "(subadd)")[:-1]  # a word never seen whole: made of pieces
    assert "".join(t for t, _ in word) == "subadd" and len(word) > 1
    assert word[0][1] == "word start" and all(c == "word piece" for _, c in word[1:])
    spaces = _classes_of(tok, "a\n    b")
    assert ("    ", "indent") in spaces or any(c == "indent" for t, c in spaces if t.strip() == "")


def test_token_classes_refuse_mismatched_shapes() -> None:
    tok = Tokenizer.train(TEXT, 40)
    with pytest.raises(ValueError, match="inputs and targets"):
        token_classes(tok, torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))


def _model(seed: int = 0) -> TextTransformer:
    torch.manual_seed(seed)
    return TextTransformer(ModelConfig(vocab_size=30, d_model=16, num_heads=4, num_layers=2, max_len=12)).eval()


def test_mean_ablation_replaces_one_head_by_its_mean_and_nothing_else() -> None:
    model = _model()
    x = torch.randint(30, (6, 12), generator=torch.Generator().manual_seed(1))
    means = head_means(model, x)
    assert len(means) == 2 and means[0].shape == (16,)
    seen = []
    hook = model.blocks[1].attn.W_o.register_forward_hook(lambda m, a, o: seen.append(a[0].clone()))
    try:
        clean = model(x)
        with mean_ablated(model, [(1, 2)], means):
            ablated = model(x)
    finally:
        hook.remove()
    before, after = seen
    assert torch.equal(after[..., :8], before[..., :8]) and torch.equal(after[..., 12:], before[..., 12:])
    assert torch.allclose(after[..., 8:12], means[1][8:12].expand(6, 12, 4))
    assert not torch.allclose(clean, ablated)
    assert torch.equal(model(x), clean)  # the hook is gone after the with
    with pytest.raises(ValueError, match=r"no head \(2, 0\)"):
        with mean_ablated(model, [(2, 0)], means):
            pass


def test_ablation_losses_are_the_loss_increase_per_class() -> None:
    model = _model()
    g = torch.Generator().manual_seed(2)
    x, y = torch.randint(30, (8, 12), generator=g), torch.randint(30, (8, 12), generator=g)
    classes = torch.randint(len(CLASSES) - 1, (8, 12), generator=g)  # the last class never occurs
    out = ablation_losses(model, x, y, classes)
    assert out["clean"].shape == (len(CLASSES),) and out["increase"].shape == (2, 4, len(CLASSES))
    assert torch.isnan(out["clean"][-1]) and torch.isnan(out["increase"][..., -1]).all()
    means = head_means(model, x)
    with mean_ablated(model, [(0, 3)], means):
        by_hand = class_losses(model, x, y, classes)
    torch.testing.assert_close(out["increase"][0, 3, :-1], (by_hand - out["clean"])[:-1])
    assert (out["increase"][..., :-1].abs() > 0).any()


def test_icl_score_is_late_minus_early_loss() -> None:
    losses = torch.cat([torch.full((16,), 3.0), torch.full((16,), 2.0), torch.full((32,), 1.0)])
    assert icl_score(losses) == pytest.approx(1.0 - 3.0)
    assert icl_score(torch.ones(64)) == 0.0
    with pytest.raises(ValueError, match="at least 8"):
        icl_score(torch.ones(4))


def test_one_run_records_every_evaluation_and_saves_its_model(tmp_path) -> None:
    from mha_lib.textlm import load_checkpoint
    from mha_lib.textlm.study import run_seed

    record = run_seed(3, model_config={"d_model": 16, "max_len": 16}, train_config={"steps": 4, "eval_every": 2},
                      checkpoint=tmp_path / "m.pt")
    assert record["seed"] == 3 and record["data_seed"] == 1003 and record["steps"] == [0, 2, 4]
    assert len(record["probes"]) == 3 and set(record["probes"][0]) == {"scores", "icl", "first_copy", "second_copy"}
    increase = torch.tensor(record["ablation"]["increase"])
    assert increase.shape == (2, 4, len(CLASSES)) and sum(record["ablation"]["class_share"]) == pytest.approx(1, abs=1e-3)
    _, _, info = load_checkpoint(tmp_path / "m.pt")
    assert info["history"]["val_loss"] == record["val_loss"] and info["train"]["seed"] == 1003


def test_the_study_can_keep_every_run_s_model(tmp_path) -> None:
    from mha_lib.textlm import load_checkpoint
    from mha_lib.textlm.study import run_study

    runs = run_study([0, 1], workers=1, train_config={"steps": 2, "eval_every": 2}, checkpoint=tmp_path / "first.pt",
                     checkpoint_dir=tmp_path / "all")
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == ["model_seed0.pt", "model_seed1.pt"]
    assert (tmp_path / "first.pt").read_bytes() == (tmp_path / "all" / "model_seed0.pt").read_bytes()
    for run in runs:
        _, _, info = load_checkpoint(tmp_path / "all" / f"model_seed{run['seed']}.pt")
        assert info["history"]["val_loss"] == run["val_loss"] and info["train"]["seed"] == run["data_seed"]
