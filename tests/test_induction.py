"""mha_lib.induction: the repeated-segment task, the attention-only model, the scores (chapter 08)."""

from __future__ import annotations

import math

import pytest
import torch

from mha_lib.heads import silence_heads
from mha_lib.induction import (
    AttentionOnlyTransformer,
    RepeatBatch,
    check_task,
    duplicate_token_score,
    induction_score,
    losses,
    phase_change_step,
    previous_token_score,
    repeated_segments,
    self_score,
    train_induction,
    uniform_induction_score,
    uniform_previous_token_score,
)


def batch(n: int = 256, seed: int = 0, **kwargs) -> RepeatBatch:
    return repeated_segments(n, generator=torch.Generator().manual_seed(seed), **kwargs)


def test_batch_shapes_and_types():
    b = batch(16, seq_len=24, vocab_size=10, segment=(3, 5))
    assert b.tokens.shape == b.predictable.shape == (16, 24)
    assert b.tokens.dtype == torch.long and b.predictable.dtype == torch.bool
    assert b.first.shape == b.second.shape == b.length.shape == (16,)
    assert 0 <= b.tokens.min() and b.tokens.max() < 10
    assert len(b) == 16 and b.to("cpu").tokens.equal(b.tokens)


def test_the_copy_is_a_copy_at_the_stated_offsets_without_overlap():
    b = batch(512, seq_len=32, segment=(6, 10))
    assert ((b.length >= 6) & (b.length <= 10)).all()
    assert (b.first >= 0).all() and (b.second >= b.first + b.length).all() and (b.second + b.length <= 32).all()
    for row in range(len(b)):
        f, s, n = b.first[row].item(), b.second[row].item(), b.length[row].item()
        assert b.tokens[row, s : s + n].equal(b.tokens[row, f : f + n])
    offsets = b.second - b.first
    assert len(offsets.unique()) > 10 and len(b.length.unique()) == 5  # the offset varies


def test_same_seed_same_batch_other_seed_other_batch():
    assert batch(8, seed=1).tokens.equal(batch(8, seed=1).tokens)
    assert not batch(8, seed=1).tokens.equal(batch(8, seed=2).tokens)


def test_predictable_mask_by_hand():
    b = batch(64, seq_len=16, segment=(3, 5))
    for row in range(len(b)):
        s, n = b.second[row].item(), b.length[row].item()
        expected = torch.zeros(16, dtype=torch.bool)
        expected[s + 1 : s + n] = True  # the second copy without its first token
        assert b.predictable[row].equal(expected)
    assert b.predictable.sum().item() == (b.length - 1).sum().item()


def test_segment_of_exactly_half_the_sequence_fills_it():
    b = batch(4, seq_len=8, segment=(4, 4))
    assert (b.first == 0).all() and (b.second == 4).all()
    assert b.tokens[:, :4].equal(b.tokens[:, 4:])


@pytest.mark.parametrize("args, words", [
    ((32, 64, (6, 17)), "seq_len // 2 = 16"),
    ((32, 1, (6, 10)), "vocab_size must be at least 2"),
    ((32, 64, (10, 6)), "shortest length is more than the longest"),
    ((32, 64, (1, 4)), "at least 2 tokens"),
    ((32.0, 64, (6, 10)), "seq_len must be a positive int"),
    ((32, 64, (6, 10.5)), "segment[1]"),
    ((32, 64, 6), "segment must be a pair"),
    ((32, True, (6, 10)), "vocab_size"),
])
def test_bad_task_is_refused_by_name(args, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        check_task(*args)
    with pytest.raises(ValueError):
        repeated_segments(4, *args)


def test_bad_batch_size_and_generator():
    with pytest.raises(ValueError, match="batch_size"):
        repeated_segments(0)


def perfect_previous_token_weights(B: int, H: int, L: int) -> torch.Tensor:
    w = torch.zeros(B, H, L, L)
    w[:, :, 0, 0] = 1.0
    t = torch.arange(1, L)
    w[:, :, t, t - 1] = 1.0
    return w


def uniform_weights(B: int, H: int, L: int) -> torch.Tensor:
    w = torch.ones(L, L).tril()
    return (w / w.sum(-1, keepdim=True)).expand(B, H, L, L)


def test_scores_on_hand_built_weights():
    L = 12
    prev = perfect_previous_token_weights(3, 2, L)
    assert previous_token_score(prev).tolist() == [1.0, 1.0]
    assert self_score(prev).tolist() == [0.0, 0.0]
    assert self_score(torch.eye(L).expand(3, 2, L, L)).tolist() == [1.0, 1.0]
    uniform = uniform_weights(3, 2, L)
    assert torch.allclose(previous_token_score(uniform), torch.tensor(uniform_previous_token_score(L)))
    assert math.isclose(uniform_previous_token_score(3), (1 / 2 + 1 / 3) / 2)


def test_induction_score_perfect_and_uniform():
    b = batch(32, seq_len=20, segment=(3, 6))
    B, L = b.tokens.shape
    w = torch.zeros(B, 3, L, L)
    w[..., 0] = 1.0  # everything on the first token, but for the induction queries:
    for row in range(B):
        f, s, n = b.first[row].item(), b.second[row].item(), b.length[row].item()
        for i in range(n - 1):
            w[row, 1, s + i] = 0.0
            w[row, 1, s + i, f + i + 1] = 1.0
    scores = induction_score(w, b)
    assert scores[1].item() == 1.0 and scores[0].item() == 0.0
    shifted = torch.zeros_like(w)
    shifted[..., :-1] = w[..., 1:]  # every weight one key earlier: on the same token's earlier occurrence
    assert duplicate_token_score(shifted, b)[1].item() == 1.0 and induction_score(shifted, b)[1].item() == 0.0
    assert torch.allclose(induction_score(uniform_weights(B, 2, L), b), torch.tensor(uniform_induction_score(b)))
    with pytest.raises(ValueError, match="don't belong"):
        induction_score(w[:, :, :10, :10], b)


def model(**kwargs) -> AttentionOnlyTransformer:
    torch.manual_seed(0)
    return AttentionOnlyTransformer(16, d_model=16, num_heads=4, max_len=12, **kwargs).eval()


def test_model_shapes_and_positions():
    tokens = batch(5, seq_len=12, vocab_size=16, segment=(2, 4)).tokens
    for positions in ("learned", "sinusoidal", "rotary"):
        logits, weights = model(positions=positions)(tokens, return_weights=True)
        assert logits.shape == (5, 12, 16) and len(weights) == 2
        assert all(w.shape == (5, 4, 12, 12) for w in weights)
        assert torch.allclose(weights[0].triu(1), torch.zeros(())), "attention must be causal"
    with pytest.raises(ValueError, match="without positions"):
        AttentionOnlyTransformer(16, positions=None)
    with pytest.raises(ValueError, match="max_len"):
        model()(torch.zeros(1, 13, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        model()(torch.full((1, 4), 16))


def test_head_outputs_sum_to_the_layer_output():
    m = model()
    tokens = batch(4, seq_len=12, vocab_size=16, segment=(2, 4)).tokens
    per_head = m.head_outputs(tokens)
    x = m.embed(tokens)
    for layer, heads in zip(m.layers, per_head):
        out = layer(x, x, x, torch.ones(12, 12, dtype=torch.bool).tril())
        assert torch.allclose(heads.sum(1) + layer.W_o.bias, out, atol=1e-5)
        x = x + out


def test_remove_nothing_changes_nothing_and_all_inputs_equal_silence_heads():
    m = model()
    tokens = batch(4, seq_len=12, vocab_size=16, segment=(2, 4)).tokens
    with torch.no_grad():
        plain = m(tokens)
        assert torch.equal(m(tokens, remove_from={"q": [], "k": []}), plain)
        for head in range(4):
            everywhere = m(tokens, remove_from={name: [(0, head)] for name in ("q", "k", "v", "out")})
            with silence_heads(m.layers[0], [head]):
                silenced = m(tokens)
            assert torch.allclose(everywhere, silenced, atol=1e-5)
            keys_only = m(tokens, remove_from={"k": [(0, head)]})
            assert not torch.allclose(keys_only, plain) and not torch.allclose(keys_only, silenced)
    with pytest.raises(ValueError, match="remove_from keys"):
        m(tokens, remove_from={"key": [(0, 1)]})
    with pytest.raises(ValueError, match=r"\(layer, head\)"):
        m(tokens, remove_from={"k": [(0, 4)]})


def test_losses_split_and_phase_change_step():
    b = batch(8, seq_len=12, vocab_size=16, segment=(2, 4))
    uniform = torch.zeros(8, 12, 16)
    everything, predictable, other = losses(uniform, b)
    assert all(math.isclose(x.item(), math.log(16), rel_tol=1e-6) for x in (everything, predictable, other))
    history = {"step": [0, 10, 20, 30], "loss": [4.1, 3.9, 1.5, 0.9]}
    assert phase_change_step(history, math.log(64) / 2, consecutive=1) == 20
    assert phase_change_step(history, math.log(64) / 2, consecutive=2) == 20
    assert phase_change_step(history, math.log(64) / 2) is None  # 5 records in a row by default: only 2 here
    assert phase_change_step(history, 0.5, consecutive=1) is None
    # one noisy batch below the threshold is not a phase change; five in a row are, from the first of them
    noisy = {"step": list(range(0, 120, 10)), "loss": [4.1, 1.9, 4.0, 3.9, 1.9, 1.8, 2.2, 1.5, 1.4, 1.3, 1.2, 1.1]}
    assert phase_change_step(noisy, math.log(64) / 2, consecutive=1) == 10
    assert phase_change_step(noisy, math.log(64) / 2) == 70
    assert phase_change_step(dict(noisy, loss=noisy["loss"][:11]), math.log(64) / 2) is None  # too late to tell
    with pytest.raises(ValueError, match="consecutive"):
        phase_change_step(history, 2.0, consecutive=0)


def test_train_induction_runs_and_leaves_global_state(capsys):
    m = model()
    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()
    rng = torch.get_rng_state()
    history = train_induction(m, steps=20, seed=0, segment=(2, 4), log_every=5, reports=2, threads=1)
    assert history["step"] == [0, 5, 10, 15, 20] and len(history["loss"]) == len(history["loss_other"]) == 5
    assert torch.get_num_threads() == threads and torch.is_grad_enabled() == grad
    assert torch.equal(torch.get_rng_state(), rng) and not m.training
    assert "step   20/20" in capsys.readouterr().out
    with pytest.raises(ValueError, match="max_len"):
        train_induction(m, steps=1, seq_len=14, segment=(2, 4))
