"""Chapter 09's checks (issue 33, item 5): 9.1, a score for a head role of the learner's choosing and its uniform
baseline; 9.2, the loss increase per head under mean-ablation, on the targets of one token class. Right answers
written three ways pass; every mistake the checks name fails with its hint; broken code never crashes a check."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import expect_fail, expect_pass
from mha_lib import checks
from mha_lib.checks.language_model import ROLES
from mha_lib.textlm.ablation import CLASSES, token_classes

# ------------------------------------------------------------------ 9.1 learner-style answers


def _keys(role, tokens, tokenizer, device, *, with_self=False, first_query=False, key_t=True):
    """``(keys (B, L, L), queries (B, L))`` of a role, with switches for the classic slips."""
    B, L = tokens.shape
    t = torch.arange(L, device=device)
    if role == "same token":
        earlier = t[None, :] <= t[:, None] if with_self else t[None, :] < t[:, None]
        keys = (tokens[:, :, None] == tokens[:, None, :]) & earlier
        strict = (tokens[:, :, None] == tokens[:, None, :]) & (t[None, :] < t[:, None])
        return keys, strict.any(-1)
    is_key = (token_classes(tokenizer, tokens.cpu(), tokens.cpu()) == CLASSES.index(role)).to(device)
    keys = is_key[:, None, :] & ((t[None, :] <= t[:, None]) if key_t else (t[None, :] < t[:, None]))
    queries = (t >= 0 if first_query else t >= 1).expand(B, L)
    return keys, queries


def score_pooled(role, **slips):
    def role_score(weights, tokens, tokenizer):
        keys, queries = _keys(role, tokens, tokenizer, weights.device, **slips)
        picked = (weights * keys[:, None].to(weights.dtype)).sum(-1)
        return (picked * queries[:, None].to(weights.dtype)).sum(dim=(0, 2)) / queries.sum()
    return role_score


def score_by_loops(role):
    """Written with Python loops over the batch and the queries."""
    def role_score(weights, tokens, tokenizer):
        B, H, L, _ = weights.shape
        if role != "same token":
            classes = token_classes(tokenizer, tokens.cpu(), tokens.cpu())
        total, count = torch.zeros(H, dtype=weights.dtype, device=weights.device), 0
        for b in range(B):
            for t in range(L):
                if role == "same token":
                    ks = [s for s in range(t) if tokens[b, s] == tokens[b, t]]
                    if not ks:
                        continue
                else:
                    if t == 0:
                        continue
                    ks = [s for s in range(t + 1) if classes[b, s] == CLASSES.index(role)]
                total = total + weights[b, :, t, ks].sum(-1)
                count += 1
        return total / count
    return role_score


def score_einsum(role):
    """Written with einsum and a float mask; the queries' mean through masked_select-like sums."""
    def role_score(weights, tokens, tokenizer):
        keys, queries = _keys(role, tokens, tokenizer, weights.device)
        per_query = torch.einsum("bhts,bts->bht", weights, keys.to(weights.dtype))  # (B, H, L)
        return per_query.transpose(0, 1)[:, queries].mean(-1)  # (H, number of queries) -> (H,)
    return role_score


def baseline_right(role, **slips):
    def role_baseline(tokens, tokenizer):
        keys, queries = _keys(role, tokens, tokenizer, tokens.device, **slips)
        t = torch.arange(tokens.size(1), device=tokens.device)
        return (keys.sum(-1) / (t + 1))[queries].mean().item()
    return role_baseline


def baseline_loops(role):
    def role_baseline(tokens, tokenizer):
        B, L = tokens.shape
        if role != "same token":
            classes = token_classes(tokenizer, tokens, tokens).tolist()
        shares = []
        for b in range(B):
            row = tokens[b].tolist()
            for t in range(L):
                if role == "same token":
                    n = sum(row[s] == row[t] for s in range(t))
                    if n:
                        shares.append(n / (t + 1))
                elif t >= 1:
                    shares.append(sum(classes[b][s] == CLASSES.index(role) for s in range(t + 1)) / (t + 1))
        return torch.tensor(shares, dtype=torch.float64).mean()  # a 0-d tensor is fine
    return role_baseline


@pytest.mark.parametrize("role", ROLES)
def test_role_checks_pass_right_answers_written_three_ways(role):
    for fn in (score_pooled(role), score_by_loops(role), score_einsum(role)):
        expect_pass(checks.check_role_score(fn, role=role))
    for fn in (baseline_right(role), baseline_loops(role)):
        expect_pass(checks.check_role_baseline(fn, role=role))


def test_role_names_are_read_loosely_and_an_unknown_one_lists_the_menu():
    expect_pass(checks.check_role_score(score_pooled("same token"), role="Same-Token"))
    expect_fail(checks.check_role_score(score_pooled("same token"), role="comma"), "no role 'comma'", "'punctuation'")
    expect_fail(checks.check_role_baseline(baseline_right("indent"), role=3), "no role 3")


def test_the_right_answer_for_one_role_fails_for_another():
    expect_fail(checks.check_role_score(score_pooled("punctuation"), role="indent"),
                "keys of another class, 'punctuation'")
    expect_fail(checks.check_role_baseline(baseline_right("indent"), role="punctuation"),
                "keys of another class, 'indent'")


# the named mistakes of the score -------------------------------------------------------------


def same_all_queries(weights, tokens, tokenizer):
    keys, _ = _keys("same token", tokens, tokenizer, weights.device)
    return (weights * keys[:, None].to(weights.dtype)).sum(-1).mean(dim=(0, 2))


def same_latest_only(weights, tokens, tokenizer):
    keys, queries = _keys("same token", tokens, tokenizer, weights.device)
    last = keys & (keys.long().cumsum(-1) == keys.long().sum(-1, keepdim=True))
    picked = (weights * last[:, None].to(weights.dtype)).sum(-1)
    return (picked * queries[:, None]).sum(dim=(0, 2)) / queries.sum()


def transposed(role):
    def role_score(weights, tokens, tokenizer):
        return score_pooled(role)(weights.transpose(-2, -1), tokens, tokenizer)
    return role_score


def mean_over_heads(weights, tokens, tokenizer):
    return score_pooled("same token")(weights, tokens, tokenizer).mean()


def one_per_sequence(weights, tokens, tokenizer):
    keys, queries = _keys("same token", tokens, tokenizer, weights.device)
    picked = (weights * keys[:, None].to(weights.dtype)).sum(-1)  # (B, H, L)
    return (picked * queries[:, None]).sum(dim=(1, 2)) / queries.sum()


def made_on_cpu(weights, tokens, tokenizer):
    L = tokens.size(1)
    earlier = torch.ones(L, L, dtype=torch.bool).tril(-1)  # on the CPU
    keys = (tokens[:, :, None] == tokens[:, None, :]) & earlier
    queries = keys.any(-1)
    picked = (weights * keys[:, None].to(weights.dtype)).sum(-1)
    return (picked * queries[:, None]).sum(dim=(0, 2)) / queries.sum()


def per_row_mean(weights, tokens, tokenizer):
    keys, queries = _keys("same token", tokens, tokenizer, weights.device)
    picked = (weights * keys[:, None].to(weights.dtype)).sum(-1) * queries[:, None]
    rows = queries.sum(-1) > 0
    return (picked.sum(2)[rows] / queries.sum(-1)[rows, None]).mean(0)


def kept(fn):
    store = {}

    def role_score(weights, tokens, tokenizer):
        key = tuple(weights.shape)
        if key not in store:
            store[key] = fn(weights, tokens, tokenizer)
        return store[key]
    return role_score


@pytest.mark.parametrize(("role", "fn", "words"), [
    ("same token", score_pooled("same token", with_self=True), ("key t itself is counted", "tril(-1)")),
    ("same token", same_all_queries, ("queries without an earlier occurrence are averaged in", "keys.any(-1)")),
    ("same token", same_latest_only, ("only the latest earlier occurrence",)),
    ("same token", transposed("same token"), ("queries and keys are swapped", "rows (dim -2) are queries")),
    ("same token", per_row_mean, ("each sequence was averaged first",)),
    ("same token", mean_over_heads, ("one number for all heads", "keep the head axis")),
    ("same token", one_per_sequence, ("one per sequence (averaged over the heads)",)),
    ("same token", lambda w, t, tok: score_pooled("same token")(w, t, tok).float(), ("dtype torch.float32",)),
    ("same token", kept(score_pooled("same token")), ("earlier call's scores came back",)),
    ("punctuation", score_pooled("punctuation", first_query=True), ("query 0 is counted",)),
    ("punctuation", transposed("punctuation"), ("class marks the queries instead of the keys",)),
    ("indent", score_pooled("indent", key_t=False), ("key t itself is left out",)),
    ("indent", score_pooled("newline"), ("keys of another class, 'newline'",)),
    ("indent", lambda w, t, tok: score_pooled("indent")(w.double(), t, tok), ("dtype torch.float64 for weights of "
                                                                            "dtype torch.float32",)),
], ids=["with itself", "all queries", "latest only", "swapped axes", "per row", "mean over heads", "per sequence",
        "float32 out", "kept", "query 0", "class on queries", "key t left out", "other class", "float64 out"])
def test_role_score_names_the_mistake(role, fn, words):
    expect_fail(checks.check_role_score(fn, role=role), *words)


def test_role_score_names_a_tensor_made_on_the_cpu():
    expect_fail(checks.check_role_score(made_on_cpu), "device 'meta'", "right on the cpu", "device=tokens.device",
                status="error")


# the named mistakes of the baseline ----------------------------------------------------------


def same_baseline(count_fn=None, denominator="t+1", queries="role"):
    def role_baseline(tokens, tokenizer):
        keys, q = _keys("same token", tokens, tokenizer, tokens.device)
        L = tokens.size(1)
        t = torch.arange(L, dtype=torch.float64)
        count = keys.sum(-1).double() if count_fn is None else count_fn(keys)
        d = {"t+1": t + 1, "L": torch.full((L,), float(L), dtype=torch.float64), "t": t.clamp(min=1)}[denominator]
        shares = count / d
        return (shares[q] if queries == "role" else shares).mean().item()
    return role_baseline


def class_share_of_row(tokens, tokenizer):
    return (token_classes(tokenizer, tokens, tokens) == CLASSES.index("punctuation")).double().mean().item()


def class_over_L(tokens, tokenizer):
    is_key = (token_classes(tokenizer, tokens, tokens) == CLASSES.index("indent")).double()
    return (is_key.cumsum(-1) / tokens.size(1))[:, 1:].mean().item()


@pytest.mark.parametrize(("role", "fn", "words"), [
    ("same token", same_baseline(denominator="L"), ("divided by l, not by t + 1",)),
    ("same token", same_baseline(count_fn=lambda k: k.sum(-1).double() + 1), ("key t itself is counted as an "
                                                                               "occurrence",)),
    ("same token", same_baseline(denominator="t"), ("divided by t",)),
    ("same token", same_baseline(queries="all"), ("every query is averaged in",)),
    ("same token", same_baseline(count_fn=lambda k: k.any(-1).double()), ("one earlier occurrence is assumed",)),
    ("punctuation", class_share_of_row, ("share of the whole sequence",)),
    ("indent", class_over_L, ("divided by l, not by t + 1",)),
    ("indent", baseline_right("indent", first_query=True), ("query 0 is counted",)),
    ("indent", baseline_right("indent", key_t=False), ("key t itself is left out",)),
    ("punctuation", baseline_right("newline"), ("keys of another class, 'newline'",)),
], ids=["over L", "diagonal", "over t", "all queries", "one occurrence", "share of row", "class over L", "query 0",
        "key t left out", "other class"])
def test_role_baseline_names_the_mistake(role, fn, words):
    expect_fail(checks.check_role_baseline(fn, role=role), *words)


def test_role_baseline_names_a_tensor_made_on_the_cpu_and_odd_returns():
    def cpu_arange(tokens, tokenizer):
        keys, q = _keys("same token", tokens, tokenizer, tokens.device)
        return (keys.sum(-1) / (torch.arange(tokens.size(1)) + 1))[q].mean()

    expect_fail(checks.check_role_baseline(cpu_arange), "device 'meta'", status="error")
    expect_fail(checks.check_role_baseline(lambda tokens, tokenizer: torch.zeros(3)), "shape (3,); expected one number")
    expect_fail(checks.check_role_baseline(lambda tokens, tokenizer: "0.1"), "is str; expected one number")
    expect_fail(checks.check_role_baseline(lambda tokens, tokenizer: torch.tensor(1)), "dtype torch.int64")
    result = checks.check_role_baseline(lambda tokens, tokenizer: None)
    assert result.status == "not implemented", result


@pytest.mark.parametrize("check", [checks.check_role_score, checks.check_role_baseline, checks.check_class_ablation])
def test_broken_code_never_crashes_the_checks(check):
    def in_place(*args):
        args[0].add_(1) if args[0].is_floating_point() else args[0].fill_(0)
        return None

    broken = [lambda *a: 1 / 0, lambda *a: None, lambda *a: torch.zeros(7, 5), lambda *a: "x", lambda *a: [1.0],
              lambda *a: torch.full((2, 2), float("nan"))]
    for fn in broken:
        result = check(fn)
        assert not result and result.status in ("failed", "error", "not implemented"), result
        assert "bug in mha_lib.checks" not in str(result), result
    if check is not checks.check_class_ablation:
        expect_fail(check(lambda *a: (in_place(*a), score_pooled("same token")(*a))[1] if len(a) == 3 else
                          (in_place(*a), baseline_right("same token")(*a))[1]), "changed its input")


# ------------------------------------------------------------------ 9.2 learner-style answers


def _means(model, inputs, how="all"):
    got = []
    hooks = [b.attn.W_o.register_forward_pre_hook(lambda m, a: got.append(a[0].detach())) for b in model.blocks]
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for h in hooks:
            h.remove()
    reduce = {"all": lambda x: x.mean(dim=(0, 1)), "batch": lambda x: x.mean(0), "positions": lambda x: x.mean(1, keepdim=True),
              "zero": lambda x: torch.zeros_like(x.mean(dim=(0, 1)))}[how]
    return [reduce(x) for x in got]


def ablation_answer(model, inputs, targets, classes, cls, *, how="all", which=None, sign=1, loss_on="class",
                    remove=True, restore_mode=True):
    """A learner-style answer with switches for the classic slips."""
    was_training = model.training
    model.eval()
    means = _means(model, inputs, how)
    picked = classes == cls

    def loss():
        per_token = F.cross_entropy(model(inputs).transpose(1, 2), targets, reduction="none")
        return per_token.mean() if loss_on == "all" else per_token[picked].mean()

    with torch.no_grad():
        clean = loss()
        rows = []
        for l, block in enumerate(model.blocks):
            d_k, row = block.attn.d_k, []
            for h in range(block.attn.num_heads):
                heads = [h] if which is None else which(h, block.attn.num_heads)

                def hook(module, args, l=l, heads=heads, d_k=d_k):
                    x = args[0].clone()
                    for k in heads:
                        x[..., k * d_k:(k + 1) * d_k] = means[l][..., k * d_k:(k + 1) * d_k]
                    return (x,)

                handle = block.attn.W_o.register_forward_pre_hook(hook)
                try:
                    row.append(sign * (loss() - clean))
                finally:
                    if remove:
                        handle.remove()
            rows.append(torch.stack(row))
    if restore_mode:
        model.train(was_training)
    return torch.stack(rows)


def ablation_in_place_on_w_o(model, inputs, targets, classes, cls):
    """Another right answer: the mean folded into W_o's bias while the head's columns of W_o are zeroed, then
    restored, all by hand (no hook)."""
    means = _means(model, inputs)
    picked = classes == cls
    with torch.no_grad():
        def loss():
            return F.cross_entropy(model(inputs).transpose(1, 2), targets, reduction="none")[picked].mean()

        clean = loss()
        out = torch.zeros(model.num_layers, model.num_heads, dtype=model.unembed.weight.dtype)
        for l, block in enumerate(model.blocks):
            W_o, d_k = block.attn.W_o, block.attn.d_k
            for h in range(model.num_heads):
                cols = slice(h * d_k, (h + 1) * d_k)
                weight, bias = W_o.weight.clone(), W_o.bias.clone()
                try:
                    W_o.bias += W_o.weight[:, cols] @ means[l][cols]
                    W_o.weight[:, cols] = 0
                    out[l, h] = loss() - clean
                finally:
                    W_o.weight.copy_(weight)
                    W_o.bias.copy_(bias)
    return out


@torch.no_grad()
def ablation_by_loss_sums(model, inputs, targets, classes, cls):
    """Another right answer, under @torch.no_grad() (a decorator that the course's own functions use too): the
    class's loss as a sum over its targets divided by their count, in a list of lists turned into a tensor."""
    means = _means(model, inputs)
    picked = classes == cls

    def loss():
        per_token = F.cross_entropy(model(inputs).transpose(1, 2), targets, reduction="none")
        return (per_token * picked).sum() / picked.sum()

    clean, table = loss(), []
    for l, block in enumerate(model.blocks):
        table.append([])
        for h in range(model.num_heads):
            def hook(module, args, l=l, h=h, d_k=block.attn.d_k):
                return (torch.cat([args[0][..., :h * d_k], means[l][h * d_k:(h + 1) * d_k].expand_as(
                    args[0][..., h * d_k:(h + 1) * d_k]), args[0][..., (h + 1) * d_k:]], dim=-1),)

            handle = block.attn.W_o.register_forward_pre_hook(hook)
            try:
                table[-1].append(loss() - clean)
            finally:
                handle.remove()
    return torch.tensor([[x.item() for x in row] for row in table], dtype=model.unembed.weight.dtype)


def test_class_ablation_passes_right_answers_written_three_ways():
    for fn in (ablation_answer, ablation_in_place_on_w_o, ablation_by_loss_sums):
        expect_pass(checks.check_class_ablation(fn))


def _kept():
    store = {}

    def fn(model, inputs, targets, classes, cls):
        if id(model) not in store:
            store[id(model)] = ablation_answer(model, inputs, targets, classes, cls)
        return store[id(model)]
    return fn


@pytest.mark.parametrize(("fn", "words"), [
    (lambda *a: ablation_answer(*a, how="zero"), ("zero-ablation",)),
    (lambda *a: ablation_answer(*a, how="batch"), ("mean over the batch only",)),
    (lambda *a: ablation_answer(*a, how="positions"), ("mean over the positions only",)),
    (lambda *a: ablation_answer(*a, which=lambda h, H: list(range(H))), ("all heads of its layer at once",)),
    (lambda *a: ablation_answer(*a, which=lambda h, H: list(range(h + 1))), ("heads add up",)),
    (lambda *a: ablation_answer(*a, remove=False), ("left a hook on the model", "handle.remove()")),
    (lambda *a: ablation_answer(*a, loss_on="all"), ("loss over all targets", "classes == cls")),
    (lambda *a: ablation_answer(*a, sign=-1), ("sign is flipped",)),
    (lambda *a: ablation_answer(*a, restore_mode=False), ("changed the mode of the model", "training mode",
                                                         "model.train(was_training)")),
    (lambda m, *a: (m.train(), ablation_answer(m, *a))[1], ("changed the mode of the model", "evaluation mode")),
    (lambda *a: ablation_answer(*a).T, ("rows and columns are swapped", "out[l, h]")),
    (lambda *a: ablation_answer(*a).double(), ("dtype torch.float64 for a model of dtype torch.float32",)),
    (lambda *a: ablation_answer(*a).flatten(), ("one row per layer",)),
    (_kept(), ("earlier call",)),
], ids=["zero", "batch mean", "position mean", "whole layer", "cumulative", "hook left", "all targets", "sign",
        "left in eval", "left in train", "transposed", "float64", "flat", "kept"])
def test_class_ablation_names_the_mistake(fn, words):
    expect_fail(checks.check_class_ablation(fn), *words)


def test_class_ablation_names_a_model_whose_weights_were_left_changed():
    def zeroes_w_o(model, inputs, targets, classes, cls):
        out = ablation_answer(model, inputs, targets, classes, cls)
        with torch.no_grad():
            model.blocks[0].attn.W_o.weight[:, 0] = 0
        return out

    def no_grad_for_good(model, inputs, targets, classes, cls):
        for p in model.parameters():
            p.requires_grad_(False)
        return ablation_answer(model, inputs, targets, classes, cls)

    expect_fail(checks.check_class_ablation(zeroes_w_o), "changed the model's parameters")
    expect_fail(checks.check_class_ablation(no_grad_for_good), "changed requires_grad")


def test_class_ablation_refuses_the_librarys_own_answer():
    from mha_lib.textlm.ablation import ablation_losses

    expect_fail(checks.check_class_ablation(
        lambda m, i, t, c, cls: ablation_losses(m, i, t, c)["increase"][:, :, cls].to(m.unembed.weight.dtype)),
        "calls mha_lib.textlm.ablation.ablation_losses")


def test_the_checks_mistake_machinery_equals_the_library_when_nothing_is_wrong():
    from mha_lib.checks import language_model as lm

    model = lm._untrained_lm(95, 23, 16, 2, 2, 12, True, "rotary", torch.float64)
    inputs, targets, classes = lm._text_batch(lm.gen(95), 6, 12, 23)
    mine = lm._ablated(model, inputs, targets, classes, 2, value=lambda x, c: x[..., c].mean(dim=(0, 1)),
                       heads=lambda l, h: [(l, h)],
                       loss=lambda z: F.cross_entropy(z.transpose(1, 2), targets, reduction="none")[classes == 2].mean())
    assert torch.allclose(mine, lm.reference_ablation(model, inputs, targets, classes, 2), atol=1e-10)
    assert (mine.abs() > 1e-3).all()  # every head of these models changes the loss: a slip can't hide
