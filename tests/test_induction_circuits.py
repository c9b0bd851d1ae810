"""mha_lib.induction.circuits: the token/position/bias split of layer 1's heads, removing one part,
mean-ablation, the copying scores and Elhage et al.'s composition scores, each against an
independent formulation, and a wrong formula that must fail."""

from __future__ import annotations

import pytest
import torch

from mha_lib.induction import AttentionOnlyTransformer, repeated_segments
from mha_lib.induction.circuits import (
    PARTS,
    composition_scores,
    copying_eigenvalues,
    copying_score,
    head_parts,
    mean_ablate,
    ov_circuit,
    ov_matrix,
    qk_matrix,
    random_composition_scores,
    remove_parts,
)

V, D, H, L = 16, 16, 4, 12


def model(positions: str = "learned", seed: int = 0) -> AttentionOnlyTransformer:
    torch.manual_seed(seed)
    return AttentionOnlyTransformer(V, d_model=D, num_heads=H, max_len=L, positions=positions).eval()


def tokens(n: int = 6, seed: int = 0) -> torch.Tensor:
    return repeated_segments(n, L, V, (2, 4), generator=torch.Generator().manual_seed(seed)).tokens


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary"])
def test_the_three_parts_add_up_to_the_heads_outputs(positions):
    m, t = model(positions), tokens()
    with torch.no_grad():
        parts = head_parts(m, t)
        assert set(parts) == set(PARTS) and all(p.shape == (6, H, L, D) for p in parts.values())
        torch.testing.assert_close(sum(parts.values()), m.head_outputs(t)[0], atol=1e-5, rtol=1e-5)
    if positions == "rotary":  # the values never see a position
        assert torch.equal(parts["position"], torch.zeros_like(parts["position"]))


def test_the_parts_by_hand_one_head_one_query():
    m, t = model(), tokens(2)
    layer = m.layers[0]
    d_k = D // H
    with torch.no_grad():
        parts = head_parts(m, t)
        x = m.embed(t)
        _, w = layer(x, x, x, torch.ones(L, L, dtype=torch.bool).tril(), return_weights=True)
        for b, h, i in [(0, 0, 0), (1, 2, 7), (0, 3, L - 1)]:
            rows = slice(h * d_k, (h + 1) * d_k)
            W_v, b_v, W_o = layer.W_v.weight[rows], layer.W_v.bias[rows], layer.W_o.weight[:, rows]
            token = sum(w[b, h, i, j] * (W_o @ (W_v @ m.token_embedding.weight[t[b, j]])) for j in range(i + 1))
            position = sum(w[b, h, i, j] * (W_o @ (W_v @ m.position_embedding[j])) for j in range(i + 1))
            torch.testing.assert_close(parts["token"][b, h, i], token, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(parts["position"][b, h, i], position, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(parts["bias"][b, h, i], W_o @ b_v, atol=1e-5, rtol=1e-5)
            # a wrong split, each value read at the query's own position instead of mixed by A: it fails
            wrong = W_o @ (W_v @ m.token_embedding.weight[t[b, i]])
            assert i == 0 or not torch.allclose(parts["token"][b, h, i], wrong, atol=1e-4)


@pytest.mark.parametrize("which", ["q", "k", "v", "out"])
def test_removing_every_part_is_removing_the_head(which):
    m, t = model(), tokens()
    with torch.no_grad():
        intact = m(t)
        for head in range(H):
            whole = m(t, remove_from={which: [(0, head)]})
            every_part = remove_parts(m, t, {which: [(head, part) for part in PARTS]})
            torch.testing.assert_close(every_part, whole, atol=1e-5, rtol=1e-5)
            one_part = remove_parts(m, t, {which: [(head, "position")]})
            assert not torch.allclose(one_part, intact) and not torch.allclose(one_part, whole)
        torch.testing.assert_close(remove_parts(m, t, {which: []}), intact)


def test_a_part_removed_from_one_input_is_subtracted_there_only():
    m, t = model(), tokens()
    with torch.no_grad():
        part = head_parts(m, t)["position"][:, 1]  # (B, L, D)
        x0 = m.embed(t)
        mask = torch.ones(L, L, dtype=torch.bool).tril()
        x1 = x0 + m.layers[0](x0, x0, x0, mask)
        x2 = x1 + m.layers[1](x1 - part, x1, x1, mask)  # the query input only
        torch.testing.assert_close(remove_parts(m, t, {"q": [(1, "position")]}), m.unembed(x2), atol=1e-5, rtol=1e-5)
        logits, weights = remove_parts(m, t, {"k": [(0, "token")]}, return_weights=True)
        assert len(weights) == 2 and logits.shape == (6, L, V)


def test_remove_parts_refuses_what_it_cannot_remove():
    m, t = model(), tokens()
    with pytest.raises(ValueError, match="keys must be among"):
        remove_parts(m, t, {"key": [(0, "token")]})
    for ref in [(H, "token"), (0, "embedding"), (0,), 0, (True, "bias")]:
        with pytest.raises(ValueError, match=r"\(head, part\)"):
            remove_parts(m, t, {"q": [ref]})
    with pytest.raises(ValueError, match=r"subtract\['q'\] must be a float tensor"):
        m(t, subtract={"q": torch.zeros(6, L, D + 1)})
    with pytest.raises(TypeError, match="AttentionOnlyTransformer"):
        head_parts(torch.nn.Linear(2, 2), t)


def test_mean_ablation_puts_the_heads_mean_in_its_place():
    m, t = model(), tokens()
    with torch.no_grad():
        out = m.head_outputs(t)[0][:, 2]  # (B, L, D)
        x0 = m.embed(t)
        mask = torch.ones(L, L, dtype=torch.bool).tril()
        x1 = x0 + m.layers[0](x0, x0, x0, mask)
        by_hand = m.unembed(x1 + m.layers[1](x1 - out + out.mean(0), x1, x1, mask))
        torch.testing.assert_close(mean_ablate(m, t, {"q": [2]}), by_hand, atol=1e-5, rtol=1e-5)
        same = t[:1].expand(5, L)  # one sequence five times: the mean is the head itself
        torch.testing.assert_close(mean_ablate(m, same, {"q": [0, 1, 2, 3]}), m(same), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(mean_ablate(m, t, {"q": [2]}), m(t, remove_from={"q": [(0, 2)]}))  # not zero


def test_ov_circuit_is_the_token_path_through_one_head():
    m = model()
    layer, d_k = m.layers[1], D // H
    circuit = ov_circuit(m, 1, 3)
    assert circuit.shape == (V, V)
    for b in (0, 5, V - 1):
        value = layer.W_v.weight[3 * d_k:] @ m.token_embedding.weight[b]  # (d_k,)
        written = layer.W_o.weight[:, 3 * d_k:] @ value  # (D,)
        torch.testing.assert_close(circuit[:, b], m.unembed.weight @ written, atol=1e-5, rtol=1e-5)


def copier(sign: float = 1.0) -> AttentionOnlyTransformer:
    """A model whose layer-2 head 0 copies (sign 1) or suppresses (sign -1) the token it attends to."""
    m = model()
    d_k = D // H
    with torch.no_grad():
        E = torch.eye(V, D)  # token b is the unit vector e_b (V == D)
        m.token_embedding.weight.copy_(E)
        m.unembed.weight.copy_(E)
        W_v, W_o = m.layers[1].W_v.weight, m.layers[1].W_o.weight
        W_v[:d_k].zero_()
        W_o[:, :d_k].zero_()
        W_v[:d_k, :d_k] = torch.eye(d_k)  # head 0 reads dims 0..3 and writes them back: copies tokens 0..3
        W_o[:d_k, :d_k] = sign * torch.eye(d_k)
    return m


def test_copying_scores_on_a_copier_a_suppressor_and_random_weights():
    assert copying_eigenvalues(copier(), 1, 0) == pytest.approx(1.0)
    assert copying_eigenvalues(copier(-1.0), 1, 0) == pytest.approx(-1.0)
    # tokens 0..3 raise their own logit; the others write nothing (a tie, which argmax gives to token 0)
    assert copying_score(copier(), 1, 0) == pytest.approx(4 / V)
    assert copying_score(copier(-1.0), 1, 0) == 0.0
    torch.manual_seed(1)
    big = AttentionOnlyTransformer(64, d_model=64, num_heads=4, max_len=8).eval()
    random_top = [copying_score(big, layer, h) for layer in range(2) for h in range(4)]
    random_eigen = [copying_eigenvalues(big, layer, h) for layer in range(2) for h in range(4)]
    assert max(random_top) < 0.2 and max(abs(e) for e in random_eigen) < 0.5  # far below a copier's 1


def test_copying_score_by_hand():
    m = model(seed=3)
    circuit = ov_circuit(m, 0, 1)
    own_is_top = [max(range(V), key=lambda a: circuit[a, b].item()) == b for b in range(V)]
    assert copying_score(m, 0, 1) == pytest.approx(sum(own_is_top) / V)
    eig = torch.linalg.eigvals(circuit.double().detach())
    assert copying_eigenvalues(m, 0, 1) == pytest.approx((eig.real.sum() / eig.abs().sum()).item())


def frobenius(x: torch.Tensor) -> float:
    return float((x.double() ** 2).sum().sqrt())


def test_composition_scores_against_the_formulas_written_out():
    m = model()
    with torch.no_grad():
        scores = composition_scores(m)
        assert set(scores) == {"q", "k", "v"} and all(s.shape == (H, H) for s in scores.values())
        d_k = D // H
        for h1, h2 in [(0, 0), (1, 3), (3, 2)]:
            r1, r2 = slice(h1 * d_k, (h1 + 1) * d_k), slice(h2 * d_k, (h2 + 1) * d_k)
            one, two = m.layers[0], m.layers[1]
            W_OV1 = one.W_o.weight[:, r1] @ one.W_v.weight[r1]
            W_QK2 = two.W_q.weight[r2].T @ two.W_k.weight[r2]
            W_OV2 = two.W_o.weight[:, r2] @ two.W_v.weight[r2]
            torch.testing.assert_close(ov_matrix(one, h1), W_OV1)
            torch.testing.assert_close(qk_matrix(two, h2), W_QK2)
            norms = frobenius(W_QK2) * frobenius(W_OV1)
            assert scores["q"][h1, h2].item() == pytest.approx(frobenius(W_QK2.T @ W_OV1) / norms, rel=1e-4)
            assert scores["k"][h1, h2].item() == pytest.approx(frobenius(W_QK2 @ W_OV1) / norms, rel=1e-4)
            assert scores["v"][h1, h2].item() == pytest.approx(
                frobenius(W_OV2 @ W_OV1) / (frobenius(W_OV2) * frobenius(W_OV1)), rel=1e-4)
    assert all(((s >= 0) & (s <= 1)).all() for s in scores.values())


def test_q_and_k_composition_tell_apart_where_a_head_is_read():
    # layer 1's head 0 writes into dims 0..3 only; layer 2's head 0 reads its queries from dims 8..15
    # and its keys from dims 0..3: K-composition, and no Q-composition at all. Swapping the two
    # formulas (a common mistake) fails here.
    m = model()
    d_k = D // H
    with torch.no_grad():
        W_o = m.layers[0].W_o.weight
        W_o[:, :d_k] = 0
        W_o[:d_k, :d_k] = torch.randn(d_k, d_k)
        W_q, W_k = m.layers[1].W_q.weight, m.layers[1].W_k.weight
        W_q[:d_k, :8] = 0
        W_k[:d_k, 4:] = 0
        scores = composition_scores(m)
    assert scores["q"][0, 0].item() == pytest.approx(0.0, abs=1e-6)
    assert scores["k"][0, 0].item() > 0.3
    assert composition_scores(m)["q"][0, 0] == composition_scores(model_scaled(m))["q"][0, 0]  # scale-free


def model_scaled(m: AttentionOnlyTransformer) -> AttentionOnlyTransformer:
    with torch.no_grad():
        m.layers[0].W_v.weight.mul_(2.0)  # exact in binary floating point
        m.layers[1].W_q.weight.mul_(4.0)
    return m


def test_composition_scores_refuse_rotary_positions():
    with pytest.raises(ValueError, match="rotary"):
        composition_scores(model("rotary"))


def test_random_composition_scores_are_one_distribution_and_repeatable():
    scores = random_composition_scores(64, 16, draws=400)
    assert all(s.shape == (400,) and ((s > 0) & (s < 1)).all() for s in scores.values())
    means = [s.mean().item() for s in scores.values()]
    assert max(means) - min(means) < 0.01  # Q, K and V of random heads: the same distribution
    assert 0.1 < means[0] < 0.15  # near 1 / sqrt(64) = 0.125
    assert torch.equal(random_composition_scores(64, 16, draws=400)["q"], scores["q"])
    # the trained-from-scratch (random init) model's scores sit in that distribution
    torch.manual_seed(2)
    m = AttentionOnlyTransformer(64, d_model=64, num_heads=4, max_len=8)
    for name, s in composition_scores(m).items():
        assert s.min() > scores[name].quantile(0.001) and s.max() < scores[name].quantile(0.999)
