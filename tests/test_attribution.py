"""Chapter 07's three ablations and direct logit attribution (mha_lib.sentiment.attribution),
each checked against the computation written out by hand."""

from __future__ import annotations

import pytest
import torch

from mha_lib import seed_everything
from mha_lib.sentiment import SentimentClassifier, Vocab, batch_examples, make_datasets, silence_heads, train_model
from mha_lib.sentiment.attribution import ablated_accuracy, head_outputs, logit_attribution, replace_heads


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return Vocab.for_task()


@pytest.fixture(scope="module")
def data():
    return make_datasets(300, 120, seed=5)


def model_with(vocab, num_heads=2, num_layers=1, trained=None, seed=0):
    seed_everything(seed)
    model = SentimentClassifier(len(vocab), d_model=48, num_heads=num_heads, num_layers=num_layers, d_ff=96)
    if trained is not None:
        train_model(model, trained, vocab, epochs=2, reports=0)
    return model.eval()


@pytest.fixture(scope="module")
def trained(vocab, data):
    """A model trained briefly: its heads no longer attend uniformly."""
    return model_with(vocab, trained=data[0])


def by_hand_heads(model, tokens):
    """(N, H, d_k) at <cls>: the heads' outputs computed from the layer's own parts."""
    layer = model.layers[0]
    attn = layer.self_attn
    positions = torch.arange(tokens.size(1))
    x = model.token_embedding(tokens) + model.position_embedding(positions)
    h = layer.norm1(x)
    B, L, D = h.shape
    H, d_k = attn.num_heads, D // attn.num_heads
    q, k, v = (W(h).view(B, L, H, d_k).transpose(1, 2) for W in (attn.W_q, attn.W_k, attn.W_v))
    scores = q @ k.transpose(-2, -1) / d_k**0.5
    scores = scores.masked_fill((tokens == Vocab.pad_id)[:, None, None, :], float("-inf"))
    return (scores.softmax(-1) @ v)[:, :, 0]  # (B, H, d_k) at <cls>


@pytest.mark.parametrize("num_heads", [1, 2, 4])
def test_head_outputs_match_the_computation_by_hand(vocab, data, num_heads):
    model = model_with(vocab, num_heads, trained=data[0][:64])
    examples = data[1][:20]
    with torch.no_grad():
        expected = by_hand_heads(model, batch_examples(examples, vocab))
    torch.testing.assert_close(head_outputs(model, examples, vocab), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_heads", [1, 2, 4])
def test_logit_attribution_adds_up_and_each_head_term_is_its_own(vocab, data, num_heads):
    model = model_with(vocab, num_heads, trained=data[0][:64])
    examples = data[1][:30]
    parts = logit_attribution(model, examples, vocab)
    assert list(parts) == ["embedding", *(f"head {h}" for h in range(num_heads)), "W_o bias", "feed-forward", "constant"]
    with torch.no_grad():
        logits = model(batch_examples(examples, vocab))
        torch.testing.assert_close(sum(parts.values()), logits[:, 1] - logits[:, 0], atol=1e-4, rtol=1e-4)
        # head h's term, by hand: its output through its slice of W_o, centred, scaled by the frozen sigma
        tokens = batch_examples(examples, vocab)
        attn, norm = model.layers[0].self_attn, model.norm
        d_k = attn.W_o.in_features // num_heads
        x_cls = model.layers[0](model.token_embedding(tokens) + model.position_embedding(torch.arange(tokens.size(1))),
                                (tokens != Vocab.pad_id)[:, None, None, :])[:, 0]
        sigma = (x_cls.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
        w = model.classifier.weight[1] - model.classifier.weight[0]
        for h in range(num_heads):
            term = by_hand_heads(model, tokens)[:, h] @ attn.W_o.weight[:, h * d_k:(h + 1) * d_k].T
            expected = ((term - term.mean(-1, keepdim=True)) * norm.weight / sigma) @ w
            torch.testing.assert_close(parts[f"head {h}"], expected, atol=1e-4, rtol=1e-4)


def test_zero_ablation_equals_silencing(vocab, data, trained):
    examples = data[1]
    labels = torch.tensor([e.label for e in examples])
    for h in range(2):
        with torch.no_grad(), silence_heads(trained.layers[0].self_attn, [h]):
            silenced = trained(batch_examples(examples, vocab)).argmax(-1) == labels
        assert torch.equal(ablated_accuracy(trained, examples, vocab, [h], "zero", data[0]), silenced)


def test_mean_and_resample_put_in_what_they_promise(vocab, data, trained):
    examples, reference = data[1][:40], data[0][:50]
    outputs = head_outputs(trained, reference, vocab)  # (M, H, d_k)
    labels = torch.tensor([e.label for e in examples])
    tokens = batch_examples(examples, vocab)
    with torch.no_grad(), replace_heads(trained, [1], outputs[:, 1].mean(0, keepdim=True)):
        mean_by_hand = trained(tokens).argmax(-1) == labels
        assert torch.allclose(head_outputs(trained, examples, vocab)[:, 1], outputs[:, 1].mean(0).expand(40, -1))
    assert torch.equal(ablated_accuracy(trained, examples, vocab, [1], "mean", reference), mean_by_hand)
    pick = torch.randint(len(reference), (len(examples),), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), replace_heads(trained, [1], outputs[pick][:, [1]]):
        resample_by_hand = trained(tokens).argmax(-1) == labels
    assert torch.equal(ablated_accuracy(trained, examples, vocab, [1], "resample", reference, seed=3), resample_by_hand)
    # the other head is untouched
    untouched = head_outputs(trained, examples, vocab)[:, 0]
    with torch.no_grad(), replace_heads(trained, [1], torch.zeros(1, outputs.size(-1))):
        torch.testing.assert_close(head_outputs(trained, examples, vocab)[:, 0], untouched)


def test_replace_heads_leaves_no_hook_behind(vocab, data, trained):
    tokens = batch_examples(data[1][:10], vocab)
    with torch.no_grad():
        before = trained(tokens)
        with replace_heads(trained, [0], torch.zeros(1, 24)):
            changed = trained(tokens)
        after = trained(tokens)
    assert torch.equal(before, after) and not torch.allclose(before, changed)


def test_errors_name_the_problem(vocab, data, trained):
    examples = data[1][:5]
    with pytest.raises(ValueError, match="how must be one of"):
        ablated_accuracy(trained, examples, vocab, [0], "shuffle", data[0])
    with pytest.raises(ValueError, match=r"heads must be a non-empty list of head indices in \[0, 2\)"):
        ablated_accuracy(trained, examples, vocab, [2], "zero", data[0])
    with pytest.raises(ValueError, match="heads must be"):
        ablated_accuracy(trained, examples, vocab, [], "zero", data[0])
    with pytest.raises(ValueError, match="needs examples and reference"):
        ablated_accuracy(trained, examples, vocab, [0], "mean", [])
    with pytest.raises(ValueError, match=r"values must be \(1, 24\) or \(B, 1, 24\), got \(1, 12\)"):
        with replace_heads(trained, [0], torch.zeros(1, 12)):
            pass
    two_layers = model_with(vocab, num_layers=2)
    with pytest.raises(ValueError, match="one-layer model .* got 2 layers"):
        logit_attribution(two_layers, examples, vocab)
