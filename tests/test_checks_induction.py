"""The checks of chapter 08: the repeated-segment batch, the previous-token and induction scores,
and the losses of a model with each head silenced. Each passes differently written right answers
(unusual ones included), fails each mistake it names with that mistake's hint, reads a stub as
"not implemented yet", and never crashes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import expect_fail, expect_pass
from mha_lib import checks
from mha_lib.checks import CheckResult
from mha_lib.heads import silence_heads
from mha_lib.induction import induction_score, losses, previous_token_score, repeated_segments

NEW_CHECKS = [checks.check_repeated_segment_batch, checks.check_previous_token_score, checks.check_induction_score,
              checks.check_ablation_losses]


@pytest.mark.parametrize("check", NEW_CHECKS, ids=lambda c: c.__name__)
def test_a_stub_reads_not_implemented(check):
    def stub(*args, **kwargs):
        raise NotImplementedError

    result = check(stub)
    assert result.status == "not implemented" and "not implemented yet" in str(result), result
    assert str(result).startswith("⏳")


@pytest.mark.parametrize("check", NEW_CHECKS, ids=lambda c: c.__name__)
def test_garbage_never_crashes_the_check(check):
    for garbage in (lambda *a, **k: "nonsense", lambda *a, **k: 1 / 0, 42, lambda *a, **k: None,
                    lambda *a, **k: (torch.zeros(1), torch.zeros(1), torch.zeros(1)), lambda *a, **k: torch.zeros(2, 2),
                    lambda *a, **k: (torch.zeros(2, 2), torch.zeros(2, 2)), lambda *a, **k: torch.full((2, 3), math.nan)):
        result = check(garbage)
        assert isinstance(result, CheckResult) and not result, result
        assert "bug in mha_lib.checks" not in str(result), result


# ------------------------------------------------------------------ 8.1 the repeated-segment batch


def segment_batch(batch_size, seq_len, vocab_size, segment, generator, *, mistake=None):
    """A learner-style batch, one row at a time, with switches for the classic mistakes."""
    lo, hi = segment
    draw = (lambda high: int(torch.randint(high, (1,)))) if mistake == "global rng" else \
        (lambda high: int(torch.randint(high, (1,), generator=generator)))
    if mistake == "own generator":
        own = torch.Generator().manual_seed(0)
        draw = lambda high: int(torch.randint(high, (1,), generator=own))  # noqa: E731
    tokens = torch.randint(vocab_size + (mistake == "ids too high"), (batch_size, seq_len), generator=generator)
    predictable = torch.zeros(batch_size, seq_len, dtype=torch.bool)
    for b in range(batch_size):
        n = lo + draw(hi - lo + (0 if mistake == "exclusive high" else 1))
        if mistake == "fixed offset":
            first, second = draw(seq_len - 2 * hi + 1), None
            second = first + hi
        elif mistake == "overlap":
            first = draw(seq_len - n - 1)
            second = first + 1 + draw(seq_len - n - first)
        else:
            first = draw(seq_len - 2 * n + 1)
            second = first + n + draw(seq_len - 2 * n - first + 1)
        if mistake == "overlap in place":
            first = draw(seq_len - n - 1)
            second = first + 1 + draw(seq_len - n - first)
            for i in range(n):
                tokens[b, second + i] = tokens[b, first + i]
        elif mistake != "no copy":
            tokens[b, second:second + n] = tokens[b, first:first + n].clone()
        start, end = second + 1, second + n
        if mistake == "first marked":
            start = second
        if mistake == "one past the end":
            end += 1
        if mistake == "one short at the end":
            end -= 1
        if mistake == "shifted left":
            start, end = second, second + n - 1
        predictable[b, start:end] = True
        if mistake == "first copy too":
            predictable[b, first + 1:first + n] = True
        if mistake == "first copy instead":
            predictable[b] = False
            predictable[b, first + 1:first + n] = True
    if mistake == "float mask":
        predictable = predictable.float()
    if mistake == "int32":
        tokens = tokens.int()
    if mistake == "mask one short":
        predictable = predictable[:, 1:]
    return tokens, predictable


def segment_batch_vectorized(batch_size, seq_len, vocab_size, segment, generator):
    """Written differently: the gap between the copies drawn first, the copy made by gather."""
    lo, hi = segment
    n = torch.randint(lo, hi + 1, (batch_size,), generator=generator)
    room = seq_len - 2 * n  # free positions, shared by the start and the gap
    gap = (torch.rand(batch_size, generator=generator) * (room + 1)).floor().long()
    first = (torch.rand(batch_size, generator=generator) * (room - gap + 1)).floor().long()
    second = first + n + gap
    t = torch.arange(seq_len)
    inside = (t >= second[:, None]) & (t < (second + n)[:, None])
    tokens = torch.randint(vocab_size, (batch_size, seq_len), generator=generator)
    tokens = tokens.gather(1, torch.where(inside, t - (second - first)[:, None], t))
    return tokens, inside & (t != second[:, None])


def segment_batch_numbers_first(batch_size, seq_len, vocab_size, segment, generator):
    """Every position drawn before the tokens; the mask from a cumulative sum."""
    lo, hi = segment
    rows = []
    for _ in range(batch_size):
        n = torch.randint(lo, hi + 1, (), generator=generator).item()
        second = torch.randint(n, seq_len - n + 1, (), generator=generator).item()
        first = torch.randint(0, second - n + 1, (), generator=generator).item()
        rows.append((n, first, second))
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len), generator=generator)
    marks = torch.zeros(batch_size, seq_len + 1)
    for b, (n, first, second) in enumerate(rows):
        tokens[b, second:second + n] = tokens[b, first:first + n].clone()
        marks[b, second + 1] += 1
        marks[b, second + n] -= 1
    return tokens, marks.cumsum(1)[:, :seq_len] > 0


def test_repeated_segment_batch_passes_right_answers():
    expect_pass(checks.check_repeated_segment_batch(segment_batch))
    expect_pass(checks.check_repeated_segment_batch(segment_batch_vectorized))
    expect_pass(checks.check_repeated_segment_batch(segment_batch_numbers_first))


@pytest.mark.parametrize(("mistake", "words"), [
    ("first marked", ("copy's first token is marked",)),
    ("one past the end", ("off by one at the end", "token after the copy")),
    ("one short at the end", ("off by one at the end", "not marked")),
    ("shifted left", ("positions just before the predictable tokens",)),
    ("first copy too", ("first copy is marked too",)),
    ("first copy instead", ("first copy is marked instead of the second",)),
    ("float mask", ("torch.float32", "bool")),
    ("mask one short", ("shape (128, 31)", "one entry per token")),
    ("int32", ("torch.int32", "torch.long")),
    ("ids too high", ("ids 0 ... 63", "exclusive")),
    ("fixed offset", ("fixed offset", "position alone")),
    ("exclusive high", ("segment[1] = 10, never occurs", "both ends are included")),
    ("overlap", ("overlap",)),
    ("overlap in place", ("overlap",)),
    ("no copy", ("not a copy of an earlier segment", "tokens[b, second:second + n]")),
    ("global rng", ("global generator", "generator=generator")),
    ("own generator", ("same places", "generator of its own")),
])
def test_repeated_segment_batch_names_the_mistake(mistake, words):
    expect_fail(checks.check_repeated_segment_batch(lambda *a, m=mistake, **k: segment_batch(*a, **k, mistake=m)),
                *words)


def test_repeated_segment_batch_refuses_more():
    expect_fail(checks.check_repeated_segment_batch(
        lambda B, L, V, seg, generator: (lambda b: (b.tokens, b.predictable))(
            repeated_segments(B, L, V, seg, generator=generator))), "course's own answer")
    expect_fail(checks.check_repeated_segment_batch(lambda *a, **k: segment_batch(*a, **k)[::-1]), "pair is swapped",
                "return tokens, predictable")
    expect_fail(checks.check_repeated_segment_batch(lambda *a, **k: tuple(x.T for x in segment_batch(*a, **k))),
                "batch and positions swapped")

    def fixed_start(B, L, V, segment, generator):
        tokens, predictable = segment_batch_vectorized(B, L, V, segment, generator)
        return tokens, predictable  # a right answer, for contrast with the next one

    def copies_at_zero(B, L, V, segment, generator):
        lo, hi = segment
        tokens = torch.randint(V, (B, L), generator=generator)
        predictable = torch.zeros(B, L, dtype=torch.bool)
        for b in range(B):
            n = int(torch.randint(lo, hi + 1, (1,), generator=generator))
            second = n + int(torch.randint(L - 2 * n + 1, (1,), generator=generator))
            tokens[b, second:second + n] = tokens[b, :n].clone()
            predictable[b, second + 1:second + n] = True
        return tokens, predictable

    expect_pass(checks.check_repeated_segment_batch(fixed_start))
    expect_fail(checks.check_repeated_segment_batch(copies_at_zero), "first copy starts at position 0 in every row")

    def in_place(B, L, V, segment, generator):
        return segment_batch(B, L, V, segment, generator)

    expect_pass(checks.check_repeated_segment_batch(in_place))


# ------------------------------------------------------------------ 8.2 scores


def prev_diagonal(weights):
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))


def prev_by_mask(weights):
    """Written differently: a 0/1 matrix on key t - 1, summed over the keys, then averaged."""
    L = weights.size(-1)
    ones = torch.ones(L, L, dtype=weights.dtype, device=weights.device)
    below = ones.tril(-1) - ones.tril(-2)
    per_query = (weights * below).sum(-1)[:, :, 1:]  # (B, H, L - 1)
    return per_query.sum(dim=(0, 2)) / (per_query.size(0) * per_query.size(2))


def prev_loop(weights):
    """A Python loop over the queries that stays in autograd."""
    picks = [weights[:, :, t, t - 1] for t in range(1, weights.size(-1))]  # each (B, H)
    return torch.stack(picks).mean(dim=(0, 1))


def test_previous_token_score_passes_right_answers():
    for fn in (prev_diagonal, prev_by_mask, prev_loop):
        expect_pass(checks.check_previous_token_score(fn))


def diag_mean(w, offset, start=0, dims=(0, 2)):
    return w.diagonal(offset=offset, dim1=-2, dim2=-1)[..., start:].mean(dim=dims)


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda w: torch.stack([w[:, :, t, t - 1] for t in range(w.size(-1))]).mean(dim=(0, 1)), ("query 0",)),
    (lambda w: diag_mean(w, 0, 1), ("wrong diagonal", "query t -> key t")),
    (lambda w: diag_mean(w, 0), ("wrong diagonal", "query t -> key t")),
    (lambda w: diag_mean(w, 1), ("wrong diagonal", "t + 1")),
    (lambda w: (w * torch.ones_like(w[0, 0]).tril(-1).triu(-1)).mean(dim=(0, 2, 3)), ("averaged over the keys",)),
    (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).sum(dim=(0, 2)), ("sum instead of a mean",)),
    (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(1, 2)), ("per sequence",)),
    (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=2), ("one per sequence and head",)),
    (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).mean(), ("one number for all heads",)),
    (lambda w: prev_diagonal(w).double(), ("dtype torch.float64 for weights of dtype torch.float32", "keep that dtype")),
    (lambda w: torch.tensor(prev_diagonal(w).tolist(), dtype=w.dtype), ("autograd",)),
    (lambda w: prev_diagonal(w.detach()), ("autograd",)),
    (lambda w: previous_token_score(w), ("course's own answer",)),
])
def test_previous_token_score_names_the_mistake(wrong, words):
    expect_fail(checks.check_previous_token_score(wrong), *words)


def test_previous_token_score_refuses_in_place_changes():
    def in_place(w):
        w[..., 0, 0] = 0.0
        return prev_diagonal(w)

    expect_fail(checks.check_previous_token_score(in_place), "in place")


def induction_gather(weights, batch):
    B, H, L, _ = weights.shape
    t = torch.arange(L, device=weights.device)
    second, first, length = (p.to(weights.device)[:, None] for p in (batch.second, batch.first, batch.length))
    queries = (t >= second) & (t <= second + length - 2)  # (B, L)
    keys = torch.where(queries, t - second + first + 1, 0)  # (B, L)
    picked = weights.gather(-1, keys[:, None, :, None].expand(B, H, L, 1)).squeeze(-1)  # (B, H, L)
    return (picked * queries[:, None]).sum(dim=(0, 2)) / queries.sum()


def induction_from_predictable(weights, batch):
    """Written differently: the queries are the predictable tokens moved one position back."""
    queries = batch.predictable.roll(-1, dims=1)  # second ... second + n - 2
    L = weights.size(-1)
    keys = torch.arange(L, device=weights.device) - (batch.second - batch.first)[:, None] + 1  # the offset diagonal
    b, t = queries.nonzero(as_tuple=True)
    return weights[b, :, t, keys[b, t]].mean(dim=0)  # (number of queries, H) -> (H,)


def induction_loop(weights, batch):
    picks = []
    for b in range(weights.size(0)):
        f, s, n = int(batch.first[b]), int(batch.second[b]), int(batch.length[b])
        picks += [weights[b, :, s + i, f + i + 1] for i in range(n - 1)]
    return torch.stack(picks).mean(dim=0)


def test_induction_score_passes_right_answers():
    for fn in (induction_gather, induction_from_predictable, induction_loop):
        expect_pass(checks.check_induction_score(fn))


def induction_with(weights, batch, *, queries="copy", key_shift=1, reduce="pooled"):
    B, H, L, _ = weights.shape
    t = torch.arange(L)
    s, f, n = batch.second[:, None], batch.first[:, None], batch.length[:, None]
    q = {"copy": (t >= s) & (t <= s + n - 2), "with last": (t >= s) & (t <= s + n - 1),
         "predictable": batch.predictable}[queries]
    keys = torch.where(q, t - s + f + key_shift, 0)
    picked = weights.gather(-1, keys[:, None, :, None].expand(B, H, L, 1)).squeeze(-1) * q[:, None]
    if reduce == "sum":
        return picked.sum(dim=(0, 2))
    if reduce == "per row":
        return (picked.sum(2) / q.sum(1, keepdim=True)).mean(0)
    if reduce == "all positions":
        return picked.mean(dim=(0, 2))
    if reduce == "per batch":
        return picked.sum(dim=(1, 2)) / (H * q.sum(1))
    return picked.sum(dim=(0, 2)) / q.sum()


def induction_offset_diagonal(weights, batch):
    B, H, L, _ = weights.shape
    t = torch.arange(L)
    keys = t - (batch.second - batch.first)[:, None] + 1
    ok = keys >= 0
    picked = weights.gather(-1, keys.clamp(min=0)[:, None, :, None].expand(B, H, L, 1)).squeeze(-1) * ok[:, None]
    return picked.sum(dim=(0, 2)) / ok.sum()


@pytest.mark.parametrize(("wrong", "words"), [
    (lambda w, b: induction_with(w, b, key_shift=0), ("duplicate-token head", "first + i + 1")),
    (lambda w, b: induction_with(w, b, queries="with last"), ("last query",)),
    (lambda w, b: induction_with(w, b, queries="predictable"), ("predictable tokens", "one position late")),
    (induction_offset_diagonal, ("every query on the offset diagonal",)),
    (lambda w, b: induction_with(w, b, reduce="all positions"), ("every position",)),
    (lambda w, b: induction_with(w, b, reduce="sum"), ("sum instead of a mean",)),
    (lambda w, b: induction_with(w, b, reduce="per row"), ("each sequence's queries were averaged first",)),
    (lambda w, b: induction_with(w, b, reduce="per batch"), ("per sequence",)),
    (lambda w, b: induction_gather(w, b).double(), ("dtype torch.float64",)),
    (lambda w, b: induction_gather(w.detach(), b), ("autograd",)),
    (lambda w, b: induction_score(w, b), ("course's own answer",)),
])
def test_induction_score_names_the_mistake(wrong, words):
    expect_fail(checks.check_induction_score(wrong), *words)


# ------------------------------------------------------------------ 8.3 ablation losses


def ablation(model, batch):
    rows = []
    with torch.no_grad():
        for layer in model.layers:
            row = []
            for h in range(layer.num_heads):
                with silence_heads(layer, [h]):
                    row.append(losses(model(batch.tokens), batch)[1])
            rows.append(torch.stack(row))
    return torch.stack(rows)


def ablation_by_hand(model, batch):
    """Written differently: cross-entropy on the predictable tokens, a table filled in place."""
    out = torch.empty(model.num_layers, model.num_heads, dtype=next(model.parameters()).dtype)
    target = batch.predictable[:, 1:]
    for l in range(model.num_layers):
        for h in range(model.num_heads):
            with silence_heads(model.layers[l], [h]), torch.no_grad():
                logits = model(batch.tokens)[:, :-1]
            out[l, h] = F.cross_entropy(logits[target], batch.tokens[:, 1:][target])
    return out


def ablation_with_grad(model, batch):
    """Gradients left on (no no_grad): the table keeps a grad_fn, which is fine."""
    return torch.stack([torch.stack([_loss_silenced(model, batch, l, h) for h in range(model.num_heads)])
                        for l in range(model.num_layers)])


def _loss_silenced(model, batch, l, h, heads=None, which=1):
    with silence_heads(model.layers[l], [h] if heads is None else heads):
        return losses(model(batch.tokens), batch)[which]


def test_ablation_losses_passes_right_answers():
    for fn in (ablation, ablation_by_hand, ablation_with_grad):
        expect_pass(checks.check_ablation_losses(fn))


def table(model, batch, entry):
    with torch.no_grad():
        return torch.stack([torch.stack([entry(l, h) for h in range(model.num_heads)]) for l in range(model.num_layers)])


def whole_layer(model, batch):
    return table(model, batch, lambda l, h: _loss_silenced(model, batch, l, h, heads=range(model.num_heads)))


def all_tokens(model, batch):
    return table(model, batch, lambda l, h: _loss_silenced(model, batch, l, h, which=0))


def not_shifted(model, batch):
    def entry(l, h):
        with silence_heads(model.layers[l], [h]):
            logits = model(batch.tokens)
        return F.cross_entropy(logits[batch.predictable], batch.tokens[batch.predictable])

    return table(model, batch, entry)


def difference(model, batch):
    with torch.no_grad():
        intact = losses(model(batch.tokens), batch)[1]
    return ablation(model, batch) - intact


def layer_zero(model, batch):
    return table(model, batch, lambda l, h: _loss_silenced(model, batch, 0, h))


def nothing_silenced(model, batch):
    return table(model, batch, lambda l, h: losses(model(batch.tokens), batch)[1])


def hook_left(model, batch):
    """Its own hooks, never removed: each silences one more head, and they stay on the model."""
    rows = []
    with torch.no_grad():
        for layer in model.layers:
            d_k = layer.d_k
            row = []
            for h in range(layer.num_heads):
                def zero(module, args, h=h):
                    x = args[0].clone()
                    x[..., h * d_k:(h + 1) * d_k] = 0
                    return (x,)

                layer.W_o.register_forward_pre_hook(zero)  # the handle is dropped: never removed
                row.append(losses(model(batch.tokens), batch)[1])
            rows.append(torch.stack(row))
    return torch.stack(rows)


def train_mode(model, batch):
    model.train()
    return ablation(model, batch)


def zeroes_weights(model, batch):
    out = ablation(model, batch)
    with torch.no_grad():
        model.layers[0].W_o.weight[:, 0] = 0.0
    return out


def grad_off(model, batch):
    torch.set_grad_enabled(False)
    return ablation(model, batch)


def backward_left(model, batch):
    out = ablation_with_grad(model, batch)
    out.sum().backward()
    return out.detach()


def as_python_floats(model, batch):
    return torch.tensor(ablation(model, batch).tolist())  # float32, whatever the model's dtype


@pytest.mark.parametrize(("wrong", "words"), [
    (whole_layer, ("whole layer", "[h]")),
    (all_tokens, ("all tokens", "predictable")),
    (not_shifted, ("wrong position", "t + 1")),
    (difference, ("increase over the intact model's loss",)),
    (layer_zero, ("layer 0",)),
    (nothing_silenced, ("nothing was silenced", "inside")),
    (lambda m, b: ablation(m, b).T, ("transposed", "(num_layers, h)")),
    (lambda m, b: ablation(m, b).flatten(), ("expected (num_layers, h)", "one row per layer")),
    (hook_left, ("left a hook", "with silence_heads")),
    (train_mode, ("training mode",)),
    (zeroes_weights, ("changed the model's parameters",)),
    (grad_off, ("gradients switched off", "with torch.no_grad()")),
    (backward_left, ("gradients in the model's parameters",)),
    (as_python_floats, ("dtype torch.float32 for a model of dtype torch.float64", "torch.stack")),
])
def test_ablation_losses_names_the_mistake(wrong, words):
    try:
        expect_fail(checks.check_ablation_losses(wrong), *words)
    finally:
        torch.set_grad_enabled(True)
    assert torch.is_grad_enabled()


def test_ablation_losses_swapped_values_are_named():
    # With as many heads as layers the shape can't tell: the values do (the second case, 2 x 2).
    def swapped_when_square(model, batch):
        out = ablation(model, batch)
        return out.T if out.shape[0] == out.shape[1] else out

    expect_fail(checks.check_ablation_losses(swapped_when_square), "rows and columns are swapped")


def test_the_checks_leave_the_random_state_and_the_threads_alone():
    torch.manual_seed(3)
    before = torch.rand(1)
    torch.manual_seed(3)
    checks.check_repeated_segment_batch(segment_batch)
    threads = torch.get_num_threads()
    checks.check_ablation_losses(ablation)  # runs its small models on one thread, then restores the count
    assert torch.equal(torch.rand(1), before) and torch.get_num_threads() == threads


def test_score_checks_name_a_tensor_made_on_the_cpu():
    """Right on the CPU, a crash on a GPU: the checks run the function once more on the meta device.
    An answer that reads values there (int(...), nonzero) can't be run on it and is not judged."""
    def prev_careless(weights):
        L = weights.size(-1)
        return (weights * torch.diag(torch.ones(L - 1, dtype=weights.dtype), -1)).sum(-1)[..., 1:].mean(dim=(0, 2))

    expect_fail(checks.check_previous_token_score(prev_careless), "device 'meta'", "it is the device that fails",
                "device=weights.device", status="error")
    careless = lambda w, b: induction_score_with(w, b, torch.arange(w.size(-1)))  # noqa: E731
    expect_fail(checks.check_induction_score(careless), "device 'meta'", "batch.first.to(weights.device)",
                status="error")
    expect_pass(checks.check_induction_score(induction_loop))  # reads values: not judged on the meta device


def induction_score_with(weights, batch, t):
    """induction_gather with the positions ``t`` given (on whatever device they were made)."""
    B, H, L, _ = weights.shape
    second, first, length = (p.to(weights.device)[:, None] for p in (batch.second, batch.first, batch.length))
    queries = (t >= second) & (t <= second + length - 2)  # (B, L)
    keys = torch.where(queries, t - second + first + 1, 0)  # (B, L)
    picked = weights.gather(-1, keys[:, None, :, None].expand(B, H, L, 1)).squeeze(-1)  # (B, H, L)
    return (picked * queries[:, None]).sum(dim=(0, 2)) / queries.sum()


# ------------------------------------------------------------------ 8.4 the token, position and bias parts

PART_CHECKS = [checks.check_head_parts]


@pytest.mark.parametrize("check", PART_CHECKS, ids=lambda c: c.__name__)
def test_part_checks_read_a_stub_as_not_implemented(check):
    def stub(*args, **kwargs):
        raise NotImplementedError

    result = check(stub)
    assert result.status == "not implemented" and str(result).startswith("⏳"), result


@pytest.mark.parametrize("check", PART_CHECKS, ids=lambda c: c.__name__)
def test_part_checks_never_crash_on_garbage(check):
    for garbage in (lambda *a, **k: "nonsense", lambda *a, **k: 1 / 0, 42, lambda *a, **k: None,
                    lambda *a, **k: (torch.zeros(1), torch.zeros(1), torch.zeros(1)), lambda *a, **k: torch.zeros(2, 2),
                    lambda *a, **k: {"token": torch.zeros(2)}, lambda *a, **k: torch.full((3, 2, 2, 2), math.nan),
                    lambda *a, **k: (None, None, None), lambda *a, **k: 0.5):
        result = check(garbage)
        assert isinstance(result, CheckResult) and not result, result
        assert "bug in mha_lib.checks" not in str(result), result


def _weights_of(model, tokens):
    """Both layers' attention weights, in evaluation mode, the mode put back."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return model(tokens, return_weights=True)[1]
    finally:
        model.train(was_training)


def parts_with(model, tokens, head, *, mistake=None):
    """A learner-style split, with switches for the classic mistakes."""
    layer = model.layers[0]
    B, L = tokens.shape
    H, d_k = layer.num_heads, layer.d_k
    if mistake == "train mode":
        with torch.no_grad():
            weights = model(tokens, return_weights=True)[1]
    elif mistake == "eval left":
        model.eval()
        with torch.no_grad():
            weights = model(tokens, return_weights=True)[1]
    else:
        weights = _weights_of(model, tokens)
    A = weights[1 if mistake == "layer 2" else 0][:, (head + 1) % H if mistake == "other head" else head]
    if mistake in ("no attention", "uniform", "no weights", "no mask", "no scale"):
        causal = torch.ones(L, L, dtype=torch.bool, device=tokens.device).tril()
        if mistake == "no attention":
            A = torch.eye(L, dtype=A.dtype).expand(B, L, L)
        elif mistake == "uniform":
            A = (causal / causal.sum(-1, keepdim=True)).to(A.dtype).expand(B, L, L)
        elif mistake == "no weights":
            A = causal.to(A.dtype).expand(B, L, L)
        else:
            x = model.embed(tokens)
            rows = slice(head * d_k, (head + 1) * d_k)
            q, k = layer.W_q(x)[..., rows], layer.W_k(x)[..., rows]
            scores = q @ k.transpose(-2, -1) / (1.0 if mistake == "no scale" else math.sqrt(d_k))
            if mistake == "no scale":
                scores = scores.masked_fill(~causal, float("-inf"))
            A = scores.softmax(-1).detach()
    start = head if mistake == "slice" else head * d_k
    rows = slice(start, start + d_k)
    v_rows = slice(((head + 1) % H) * d_k, ((head + 2) % H) * d_k or H * d_k) if mistake == "W_v other head" else rows
    o_rows = slice(((head + 1) % H) * d_k, ((head + 2) % H) * d_k or H * d_k) if mistake == "W_o other head" else rows
    W_v, b_v = layer.W_v.weight[v_rows], layer.W_v.bias[v_rows]  # (d_k, D), (d_k,)
    if mistake == "W_v columns":
        W_v = layer.W_v.weight[:, rows].T
    W_o = layer.W_o.weight[:, o_rows]  # (D, d_k)
    if mistake == "W_o rows":
        W_o = layer.W_o.weight[rows, :].T
    E = model.token_embedding(tokens)
    P = {"all rows": lambda: model.position_embedding, "last rows": lambda: model.position_embedding[-L:],
         "by token": lambda: model.position_embedding[tokens]}.get(mistake, lambda: model.position_embedding[:L])()
    if mistake == "embed":
        E = model.embed(tokens)
    token = A @ (E @ W_v.T @ W_o.T)
    position = A @ (P @ W_v.T @ W_o.T)
    bias = (b_v @ W_o.T).expand(B, L, -1)
    b_o = layer.W_o.bias
    if mistake == "b_o in bias":
        bias = bias + b_o
    if mistake == "b_o in token":
        token = token + b_o
    if mistake == "b_v forgotten":
        bias = torch.zeros_like(bias)
    if mistake == "b_v in token":
        token, bias = token + bias, torch.zeros_like(bias)
    if mistake == "b_v summed":
        bias = torch.arange(1, L + 1, dtype=bias.dtype, device=bias.device)[:, None] * bias
    if mistake == "cpu zeros":
        bias = torch.zeros(B, L, bias.size(-1), dtype=bias.dtype) + bias
    if mistake == "float32":
        token, position, bias = token.float(), position.float(), bias.float()
    if mistake == "swapped":
        return position, token, bias
    if mistake == "bias vector":
        return token, position, b_v @ W_o.T
    return token, position, bias


def parts_by_hand(model, tokens, head):
    """Written differently: the attention recomputed from the weights, einsum, one call of the values."""
    layer = model.layers[0]
    B, L = tokens.shape
    d_k = layer.d_k
    hs = slice(head * d_k, (head + 1) * d_k)
    x = model.token_embedding(tokens) + model.position_embedding[:L]  # (B, L, D)
    q = x @ layer.W_q.weight[hs].T + layer.W_q.bias[hs]
    k = x @ layer.W_k.weight[hs].T + layer.W_k.bias[hs]
    scores = torch.einsum("bqk,bsk->bqs", q, k) / d_k ** 0.5
    future = torch.triu(torch.ones(L, L, dtype=torch.bool, device=tokens.device), diagonal=1)
    A = scores.masked_fill(future, float("-inf")).softmax(dim=-1)  # no dropout: never in training mode
    W_ov = layer.W_v.weight[hs].T @ layer.W_o.weight[:, hs].T  # (D, D)
    token = torch.einsum("bqs,bsd->bqd", A, model.token_embedding(tokens) @ W_ov)
    position = torch.einsum("bqs,sd->bqd", A, model.position_embedding[:L] @ W_ov)
    bias = (layer.W_v.bias[hs] @ layer.W_o.weight[:, hs].T).repeat(B, L, 1)
    return token.detach(), position.detach(), bias.detach()


def parts_by_difference(model, tokens, head):
    """Written differently: the bias part as what is left of the head's output, a dict returned."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            _, weights = model(tokens, return_weights=True)
            total = model.head_outputs(tokens)[0][:, head]
            layer = model.layers[0]
            W = layer.W_v.weight.view(layer.num_heads, layer.d_k, -1)[head]  # (d_k, D)
            O = layer.W_o.weight.view(-1, layer.num_heads, layer.d_k)[:, head]  # (D, d_k)
            A = weights[0][:, head]
            token = torch.bmm(A, torch.nn.functional.linear(torch.nn.functional.linear(model.token_embedding(tokens), W), O))
            position = A @ torch.nn.functional.linear(torch.nn.functional.linear(model.position_embedding[:tokens.size(1)], W), O)
    finally:
        model.train(was_training)
    return {"token": token, "position": position, "bias": total - token - position}


def test_head_parts_passes_right_answers():
    for fn in (parts_with, parts_by_hand, parts_by_difference):
        expect_pass(checks.check_head_parts(fn))


@pytest.mark.parametrize(("mistake", "words"), [
    ("b_o in bias", ("W_o's bias was added to the bias part", "belongs to no head")),
    ("b_o in token", ("W_o's bias was added to the token or the position part",)),
    ("b_v forgotten", ("W_v's bias was left out",)),
    ("b_v in token", ("W_v's bias was counted in the token or the position part",)),
    ("b_v summed", ("W_v's bias was summed over the keys without the attention weights",)),
    ("last rows", ("position rows don't line up with the tokens", "[:L]")),
    ("by token", ("looked up by token id",)),
    ("other head", ("attention weights of another head", "weights[0][:, head]")),
    ("layer 2", ("attention weights of layer 2",)),
    ("no attention", ("not applied",)),
    ("uniform", ("uniform attention weights",)),
    ("no weights", ("values were summed over the keys without the attention weights",)),
    ("no mask", ("causal mask was left out",)),
    ("no scale", ("sqrt(d_k)",)),
    ("W_o other head", ("W_o's columns of another head",)),
    ("W_v other head", ("W_v's rows (and b_v) of another head",)),
    ("slice", ("head : head + d_k",)),
    ("W_o rows", ("W_o was not transposed",)),
    ("W_v columns", ("W_v's columns were sliced",)),
    ("embed", ("token part read the positions too", "model.token_embedding(tokens)")),
    ("swapped", ("wrong order", "token, position, bias")),
    ("train mode", ("training mode", "dropout")),
    ("eval left", ("changed the mode", "model.train(was_training)")),
    ("float32", ("dtype torch.float32", "torch.float64")),
    ("bias vector", ("bias part", "expand")),
])
def test_head_parts_names_the_mistake(mistake, words):
    expect_fail(checks.check_head_parts(lambda m, t, h, k=mistake: parts_with(m, t, h, mistake=k)), *words)


def test_head_parts_names_state_and_device_mistakes():
    expect_fail(checks.check_head_parts(lambda m, t, h: parts_with(m, t, h, mistake="all rows")),
                "max_len tokens", "model.position_embedding[:L]", status="error")
    expect_fail(checks.check_head_parts(lambda m, t, h: parts_with(m, t, h, mistake="cpu zeros")),
                "device 'meta'", "device=tokens.device", status="error")

    def every_head(model, tokens, head):
        token, position, bias = parts_with(model, tokens, head)
        return token[:, None].expand(-1, model.num_heads, -1, -1), position, bias

    expect_fail(checks.check_head_parts(every_head), "every head's", "[:, head]")

    def frozen(model, tokens, head):
        for p in model.parameters():
            p.requires_grad_(False)
        return parts_with(model, tokens, head)

    expect_fail(checks.check_head_parts(frozen), "requires_grad")

    def hook_left(model, tokens, head):
        model.layers[0].W_o.register_forward_pre_hook(lambda module, args: None)
        return parts_with(model, tokens, head)

    expect_fail(checks.check_head_parts(hook_left), "left a hook")

    def zeroes_w_o_bias(model, tokens, head):  # "so that W_o's bias stays out of it"
        with torch.no_grad():
            model.layers[0].W_o.bias.zero_()
        return parts_with(model, tokens, head)

    expect_fail(checks.check_head_parts(zeroes_w_o_bias), "changed the model's parameters")

    def grad_off(model, tokens, head):
        torch.set_grad_enabled(False)
        return parts_with(model, tokens, head)

    try:
        expect_fail(checks.check_head_parts(grad_off), "gradients switched off")
    finally:
        torch.set_grad_enabled(True)

    cache = {}

    def remembers(model, tokens, head):
        key = (id(model), tuple(tokens.shape), head)
        if key not in cache:
            cache[key] = parts_with(model, tokens, head)
        return cache[key]

    expect_fail(checks.check_head_parts(remembers), "remembers an earlier call")
    from mha_lib.induction import circuits

    expect_fail(checks.check_head_parts(
        lambda m, t, h: tuple(v[:, h] for v in circuits.head_parts(m, t).values())), "course's own answer")


# ------------------------------------------------------------------ 8.5 the OV circuit and the copying score


def ov_circuit(model, layer, head):
    attention = model.layers[layer]
    rows = slice(head * attention.d_k, (head + 1) * attention.d_k)
    W_U, E = model.unembed.weight, model.token_embedding.weight
    return W_U @ attention.W_o.weight[:, rows] @ attention.W_v.weight[rows] @ E.T


def copying_score(model, layer, head):
    circuit = ov_circuit(model, layer, head)
    own = torch.arange(circuit.size(0), device=circuit.device)
    return (circuit.argmax(dim=0) == own).float().mean().item()


def ov_circuit_rows_first(model, layer, head):
    """Written differently: the transposed product (row b = source token) built from views, transposed back."""
    attention = model.layers[layer]
    H, d_k, D = attention.num_heads, attention.d_k, attention.d_model
    W_v = attention.W_v.weight.view(H, d_k, D)[head]  # (d_k, D)
    W_o = attention.W_o.weight.view(D, H, d_k)[:, head]  # (D, d_k)
    with torch.no_grad():
        by_source = model.token_embedding.weight @ W_v.T @ W_o.T @ model.unembed.weight.T  # (V, V): [b, a]
    return by_source.T.contiguous()


def copying_score_by_rows(model, layer, head):
    """Written differently: the transposed circuit, the maximum of each row compared with its diagonal, a tensor."""
    by_source = ov_circuit_rows_first(model, layer, head).T  # [b, a]
    return (by_source.diagonal() == by_source.max(dim=1).values).to(by_source.dtype).mean()


def copying_score_loop(model, layer, head):
    circuit = ov_circuit(model, layer, head).detach()
    V = circuit.size(0)
    return sum(int(torch.argmax(circuit[:, b]) == b) for b in range(V)) / V


def test_copying_score_passes_right_answers():
    for fn in (ov_circuit, ov_circuit_rows_first):
        expect_pass(checks.check_ov_circuit(fn))
    for fn in (copying_score, copying_score_by_rows, copying_score_loop):
        expect_pass(checks.check_copying_score(fn))


def circuit_with(model, layer, head, *, mistake=None):
    """A learner-style circuit, with switches for the classic mistakes."""
    attention = model.layers[(layer + 1) % model.num_layers if mistake == "other layer" else layer]
    H, d_k = attention.num_heads, attention.d_k
    h = (head + 1) % H if mistake == "other head" else head
    rows = slice(h * d_k, (h + 1) * d_k) if mistake != "slice" else slice(h, h + d_k)
    W_v, W_o = attention.W_v.weight[rows], attention.W_o.weight[:, rows]
    if mistake == "W_o rows":
        W_o = attention.W_o.weight[rows, :].T
    if mistake == "W_v columns":
        W_v = attention.W_v.weight[:, rows].T
    if mistake == "whole layer":
        W_v, W_o = attention.W_v.weight, attention.W_o.weight
    E = model.token_embedding.weight
    if mistake == "positions":
        E = E + model.position_embedding[0]
    W_U = model.unembed.weight
    if mistake == "transposed":
        return E @ W_v.T @ W_o.T @ W_U.T
    if mistake == "E untransposed":
        return W_U @ W_o @ W_v @ E
    values = W_v @ E.T
    if mistake == "b_v":
        values = values + attention.W_v.bias[rows][:, None]
    written = W_o @ values
    if mistake == "b_o":
        written = written + attention.W_o.bias[:, None]
    circuit = W_U @ written
    if mistake == "b_U":
        circuit = circuit + model.unembed.bias[:, None]
    if mistake == "softmax":
        circuit = circuit.softmax(dim=0)
    if mistake == "scaled":
        circuit = circuit / math.sqrt(d_k)
    if mistake == "float64":
        circuit = circuit.double()
    if mistake == "cpu":
        circuit = circuit + torch.zeros(circuit.shape, dtype=circuit.dtype)
    return circuit


@pytest.mark.parametrize(("mistake", "words"), [
    ("transposed", ("transposed", "[b, a]")),
    ("E untransposed", ("untransposed",)),
    ("b_v", ("W_v's bias was included",)),
    ("b_o", ("W_o's bias was included",)),
    ("b_U", ("unembedding's bias was included",)),
    ("positions", ("positional embeddings were added to E",)),
    ("other head", ("slices of another head",)),
    ("other layer", ("other layer",)),
    ("slice", ("head : head + d_k",)),
    ("W_o rows", ("W_o's rows",)),
    ("W_v columns", ("W_v's columns",)),
    ("whole layer", ("whole layer",)),
    ("softmax", ("softmax was applied",)),
    ("scaled", ("1 / sqrt(d_k)",)),
    ("float64", ("dtype torch.float64",)),
])
def test_ov_circuit_names_the_mistake(mistake, words):
    expect_fail(checks.check_ov_circuit(lambda m, l, h, k=mistake: circuit_with(m, l, h, mistake=k)), *words)


def score_with(model, layer, head, *, mistake=None, circuit=None):
    """A learner-style score, with switches for the classic mistakes (on a right circuit unless one is given)."""
    C = (circuit or ov_circuit)(model, layer, head).detach()
    V = C.size(0)
    own = torch.arange(V)
    if mistake == "row":
        return (C.argmax(dim=1) == own).float().mean().item()
    if mistake == "count":
        return int((C.argmax(dim=0) == own).sum())
    if mistake == "positive":
        return (C.diagonal() > 0).float().mean().item()
    if mistake == "above mean":
        return (C.diagonal() > C.mean(dim=0)).float().mean().item()
    if mistake == "diagonal mean":
        return C.diagonal().mean().item()
    if mistake == "row softmax":
        return (C.softmax(dim=1).argmax(dim=0) == own).float().mean().item()
    if mistake == "other layer":
        return copying_score(model, (layer + 1) % model.num_layers, head)
    if mistake == "other head":
        return copying_score(model, layer, (head + 1) % model.num_heads)
    if mistake == "tensor of V":
        return (C.argmax(dim=0) == own).float()
    return (C.argmax(dim=0) == own).float().mean().item()


@pytest.mark.parametrize(("mistake", "words"), [
    ("row", ("compared with its row",)),
    ("count", ("number of tokens, not their share",)),
    ("positive", ("positive diagonal entries",)),
    ("above mean", ("column's mean",)),
    ("diagonal mean", ("mean of the diagonal",)),
    ("row softmax", ("softmax over each row",)),
    ("other layer", ("other layer",)),
    ("other head", ("another head",)),
    ("tensor of V", ("shape (12,)", "one number")),
])
def test_copying_score_names_the_mistake(mistake, words):
    expect_fail(checks.check_copying_score(lambda m, l, h, k=mistake: score_with(m, l, h, mistake=k)), *words)


@pytest.mark.parametrize(("mistake", "words"), [
    ("b_U", ("unembedding's bias", "your copying_score builds")),
    ("positions", ("positional embeddings", "your copying_score builds")),
    ("transposed", ("compared with its row",)),
])
def test_copying_score_names_a_mistake_in_its_own_circuit(mistake, words):
    own = lambda m, l, h, k=mistake: score_with(m, l, h, circuit=lambda *a: circuit_with(*a, mistake=k))  # noqa: E731
    expect_fail(checks.check_copying_score(own), *words)


def test_copying_score_names_state_and_device_mistakes():
    def cpu_arange(model, layer, head):
        C = ov_circuit(model, layer, head)
        return (C.argmax(dim=0) == torch.arange(C.size(0))).float().mean().item()

    expect_fail(checks.check_copying_score(cpu_arange), "device 'meta'", "device=circuit.device", status="error")
    expect_fail(checks.check_ov_circuit(lambda m, l, h: circuit_with(m, l, h, mistake="cpu")), "device 'meta'",
                status="error")

    def frozen(model, layer, head):
        for p in model.parameters():
            p.requires_grad_(False)
        return ov_circuit(model, layer, head).detach()

    expect_fail(checks.check_ov_circuit(frozen), "requires_grad")

    def eval_left(model, layer, head):
        model.eval()
        return ov_circuit(model, layer, head)

    expect_fail(checks.check_ov_circuit(eval_left), "changed the mode")
    cache = {}

    def remembers(model, layer, head):
        key = (id(model), layer, head)
        if key not in cache:
            cache[key] = copying_score(model, layer, head)
        return cache[key]

    expect_fail(checks.check_copying_score(remembers), "before the weights changed")
    circuits_seen = {}

    def remembers_circuit(model, layer, head):
        key = (id(model), layer, head)
        if key not in circuits_seen:
            circuits_seen[key] = ov_circuit(model, layer, head)
        return circuits_seen[key]

    expect_fail(checks.check_ov_circuit(remembers_circuit), "before the weights changed")
    from mha_lib.induction import circuits

    expect_fail(checks.check_ov_circuit(circuits.ov_circuit), "course's own answer")
    expect_fail(checks.check_copying_score(circuits.copying_score), "course's own answer")

    def stub_circuit(model, layer, head):
        raise NotImplementedError

    result = checks.check_copying_score(lambda m, l, h: score_with(m, l, h, circuit=stub_circuit))
    assert result.status == "not implemented" and "stub_circuit" in str(result), result


@pytest.mark.parametrize("check", [checks.check_ov_circuit, checks.check_copying_score], ids=lambda c: c.__name__)
def test_copying_checks_read_stubs_and_survive_garbage(check):
    def stub(*args, **kwargs):
        raise NotImplementedError

    result = check(stub)
    assert result.status == "not implemented" and str(result).startswith("⏳"), result
    for garbage in (lambda *a, **k: "nonsense", lambda *a, **k: 1 / 0, 42, lambda *a, **k: None,
                    lambda *a, **k: torch.zeros(2, 2), lambda *a, **k: math.nan, lambda *a, **k: [0.5],
                    lambda *a, **k: torch.full((12, 12), math.nan, dtype=torch.float64), lambda *a, **k: True):
        result = check(garbage)
        assert isinstance(result, CheckResult) and not result, result
        assert "bug in mha_lib.checks" not in str(result), result


# ------------------------------------------------------------------ held-out gallery of issues 32/34: more named slips


def _rows(batch_size, seq_len, vocab_size, segment, generator, place):
    """A batch whose copy positions come from `place(n, b, generator) -> (first, second)`."""
    lo, hi = segment
    tokens = torch.randint(vocab_size, (batch_size, seq_len), generator=generator)
    predictable = torch.zeros(batch_size, seq_len, dtype=torch.bool)
    for b in range(batch_size):
        n = int(torch.randint(lo, hi + 1, (), generator=generator))
        first, second = place(n, seq_len, generator)
        tokens[b, second:second + n] = tokens[b, first:first + n].clone()
        predictable[b, second + 1:second + n] = True
    return tokens, predictable


def adjacent_copies(batch_size, seq_len, vocab_size, segment, generator):  # second is never drawn
    def place(n, L, g):
        first = int(torch.randint(0, L - 2 * n + 1, (), generator=g))
        return first, first + n
    return _rows(batch_size, seq_len, vocab_size, segment, generator, place)


def one_place_for_the_batch(batch_size, seq_len, vocab_size, segment, generator):
    drawn = {}

    def place(n, L, g):  # drawn once, then only moved where the row's length doesn't fit
        if not drawn:
            drawn["first"] = int(torch.randint(0, L - 2 * n + 1, (), generator=g))
            drawn["second"] = int(torch.randint(drawn["first"] + n, L - n + 1, (), generator=g))
        first = min(drawn["first"], L - 2 * n)
        return first, max(min(drawn["second"], L - n), first + n)
    return _rows(batch_size, seq_len, vocab_size, segment, generator, place)


def test_repeated_segment_batch_names_copies_never_placed_per_row():
    expect_fail(checks.check_repeated_segment_batch(adjacent_copies), "right where the first ends",
                "second is not drawn")
    expect_fail(checks.check_repeated_segment_batch(one_place_for_the_batch), "one position was drawn for the "
                "whole batch")
    expect_pass(checks.check_repeated_segment_batch(segment_batch))


def test_score_checks_name_a_count_typed_in_a_key_one_off_and_a_length_typed_in():
    expect_fail(checks.check_previous_token_score(
        lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1).mean(0) / 23), "a number typed in", "L - 1")
    expect_fail(checks.check_induction_score(lambda w, b: induction_with(w, b, key_shift=2)),
                "the key is one position off")

    def length_four(weights, batch):
        B, H, L, _ = weights.shape
        t = torch.arange(L, device=weights.device)
        first, second = (x.to(weights.device)[:, None] for x in (batch.first, batch.second))
        queries = (t >= second) & (t <= second + 2) & (t - second + first + 1 < L)  # i = 0 ... 4 - 2
        keys = torch.where(queries, t - second + first + 1, 0)
        picked = weights.gather(-1, keys[:, None, :, None].expand(B, H, L, 1)).squeeze(-1)
        return (picked * queries[:, None]).sum(dim=(0, 2)) / queries.sum()

    expect_fail(checks.check_induction_score(length_four), "one number for every row", "batch.length")
    expect_pass(checks.check_previous_token_score(prev_diagonal))
    expect_pass(checks.check_induction_score(induction_loop))


def ablation_growing_list(model, batch):
    rows = []
    with torch.no_grad():
        for layer in model.layers:
            silenced, row = [], []
            for h in range(layer.num_heads):
                silenced.append(h)  # the list grows: heads 0 ... h
                with silence_heads(layer, silenced):
                    row.append(losses(model(batch.tokens), batch)[1])
            rows.append(torch.stack(row))
    return torch.stack(rows)


def ablation_shipped_sizes(model, batch):
    table = torch.zeros(2, 4, dtype=next(model.parameters()).dtype)
    with torch.no_grad():
        for l in range(min(2, len(model.layers))):
            for h in range(min(4, model.layers[l].num_heads)):
                with silence_heads(model.layers[l], [h]):
                    table[l, h] = losses(model(batch.tokens), batch)[1]
    return table


def test_ablation_losses_names_a_growing_list_and_the_shipped_sizes():
    expect_fail(checks.check_ablation_losses(ablation_growing_list), "the silenced heads added up")
    expect_fail(checks.check_ablation_losses(ablation_shipped_sizes), "the shipped model's (2 layers, 4 heads)",
                "typed in")
    expect_pass(checks.check_ablation_losses(ablation))


def make_parts_cached_on_the_head():
    cache = {}

    def parts(model, tokens, head):
        if head not in cache:
            cache[head] = tuple(p.detach().clone() for p in parts_by_hand(model, tokens, head))
        return cache[head]
    return parts


def parts_positions_reversed(model, tokens, head):
    token, _, bias = parts_by_hand(model, tokens, head)
    layer, L = model.layers[0], tokens.size(1)
    hs = slice(head * layer.d_k, (head + 1) * layer.d_k)
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            A = model(tokens, return_weights=True)[1][0][:, head]
    finally:
        model.train(was)
    position = A @ (model.position_embedding[:L].flip(0) @ layer.W_v.weight[hs].T @ layer.W_o.weight[:, hs].T)
    return token, position.detach(), bias


def test_head_parts_names_a_cache_on_the_head_and_positions_read_backwards():
    expect_fail(checks.check_head_parts(make_parts_cached_on_the_head()), "parts it returned for an earlier call",
                "a cache keyed on the head only")
    expect_fail(checks.check_head_parts(parts_positions_reversed), "the wrong rows of the position table")
    expect_pass(checks.check_head_parts(parts_by_hand))


def test_circuit_checks_name_an_empty_slice_a_percentage_and_no_wrong_transpose():
    def next_head(model, layer, head):  # 1-based thinking: the last head's slice is empty
        return ov_circuit(model, layer, head + 1) if head + 1 < model.num_heads else \
            model.unembed.weight @ model.layers[layer].W_o.weight[:, :0] @ model.layers[layer].W_v.weight[:0] \
            @ model.token_embedding.weight.T
    expect_fail(checks.check_ov_circuit(next_head), "wrong circuit")

    def empty_slice(model, layer, head):
        attention = model.layers[layer]
        rows = slice((head + attention.num_heads) * attention.d_k, (head + attention.num_heads + 1) * attention.d_k)
        return model.unembed.weight @ attention.W_o.weight[:, rows] @ attention.W_v.weight[rows] \
            @ model.token_embedding.weight.T
    expect_fail(checks.check_ov_circuit(empty_slice), "an empty slice", "all zeros")

    def without_w_o(model, layer, head):  # W_U (V, D) @ W_v^h (d_k, D): the product itself doesn't fit
        attention = model.layers[layer]
        rows = slice(head * attention.d_k, (head + 1) * attention.d_k)
        return model.unembed.weight @ attention.W_v.weight[rows] @ model.token_embedding.weight.T
    result = checks.check_ov_circuit(without_w_o)
    assert not result and "The transpose is the mistake" not in str(result), result  # E (V, V) is square here

    expect_fail(checks.check_copying_score(lambda m, l, h: 100 * copying_score(m, l, h)), "a percentage")
    expect_pass(checks.check_ov_circuit(ov_circuit))
    expect_pass(checks.check_copying_score(copying_score))
