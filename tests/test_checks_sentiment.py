"""The checks of chapter 07's science exercises: mean- and resample-ablation of heads at ``<cls>``
(7.3), direct logit attribution (7.4) and a finding recounted from the seed study (7.5). Each passes
differently written right answers, fails each mistake it names with that mistake's hint, reads a stub
as "not implemented yet", and never crashes."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import expect_fail, expect_pass
from mha_lib import checks
from mha_lib.checks import CheckResult

NEW_CHECKS = [checks.check_ablated_logits, checks.check_logit_attribution, checks.check_recount]


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
                    lambda *a, **k: (torch.zeros(1), torch.zeros(1)), lambda *a, **k: torch.zeros(2, 2),
                    lambda *a, **k: {"head 0": torch.zeros(2)}, lambda *a, **k: torch.full((7, 2), math.nan),
                    lambda *a, **k: (3, 4), lambda *a, **k: 0.5):
        result = check(garbage)
        assert isinstance(result, CheckResult) and not result, result
        assert "bug in mha_lib.checks" not in str(result), result


# ------------------------------------------------------------------ 7.3 mean- and resample-ablation


def cls_outputs(model, tokens, position=0):
    """(N, H, d_k): each head's output at `position` as W_o receives it (None: every position, (N, L, H, d_k))."""
    seen = []
    handle = model.layers[0].self_attn.W_o.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        model(tokens)
    finally:
        handle.remove()
    x = seen[0].view(tokens.size(0), tokens.size(1), model.num_heads, -1)
    return x if position is None else x[:, position]


def ablated(model, tokens, heads, how, reference, generator=None, *, mistake=None):
    """A learner-style answer with a forward pre-hook, with switches for the classic mistakes."""
    attention = model.layers[0].self_attn
    H = model.num_heads
    B, M = tokens.size(0), reference.size(0)
    was_training = model.training
    if mistake != "train mode":
        model.eval()
    try:
        with torch.no_grad():
            every = cls_outputs(model, reference, None)  # (M, L', H, d_k)
            at_cls = every[:, 0]
            who = list(range(H)) if mistake == "every head" else list(heads)
            if mistake == "evaluated mean":
                at_cls = cls_outputs(model, tokens)
            if how == "mean" and mistake == "resample for mean":
                values = at_cls[torch.randint(M, (B,), generator=generator)][:, who]
            elif how == "resample" and mistake == "mean for resample":
                values = at_cls[:, who].mean(0)
            elif how == "mean":
                if mistake == "zero":
                    values = torch.zeros_like(at_cls[0, who])
                elif mistake == "all positions":
                    values = every[:, :, who].mean((0, 1))
                elif mistake == "real positions":
                    real = (reference != 0).to(every.dtype)[:, :, None, None]
                    values = (every[:, :, who] * real).sum((0, 1)) / real.sum((0, 1))
                elif mistake == "mean over d_k":
                    values = at_cls[:, who].mean(-1, keepdim=True).mean(0).expand(len(who), at_cls.size(-1))
                elif mistake == "sum":
                    values = at_cls[:, who].sum(0)
                elif mistake == "mean over heads":
                    values = at_cls.mean((0, 1)).expand(len(who), -1)
                else:
                    values = at_cls[:, who].mean(0)
            else:
                state_before = generator.get_state()
                among = B if mistake == "from the evaluated sentences" else M
                pick = torch.randint(among, (B,), generator=None if mistake == "global generator" else generator)
                if mistake == "from the evaluated sentences":
                    at_cls = cls_outputs(model, tokens)
                if mistake == "permutation":
                    generator.set_state(state_before)
                    pick = torch.randperm(M, generator=generator)[:B]
                if mistake == "no shuffle":
                    pick = torch.arange(B) % M
                elif mistake == "reseeded":
                    generator.manual_seed(0)
                    pick = torch.randint(M, (B,), generator=generator)
                elif mistake == "one for the batch":
                    pick = pick[:1].expand(B)
                if mistake == "per head":
                    picks = torch.stack([pick] + [torch.randint(M, (B,), generator=generator) for _ in who[1:]], 1)
                    values = at_cls[picks, torch.tensor(who)]
                elif mistake == "zero":
                    values = torch.zeros_like(at_cls[pick][:, who])
                else:
                    values = at_cls[pick][:, who]
            if mistake == "after W_o":
                concat = every[:, 0].flatten(1)
                post = attention.W_o(concat).view(M, H, -1)[:, who]
                values = post.mean(0) if how == "mean" else post[pick]

                def swap_after(module, args, output):
                    out = output.clone()
                    out[:, 0].view(B, H, -1)[:, who] = values
                    return out

                handle = attention.W_o.register_forward_hook(swap_after)
            else:
                def swap(module, args):
                    x = args[0].clone()
                    x[:, 0].view(B, H, -1)[:, who] = values
                    return (x,)

                handle = attention.W_o.register_forward_pre_hook(swap)
            try:
                logits = model(tokens)
            finally:
                if mistake != "hook left":
                    handle.remove()
            if mistake == "nothing replaced":
                logits = model(tokens)
            return logits
    finally:
        if mistake == "left in eval":
            pass
        elif mistake == "train at the end":
            model.train()
        elif mistake != "train mode":
            model.train(was_training)


def ablated_by_hand(model, tokens, heads, how, reference, generator=None):
    """Written differently: the layer's steps redone by hand, the heads replaced with torch.where."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            layer, norm = model.layers[0], model.norm
            attention = layer.self_attn
            H = model.num_heads
            d_k = attention.W_o.in_features // H

            def heads_of(ids):  # (N, L, H * d_k), W_o's input, and the residual stream before the layer
                L = ids.size(1)
                x = model.token_embedding(ids) + model.position_embedding(torch.arange(L, device=ids.device))
                h = layer.norm1(x)
                q, k, v = (W(h).view(ids.size(0), L, H, d_k).transpose(1, 2)
                           for W in (attention.W_q, attention.W_k, attention.W_v))
                scores = q @ k.transpose(-2, -1) / d_k ** 0.5
                scores = scores.masked_fill((ids == model.pad_id)[:, None, None, :], float("-inf"))
                out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(ids.size(0), L, H * d_k)
                return out, x

            ref, _ = heads_of(reference)
            ref = ref[:, 0].view(-1, H, d_k)  # (M, H, d_k)
            if how == "mean":
                values = ref.sum(0, keepdim=True).expand(tokens.size(0), H, d_k) / ref.size(0)
            else:
                draw = torch.randint(0, reference.size(0), (tokens.size(0),), generator=generator)
                values = ref.index_select(0, draw.to(ref.device))
            out, x = heads_of(tokens)
            chosen = torch.zeros(H, 1, dtype=torch.bool, device=tokens.device)
            chosen[list(heads)] = True
            cls = torch.where(chosen, values, out[:, 0].view(-1, H, d_k)).flatten(1)  # (B, H * d_k)
            out = torch.cat([cls[:, None], out[:, 1:]], 1)
            x = x + attention.W_o(out)
            x = x + layer.feed_forward(layer.norm2(x))
            return model.classifier(norm(x[:, 0]))
    finally:
        model.train(was_training)


def test_ablated_logits_passes_right_answers():
    expect_pass(checks.check_ablated_logits(ablated))
    expect_pass(checks.check_ablated_logits(ablated_by_hand))


@pytest.mark.parametrize(("mistake", "words"), [
    ("zero", ("zero-ablation", "not zeros")),
    ("every head", ("every head was replaced", "only the heads listed")),
    ("evaluated mean", ("over the evaluated sentences", "reference")),
    ("all positions", ("every position, padding included", "position 0")),
    ("real positions", ("every word of the reference sentences", "position 0")),
    ("mean over d_k", ("wrong axis", "d_k features")),
    ("mean over heads", ("over the heads too", "its own mean")),
    ("sum", ("a sum over the reference sentences", ".mean(dim=0)")),
    ("after W_o", ("after w_o", "pre-hook")),
    ("nothing replaced", ("nothing was replaced", "the hook is registered")),
    ("no shuffle", ("no shuffle", "at random")),
    ("per head", ("different reference sentence for each head", "draw once per call")),
    ("one for the batch", ("one reference sentence for the whole batch",)),
    ("permutation", ("torch.randperm", "torch.randint(m, (b,), generator=generator)")),
    ("from the evaluated sentences", ("resampled outputs came from the evaluated sentences", "pick in [0, m)")),
    ("mean for resample", ("the mean of the reference outputs instead of a resampled one",)),
    ("resample for mean", ("resample-ablation (one reference sentence per evaluated sentence) instead of the mean",)),
    ("global generator", ("never drew from the generator passed in", "generator=generator")),
    ("reseeded", ("re-seeded", "no manual_seed")),
    ("hook left", ("left a hook", "handle.remove()")),
    ("train mode", ("training mode", "dropout")),
    ("left in eval", ("changed the mode of the model", "model.train(was_training)")),
    ("train at the end", ("was in evaluation mode and is now in training mode", "model.train(was_training)")),
])
def test_ablated_logits_names_the_mistake(mistake, words):
    expect_fail(checks.check_ablated_logits(lambda *a, m=mistake, **k: ablated(*a, **k, mistake=m)), *words)


def test_ablated_logits_names_state_left_behind():
    def frozen(model, *args):
        out = ablated(model, *args)
        for p in model.parameters():
            p.requires_grad_(False)
        return out

    def unfrozen(model, *args):  # every parameter back to requires_grad=True, also the frozen embedding
        out = ablated(model, *args)
        for p in model.parameters():
            p.requires_grad_(True)
        return out

    def edits_weights(model, tokens, heads, how, reference, generator=None):
        out = ablated(model, tokens, heads, how, reference, generator)
        with torch.no_grad():
            model.layers[0].self_attn.W_o.weight[:, 0] = 0.0
        return out

    def grad_off(*args):
        torch.set_grad_enabled(False)
        return ablated(*args)

    def clears_hooks(model, *args):
        out = ablated(model, *args)
        model.layers[0].self_attn.W_o._forward_pre_hooks.clear()
        return out

    def backward_left(model, tokens, heads, how, reference, generator=None):
        model(tokens).sum().backward()
        return ablated(model, tokens, heads, how, reference, generator)

    try:
        expect_fail(checks.check_ablated_logits(frozen), "requires_grad", "torch.no_grad()")
        expect_fail(checks.check_ablated_logits(unfrozen), "requires_grad")
        expect_fail(checks.check_ablated_logits(edits_weights), "changed the model's parameters")
        expect_fail(checks.check_ablated_logits(grad_off), "gradients switched off", "with torch.no_grad()")
        expect_fail(checks.check_ablated_logits(clears_hooks), "removed a hook that it did not add")
        expect_fail(checks.check_ablated_logits(backward_left), "training mode")
    finally:
        torch.set_grad_enabled(True)


def test_ablated_logits_names_dtype_inputs_and_device():
    expect_fail(checks.check_ablated_logits(lambda *a: ablated(*a).double()), "dtype torch.float64")
    expect_fail(checks.check_ablated_logits(lambda *a: ablated(*a).T), "shape (2, 7)", "(b, 2)")

    def changes_tokens(model, tokens, heads, how, reference, generator=None):
        out = ablated(model, tokens, heads, how, reference, generator)
        tokens[:, 1:] = 0
        return out

    expect_fail(checks.check_ablated_logits(changes_tokens), "changed its inputs in place")

    def cpu_mask(model, tokens, heads, how, reference, generator=None):
        """Right on the CPU; its keep-mask is made on the CPU, which a GPU refuses."""
        H = model.num_heads
        keep = torch.ones(H, 1)
        keep[list(heads)] = 0.0
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                at_cls = cls_outputs(model, reference)
                if how == "mean":
                    values = at_cls.mean(0)[None]
                else:
                    values = at_cls[torch.randint(reference.size(0), (tokens.size(0),), generator=generator)]

                def swap(module, args):
                    x = args[0].clone()
                    cls = x[:, 0].view(x.size(0), H, -1)
                    x[:, 0] = (cls * keep.to(x.dtype) + values * (1 - keep.to(x.dtype))).flatten(1)
                    return (x,)

                handle = model.layers[0].self_attn.W_o.register_forward_pre_hook(swap)
                try:
                    return model(tokens)
                finally:
                    handle.remove()
        finally:
            model.train(was_training)

    expect_fail(checks.check_ablated_logits(cpu_mask), "device 'meta'", "device=tokens.device", status="error")

    from mha_lib.sentiment.attribution import replace_heads

    def library(model, tokens, heads, how, reference, generator=None):
        with replace_heads(model, heads, cls_outputs(model, reference)[:, heads].mean(0)):
            return model(tokens)

    expect_fail(checks.check_ablated_logits(library), "course's own answer")


# ------------------------------------------------------------------ 7.4 direct logit attribution


def attribution(model, tokens, *, mistake=None):
    """A learner-style answer with hooks, with switches for the classic mistakes."""
    layer, norm = model.layers[0], model.norm
    W_o = layer.self_attn.W_o
    H = model.num_heads
    seen = {}
    handles = [W_o.register_forward_pre_hook(lambda m, args: seen.__setitem__("heads", args[0])),
               layer.feed_forward.register_forward_hook(lambda m, args, out: seen.__setitem__("ffn", out)),
               norm.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0]))]
    was_training = model.training
    if mistake != "train mode":
        model.eval()
    try:
        with torch.no_grad():
            model(tokens)
            p = -1 if mistake == "last position" else 0
            d_k = W_o.in_features // H
            heads = seen["heads"][:, p]
            position = torch.full((1,), p % tokens.size(1), dtype=torch.long, device=tokens.device)
            terms = {"embedding": model.token_embedding(tokens[:, p])
                     + (0 if mistake == "no position" else model.position_embedding(position))}
            for h in range(H):
                if mistake == "bias in every head":
                    keep = torch.zeros_like(heads)
                    keep[:, h * d_k:(h + 1) * d_k] = heads[:, h * d_k:(h + 1) * d_k]
                    terms[f"head {h}"] = W_o(keep)
                else:
                    terms[f"head {h}"] = heads[:, h * d_k:(h + 1) * d_k] @ W_o.weight[:, h * d_k:(h + 1) * d_k].T
            if mistake != "no W_o bias":
                terms["W_o bias"] = W_o.bias.expand_as(terms["embedding"])
            terms["feed-forward"] = seen["ffn"][:, p]
            x = seen["x"] if p == 0 else sum(terms.values())
            sigma = (x.var(-1, unbiased=mistake == "unbiased", keepdim=True) + norm.eps).sqrt()
            w = model.classifier.weight[1] - model.classifier.weight[0]
            b = model.classifier.bias[1] - model.classifier.bias[0]
            if mistake == "wrong order":
                w, b = -w, -b
            gamma = torch.ones_like(norm.weight) if mistake == "no gamma" else norm.weight
            out = {}
            for name, t in terms.items():
                s = (t.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt() if mistake == "sigma per term" else sigma
                c = t if mistake == "not centred" else t - t.mean(-1, keepdim=True)
                y = gamma * c / s
                if mistake in ("beta in every term", "both biases in every term"):
                    y = y + norm.bias
                out[name] = y @ w
                if mistake in ("classifier bias in every term", "both biases in every term"):
                    out[name] = out[name] + b
            out["constant"] = (norm.bias @ w + b).expand(tokens.size(0))
            if mistake == "hook left":
                handles.pop()
            return out
    finally:
        for handle in handles:
            handle.remove()
        if mistake != "train mode":
            model.train(was_training)


def attribution_by_gradient(model, tokens):
    """Written differently: LayerNorm's sigma frozen by hand, each term pushed through the linear map
    x -> w . gamma * (x - mean x) / sigma, the layer's parts computed without hooks."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            layer, attention = model.layers[0], model.layers[0].self_attn
            L = tokens.size(1)
            x0 = model.token_embedding(tokens) + model.position_embedding(torch.arange(L, device=tokens.device))
            h = layer.norm1(x0)
            _, weights = attention(h, h, h, mask=(tokens != model.pad_id)[:, None, None, :], return_weights=True)
            v = attention.W_v(h[:, :])  # (B, L, D)
            H = model.num_heads
            d_k = v.size(-1) // H
            v = v.view(tokens.size(0), L, H, d_k)
            per_head = torch.einsum("bhk,bkhd->bhd", weights[:, :, 0], v)  # (B, H, d_k) at <cls>
            W = attention.W_o.weight.view(-1, H, d_k)  # (D, H, d_k)
            head_terms = torch.einsum("bhd,ehd->bhe", per_head, W)  # (B, H, D)
            x1 = x0 + attention(h, h, h, mask=(tokens != model.pad_id)[:, None, None, :])
            ffn = layer.feed_forward(layer.norm2(x1))[:, 0]
            parts = {"embedding": x0[:, 0], **{f"head {i}": head_terms[:, i] for i in range(H)},
                     "W_o bias": attention.W_o.bias.expand_as(x0[:, 0]), "feed-forward": ffn}
            x = x1[:, 0] + ffn
            n = x.size(-1)
            sigma = torch.sqrt(((x - x.mean(-1, keepdim=True)) ** 2).sum(-1, keepdim=True) / n + model.norm.eps)
            direction = (model.classifier.weight[1] - model.classifier.weight[0]) * model.norm.weight  # (D,)
            direction = direction - direction.mean()  # centring moved onto the direction: the same dot product
            out = {name: (t / sigma) @ direction for name, t in parts.items()}
            out["constant"] = model.norm.bias @ (model.classifier.weight[1] - model.classifier.weight[0]) + (
                model.classifier.bias[1] - model.classifier.bias[0])
            out["constant"] = out["constant"].expand(tokens.size(0)).clone()
            return out
    finally:
        model.train(was_training)


def test_logit_attribution_passes_right_answers():
    expect_pass(checks.check_logit_attribution(attribution))
    expect_pass(checks.check_logit_attribution(attribution_by_gradient))


@pytest.mark.parametrize(("mistake", "words"), [
    ("not centred", ("not centred", "t.mean(-1, keepdim=true)")),
    ("no gamma", ("gamma", "left out")),
    ("sigma per term", ("sigma was recomputed for each term", "freeze sigma")),
    ("beta in every term", ("beta (model.norm.bias) was counted in every term", "once into 'constant'")),
    ("classifier bias in every term", ("classifier's bias was counted in every term",)),
    ("both biases in every term", ("beta (model.norm.bias) and the classifier's bias",)),
    ("no W_o bias", ("no 'w_o bias' term", "don't add up")),
    ("bias in every head", ("w_o's bias was counted in every head's term", "its own slice")),
    ("wrong order", ("wrong sign", "logit[1] - logit[0]")),
    ("last position", ("wrong position", "[:, 0]")),
    ("no position", ("no position embedding",)),
    ("unbiased", ("sigma with the unbiased variance", "unbiased=false")),
    ("train mode", ("training mode", "dropout")),
    ("hook left", ("left a hook",)),
])
def test_logit_attribution_names_the_mistake(mistake, words):
    expect_fail(checks.check_logit_attribution(lambda *a, m=mistake: attribution(*a, mistake=m)), *words)


def test_logit_attribution_names_more():
    def float32(model, tokens):
        return {name: t.float() for name, t in attribution(model, tokens).items()}

    def layer_norm_per_term(model, tokens):
        """The final LayerNorm and the classifier run on each term alone."""
        out = attribution(model, tokens)
        was = model.training
        model.eval()
        with torch.no_grad():
            seen = {}
            layer = model.layers[0]
            handles = [layer.self_attn.W_o.register_forward_pre_hook(lambda m, a: seen.update(heads=a[0][:, 0])),
                       layer.feed_forward.register_forward_hook(lambda m, a, o: seen.update(ffn=o[:, 0]))]
            model(tokens)
            for handle in handles:
                handle.remove()
            H, W_o = model.num_heads, layer.self_attn.W_o
            d_k = W_o.in_features // H
            vectors = {"embedding": model.token_embedding(tokens[:, 0]) + model.position_embedding.weight[0],
                       **{f"head {h}": seen["heads"][:, h * d_k:(h + 1) * d_k] @ W_o.weight[:, h * d_k:(h + 1) * d_k].T
                          for h in range(H)},
                       "W_o bias": W_o.bias.expand(tokens.size(0), -1), "feed-forward": seen["ffn"]}
            logits = {name: model.classifier(model.norm(v)) for name, v in vectors.items()}
        model.train(was)
        return {name: z[:, 1] - z[:, 0] for name, z in logits.items()} | {"constant": out["constant"]}

    def renamed(model, tokens):
        out = attribution(model, tokens)
        out["ffn"] = out.pop("feed-forward")
        return out

    def as_tensor(model, tokens):
        return torch.stack(list(attribution(model, tokens).values()))

    def no_eps(model, tokens):
        out = attribution(model, tokens)  # sigma rebuilt without eps: off by ~1e-6, more than float64's rounding
        layer = model.layers[0]
        was = model.training
        model.eval()
        with torch.no_grad():
            x = layer(model.token_embedding(tokens) + model.position_embedding(
                torch.arange(tokens.size(1), device=tokens.device)), (tokens != 0)[:, None, None, :])[:, 0]
        model.train(was)
        ratio = (x.var(-1, unbiased=False) + model.norm.eps).sqrt() / x.var(-1, unbiased=False).sqrt()
        return {n: t * ratio if n != "constant" else t for n, t in out.items()}

    def cpu_direction(model, tokens):
        """Right on the CPU; its +-1 vector for the logit difference is made on the CPU, which a GPU refuses."""
        out = attribution(model, tokens)
        sign = torch.tensor([-1.0, 1.0], dtype=tokens.new_zeros(0).float().dtype).to(model.classifier.bias.dtype)
        return out | {"constant": model.norm.bias @ (sign @ model.classifier.weight) + (sign @ model.classifier.bias)
                      + torch.zeros_like(out["constant"])}

    from mha_lib.sentiment.attribution import logit_attribution
    from mha_lib.sentiment import Vocab

    def library(model, tokens):
        return logit_attribution(model, [Vocab.for_task().decode(row)[1:] for row in tokens], Vocab.for_task())

    expect_fail(checks.check_logit_attribution(layer_norm_per_term), "sigma was recomputed for each term")
    expect_fail(checks.check_logit_attribution(float32), "dtype torch.float32")
    expect_fail(checks.check_logit_attribution(renamed), "missing: ['feed-forward']", "extra: ['ffn']")
    expect_fail(checks.check_logit_attribution(as_tensor), "expected a dict")
    expect_fail(checks.check_logit_attribution(no_eps), "sigma without layernorm's eps")
    expect_fail(checks.check_logit_attribution(cpu_direction), "device 'meta'", "device=tokens.device", status="error")
    expect_fail(checks.check_logit_attribution(library), "course's own answer")


# ------------------------------------------------------------------ 7.5 a finding recounted from the study


def recount(study, *, mistake=None):
    """A learner-style answer reading the run dicts directly, with switches for the classic mistakes."""
    k = n = 0
    for run in study.runs:
        if run.get("replica") and mistake != "replicas":
            continue
        if run["num_heads"] != 2 and mistake != "every head count":
            continue
        accuracy, base = run["heads"]["accuracy"], run["baselines"]
        at = {"0.95": 0.95, "0.9": 0.9}.get(mistake, base["learned_at"])
        worst = {"negated only": accuracy["negated"], "plain only": accuracy["plain"]}.get(
            mistake, min(accuracy["negated"], accuracy["plain"]))
        if worst < at and mistake != "unlearned":
            continue
        trained, before = run["heads"]["cls_to_not"], run["untrained"]["cls_to_not"]
        if mistake == "word":
            before = run["untrained"]["cls_to_word"]
        h = trained.index(max(trained))
        role = {"role 0.5": 0.5, "role read off": 0.5658, "uniform": base["uniform"]}.get(mistake, base["role"])
        if trained[h] < role and mistake != "no role":
            continue
        n += 1
        if mistake == "untrained head":
            h = before.index(max(before))
        if mistake == "grew":
            k += trained[h] > before[h]
        else:
            k += all(before[h] > before[o] for o in range(len(before)) if o != h)
    return k, n


def recount_with_helpers(study):
    """Written differently: the study's own helpers, a share and back."""
    from mha_lib.sentiment.findings import independent, learned, negation_head_of

    def counted(run):
        return independent(run) and "heads" in run and learned(run) and \
            run["heads"]["cls_to_not"][negation_head_of(run)] >= run["baselines"]["role"]

    def leans(run):
        before = torch.tensor(run["untrained"]["cls_to_not"])
        return int(before.argmax()) == negation_head_of(run)

    return study.count(leans, where=counted)


def test_recount_passes_right_answers():
    expect_pass(checks.check_recount(recount))
    expect_pass(checks.check_recount(recount_with_helpers))
    expect_pass(checks.check_recount(lambda s: tuple(torch.tensor(recount(s)))))  # 0-d integer tensors


@pytest.mark.parametrize(("mistake", "words"), [
    ("replicas", ("replicas", "run.get('replica')")),
    ("every head count", ("1, 4 and 8 heads", "num_heads")),
    ("unlearned", ("did not learn",)),
    ("0.95", ("0.95 typed in", "learned_at")),
    ("0.9", ("0.9 typed in", "learned_at")),
    ("negated only", ("negated sentences only", "min(")),
    ("plain only", ("plain sentences only", "min(")),
    ("role 0.5", ("0.5 typed in", "run['baselines']['role']")),
    ("role read off", ("0.5658", "run['baselines']['role']")),
    ("uniform", ("against uniform attention",)),
    ("no role", ("role was not required",)),
    ("word", ("sentiment word",)),
    ("untrained head", ("picked from the untrained shares",)),
    ("grew", ("compared with its own share before",)),
])
def test_recount_names_the_mistake(mistake, words):
    expect_fail(checks.check_recount(lambda s, m=mistake: recount(s, mistake=m)), *words)


def test_recount_names_answers_not_counted_from_the_argument():
    from mha_lib.sentiment import load_study

    committed = recount(load_study())
    expect_fail(checks.check_recount(lambda study: committed), "committed study's count", "study.runs")
    expect_fail(checks.check_recount(lambda study: (16, 25)), "the same answer", "not from load_study()")
    expect_fail(checks.check_recount(lambda study: recount(study)[0] / recount(study)[1]), "one number", "(k, n)")
    expect_fail(checks.check_recount(lambda study: (float(recount(study)[0]), recount(study)[1])), "whole numbers")

    def sorts_in_place(study):
        study.runs.sort(key=lambda run: run["seed"])
        return recount(study)

    def marks_runs(study):
        for run in study.runs:
            run["counted"] = True
        return recount(study)

    expect_fail(checks.check_recount(sorts_in_place), "changed the runs")
    expect_fail(checks.check_recount(marks_runs), "changed the runs")
    expect_fail(checks.check_recount(lambda study: (recount(study)[0] + 1, recount(study)[1])),
                "you keep the right", "what you test")


def test_the_checks_leave_the_random_state_the_threads_and_the_grad_mode_alone():
    torch.manual_seed(3)
    before = torch.rand(1)
    torch.manual_seed(3)
    threads = torch.get_num_threads()
    expect_pass(checks.check_ablated_logits(ablated))  # seeds its models, draws, runs on one thread
    expect_pass(checks.check_logit_attribution(attribution))
    expect_pass(checks.check_recount(recount))
    assert torch.equal(torch.rand(1), before) and torch.get_num_threads() == threads and torch.is_grad_enabled()


# ------------------------------------------------------------------ mistakes named since the held-out gallery


def _ref_cls(model, reference, position=0):
    was = model.training
    model.eval()
    with torch.no_grad():
        every = cls_outputs(model, reference, None)  # (M, L', H, d_k)
    model.train(was)
    return every if position is None else every[:, position]


def _write(model, tokens, heads, values, *, layout="hd", post=False, position=0):
    """The logits with `values` ((B or 1), len(heads), d_k) written for `heads` at `position`, before W_o (or after)."""
    H, B = model.num_heads, tokens.size(0)

    def edit(x):
        x = x.clone()
        if layout == "hd":
            x[:, position].view(B, H, -1)[:, heads] = values
        else:
            x[:, position].view(B, -1, H)[:, :, heads] = values.transpose(-1, -2)
        return x

    W_o = model.layers[0].self_attn.W_o
    handle = (W_o.register_forward_hook(lambda m, a, out: edit(out)) if post
              else W_o.register_forward_pre_hook(lambda m, a: (edit(a[0]),)))
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            return model(tokens)
    finally:
        handle.remove()
        model.train(was)


def ablated_variant(model, tokens, heads, how, reference, generator=None, *, mistake):
    B, M, H = tokens.size(0), reference.size(0), model.num_heads
    heads = list(heads)
    at_cls = _ref_cls(model, reference)
    if mistake == "interleaved":
        at_cls = at_cls.flatten(1).view(M, -1, H).transpose(1, 2)
    draws = {"M - 1": lambda: torch.randint(M - 1, (B,), generator=generator),
             "from 1": lambda: torch.randint(1, M, (B,), generator=generator),
             "twice": lambda: [torch.randint(M, (B,), generator=generator) for _ in range(2)][1],
             "on device": lambda: torch.randint(M, (B,), generator=generator, device=tokens.device)}
    pick = draws.get(mistake, lambda: torch.randint(M, (B,), generator=generator))() if how == "resample" else None
    who = [h for h in range(H) if h not in heads] if mistake == "other heads" else heads
    if how == "mean":
        values = {"median": lambda: at_cls[:, who].median(0).values,
                  "first sentence": lambda: _ref_cls(model, reference, None)[0, :, who].mean(0),
                  "weighted": lambda: (at_cls[:, who] * (reference != 0).sum(1)[:, None, None]).sum(0)
                  / (reference != 0).sum()}.get(mistake, lambda: at_cls[:, who].mean(0))()
    else:
        values = at_cls[pick][:, who]
    if mistake == "tolist":
        values = torch.tensor(values.tolist())
    return _write(model, tokens, who, values, layout="dh" if mistake == "interleaved" else "hd",
                  post=mistake == "into the output")


@pytest.mark.parametrize(("mistake", "words"), [
    ("other heads", ("*not* in `heads` were replaced", "for h in heads")),
    ("interleaved", ("interleaved", "(b, h, d_k)")),
    ("into the output", ("written into w_o's output", "pre-hook")),
    ("median", ("the median",)),
    ("first sentence", ("positions of the first reference sentence", "args[0][:, 0]")),
    ("weighted", ("weighted by the sentences' lengths",)),
    ("M - 1", ("[0, m - 1)", "draw once")),
    ("from 1", ("[1, m)", "draw once")),
    ("twice", ("drawn from twice",)),
])
def test_ablated_logits_names_the_gallerys_mistakes(mistake, words):
    expect_fail(checks.check_ablated_logits(lambda *a, m=mistake, **k: ablated_variant(*a, **k, mistake=m)), *words)


def test_ablated_logits_names_device_dtype_grad_and_stale_state():
    expect_fail(checks.check_ablated_logits(lambda *a, **k: ablated_variant(*a, **k, mistake="on device")),
                "can't draw on meta", ".to(tokens.device)", status="error")
    expect_fail(checks.check_ablated_logits(lambda *a, **k: ablated_variant(*a, **k, mistake="tolist")),
                "float32 copy of the model runs", "float32", status="error")

    def cpu_positions(model, tokens, heads, how, reference, generator=None):
        """Right on the CPU; an embedding looked up with CPU positions, which a GPU refuses."""
        with torch.no_grad():
            positions = model.position_embedding(torch.arange(tokens.size(1)))  # (L, D), ids made on the CPU
        return ablated(model, tokens, heads, how, reference, generator) + 0 * positions.sum()

    expect_fail(checks.check_ablated_logits(cpu_positions), "on the same device", "device=tokens.device",
                status="error")

    def grad_back_on(*args):
        torch.set_grad_enabled(False)
        try:
            return ablated(*args)
        finally:
            torch.set_grad_enabled(True)

    expect_fail(checks.check_ablated_logits(grad_back_on), "switched gradients on", "torch.no_grad()")
    cache = {}

    def cached(model, tokens, heads, how, reference, generator=None):  # keyed on some arguments only
        key = (id(model), tuple(heads), how)
        cache.setdefault(key, _ref_cls(model, reference))
        at_cls = cache[key]
        values = at_cls[:, heads].mean(0) if how == "mean" else \
            at_cls[torch.randint(at_cls.size(0), (tokens.size(0),), generator=generator)][:, heads]
        return _write(model, tokens, list(heads), values)

    expect_fail(checks.check_ablated_logits(cached), "remembers something from an earlier call", "no cache")


def attribution_variant(model, tokens, *, mistake):
    """A learner's attribution from the hooks, with one of the gallery's mistakes."""
    layer, norm = model.layers[0], model.norm
    W_o, H = layer.self_attn.W_o, model.num_heads
    seen = {}
    handles = [W_o.register_forward_pre_hook(lambda m, a: seen.update(heads=a[0][:, 0])),
               layer.feed_forward.register_forward_hook(lambda m, a, out: seen.update(ffn=out[:, 0])),
               layer.norm2.register_forward_hook(lambda m, a, out: seen.update(norm2=out[:, 0]))]
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(tokens)
            B, d_k = tokens.size(0), W_o.in_features // H
            where = {"position 1": torch.ones(1, dtype=torch.long, device=tokens.device), "cls id": tokens[:, 0],
                     "cpu position": torch.tensor([0])}.get(mistake, torch.zeros(1, dtype=torch.long,
                                                                                   device=tokens.device))
            vectors = {"embedding": model.token_embedding(tokens[:, 0]) + model.position_embedding(where)}
            for h in range(H):
                part = seen["heads"][:, h * d_k:(h + 1) * d_k]
                if mistake == "rows":
                    vectors[f"head {h}"] = part @ W_o.weight[h * d_k:(h + 1) * d_k]
                elif mistake == "interleaved":
                    vectors[f"head {h}"] = seen["heads"].view(B, d_k, H)[..., h] @ W_o.weight.view(-1, d_k, H)[..., h].T
                else:
                    vectors[f"head {h}"] = part @ W_o.weight[:, h * d_k:(h + 1) * d_k].T
            vectors["W_o bias"] = W_o.bias.expand(B, -1)
            vectors["feed-forward"] = seen["norm2" if mistake == "norm2" else "ffn"]
            x = sum(vectors.values())
            sigma = {"eps outside": lambda: x.std(-1, unbiased=False, keepdim=True) + norm.eps,
                     "batch sigma": lambda: (x.var(0, unbiased=False, keepdim=True) + norm.eps).sqrt(),
                     "embedding sigma": lambda: (vectors["embedding"].var(-1, unbiased=False, keepdim=True)
                                                 + norm.eps).sqrt(),
                     "scaled sigma": lambda: 1.5 * (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt(),
                     }.get(mistake, lambda: (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt())()
            sign = torch.tensor([-1.0, 1.0]) if mistake == "float32 sign" else \
                torch.tensor([-1.0, 1.0], dtype=x.dtype, device=x.device)
            w, b = sign @ model.classifier.weight, sign @ model.classifier.bias
            out = {}
            for name, t in vectors.items():
                mean = {"centre by x": x.mean(-1, keepdim=True), "centre over batch": t.mean(0, keepdim=True)}.get(
                    mistake, t.mean(-1, keepdim=True))
                out[name] = (norm.weight * (t - mean) / sigma) @ w
            out["constant"] = {"no b": norm.bias @ w, "no beta": b, "b reversed": norm.bias @ w - b}.get(
                mistake, norm.bias @ w + b).expand(B)
            if mistake == "probability":
                p = logits.softmax(-1)
                out = {n: v * (p[:, 1] - p[:, 0]) / (logits[:, 1] - logits[:, 0]) for n, v in out.items()}
            return out
    finally:
        for handle in handles:
            handle.remove()
        model.train(was)


@pytest.mark.parametrize(("mistake", "words"), [
    ("no b", ("only 'constant' differs", "no classifier bias")),
    ("no beta", ("only 'constant' differs", "no w . beta")),
    ("b reversed", ("only 'constant' differs", "wrong sign (b_0 - b_1)")),
    ("rows", ("*rows*", "columns")),
    ("interleaved", ("interleaved", "[h*d_k, (h+1)*d_k)")),
    ("position 1", ("position 1's embedding", "position 0")),
    ("cls id", ("<cls> token id in the position table",)),
    ("centre by x", ("centred by the mean of x", "its *own* mean")),
    ("centre over batch", ("centred over the batch",)),
    ("eps outside", ("eps added outside the square root",)),
    ("batch sigma", ("sigma over the batch",)),
    ("embedding sigma", ("sigma of the embedding alone",)),
    ("scaled sigma", ("the same factor in each sentence", "sigma")),
    ("norm2", ("norm2's output", "layer.feed_forward")),
    ("probability", ("p(positive) - p(negative)",)),
])
def test_logit_attribution_names_the_gallerys_mistakes(mistake, words):
    expect_fail(checks.check_logit_attribution(lambda *a, m=mistake: attribution_variant(*a, mistake=m)), *words)


def test_logit_attribution_names_device_dtype_and_stale_state():
    expect_fail(checks.check_logit_attribution(lambda *a: attribution_variant(*a, mistake="cpu position")),
                "on the same device", "device=tokens.device", status="error")
    expect_fail(checks.check_logit_attribution(lambda *a: attribution_variant(*a, mistake="float32 sign")),
                "float32 copy of the model runs", status="error")
    cache = {}

    def cached(model, tokens):  # keyed on the model and the shape only
        return cache.setdefault((id(model), tuple(tokens.shape)), attribution(model, tokens))

    expect_fail(checks.check_logit_attribution(cached), "remembers something from an earlier call")


def recount_variant(study, *, mistake):
    """A learner's recount with one of the gallery's mistakes."""
    first_path = study.runs[0]["path"]
    k = n = 0
    for run in study.runs:
        if (run["path"] != first_path) if mistake == "path" else run.get("replica"):
            continue
        if run["num_heads"] != 2:
            continue
        acc, base = run["heads"]["accuracy"], run["baselines"]
        at = base["near_chance"] if mistake == "near chance" else base["learned_at"]
        worst = min(acc["negated"], acc["plain"])
        if (worst <= at) if mistake == "strict learned" else (worst < at):
            continue
        trained = run["heads"]["cls_shares"]["negated+"]["not"] if mistake == "per group" else \
            run["heads"]["cls_to_not"]
        h = trained.index(min(trained) if mistake == "argmin" else max(trained))
        before = run["untrained"]["cls_to_not"]
        share = before[h] if mistake == "role before" else trained[h]
        if (share <= base["role"]) if mistake == "strict role" else (share < base["role"]):
            continue
        n += 1
        other = {"uniform": base["uniform"], "own word": run["untrained"]["cls_to_word"][h],
                 "trained": run["heads"]["cls_to_not"][1 - h]}.get(mistake, before[1 - h])
        k += before[h] >= other if mistake == "ties" else before[h] > other
    return (n, k) if mistake == "swapped" else (k, n)


@pytest.mark.parametrize(("mistake", "words"), [
    ("path", ("kernel path", "run.get('replica')")),
    ("near chance", ("near_chance",)),
    ("strict learned", ("> learned_at", ">= run['baselines']['learned_at']")),
    ("strict role", ("> role", ">= run['baselines']['role']")),
    ("per group", ("per-group shares",)),
    ("argmin", ("*smaller*",)),
    ("role before", ("applied to the untrained share",)),
    ("uniform", ("compared with uniform attention",)),
    ("own word", ("its own share on the sentiment word",)),
    ("trained", ("other head's *trained* share",)),
    ("ties", ("a tie before training", "compare with >")),
    ("swapped", ("swapped",)),
])
def test_recount_names_the_gallerys_mistakes(mistake, words):
    expect_fail(checks.check_recount(lambda s, m=mistake: recount_variant(s, mistake=m)), *words)


def test_recount_names_n_from_fewer_conditions_and_stale_counts():
    from mha_lib.sentiment.findings import independent, learned

    def n_unfiltered(study):
        k, _ = recount(study)
        return k, sum(1 for run in study.runs if independent(run) and learned(run))

    expect_fail(checks.check_recount(n_unfiltered), "a condition was applied to k only", "every")
    memo = {}

    def by_size(study):
        return memo.setdefault(len(study.runs), recount(study))

    expect_fail(checks.check_recount(by_size), "remembers an earlier call", "no cache")


# ------------------------------------------------------------------ held-out gallery of issues 32/34: more named slips


def ablated_first_head_only(model, tokens, heads, how, reference, generator=None):
    """Replaces heads[0] alone (a loop that returns after its first head)."""
    return ablated(model, tokens, list(heads)[:1], how, reference, generator)


def ablated_pick_from_the_batch(model, tokens, heads, how, reference, generator=None):
    """Resamples with torch.randint(B, ...): the number of evaluated sentences where M belongs."""
    at_cls = _ref_cls(model, reference)[:, list(heads)]  # (M, k, d_k)
    if how == "mean":
        return _write(model, tokens, list(heads), at_cls.mean(0))
    pick = torch.randint(tokens.size(0), (tokens.size(0),), generator=generator)
    return _write(model, tokens, list(heads), at_cls[pick.to(at_cls.device)])


def ablated_pick_left_on_the_cpu(model, tokens, heads, how, reference, generator=None):
    """Indexes the device's outputs with a CPU pick: PyTorch allows a CPU index tensor, also on a GPU."""
    at_cls = _ref_cls(model, reference)[:, list(heads)]
    if how == "mean":
        return _write(model, tokens, list(heads), at_cls.mean(0))
    pick = torch.randint(reference.size(0), (tokens.size(0),), generator=generator)
    return _write(model, tokens, list(heads), at_cls[pick])


def test_ablated_logits_names_a_partial_replacement_and_a_draw_from_the_batch():
    expect_fail(checks.check_ablated_logits(ablated_first_head_only), "only some of the heads in `heads`")
    expect_fail(checks.check_ablated_logits(ablated_pick_from_the_batch), "drawn from [0, B)",
                "not of reference sentences")
    expect_pass(checks.check_ablated_logits(ablated_pick_left_on_the_cpu))
    expect_pass(checks.check_ablated_logits(ablated))


def test_a_hook_left_behind_is_named_without_a_wrong_cause():
    def reads_and_leaves_its_hook(model, tokens):
        model.layers[0].feed_forward.register_forward_hook(lambda m, a, out: None)  # only reads, never removed
        return attribution(model, tokens)

    result = checks.check_logit_attribution(reads_and_leaves_its_hook)
    expect_fail(result, "left a hook registered on the model (on layers.0.feed_forward)", "still runs it")
    assert "replaces the head" not in str(result)


def recount_untrained_head_for_its_role_too(study):
    k = n = 0
    for run in study.runs:
        if run.get("replica") or run["num_heads"] != 2:
            continue
        accuracy, base = run["heads"]["accuracy"], run["baselines"]
        if min(accuracy["negated"], accuracy["plain"]) < base["learned_at"]:
            continue
        before = run["untrained"]["cls_to_not"]
        h = before.index(max(before))  # the negation head picked before training
        if run["heads"]["cls_to_not"][h] < base["role"]:
            continue
        n += 1
        k += before[h] > before[1 - h]
    return k, n


def recount_every_run(study):
    runs = study.runs
    lead = sum(all(r["untrained"]["cls_to_not"][max(range(r["num_heads"]), key=r["heads"]["cls_to_not"].__getitem__)]
                   > v for i, v in enumerate(r["untrained"]["cls_to_not"])
                   if i != max(range(r["num_heads"]), key=r["heads"]["cls_to_not"].__getitem__)) for r in runs)
    return lead, len(runs)


def test_recount_names_an_untrained_negation_head_and_no_filter_at_all():
    expect_fail(checks.check_recount(recount_untrained_head_for_its_role_too), "picked from the untrained shares",
                "also for its role")
    expect_fail(checks.check_recount(recount_every_run), "no run was left out", "where=")
    expect_pass(checks.check_recount(recount))
