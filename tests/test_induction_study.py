"""Chapter 08's seed study: thresholds that come from baselines, independent runs, the committed
file that the chapter quotes, and its command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mha_lib.induction import repeated_segments, uniform_induction_score, uniform_previous_token_score
from mha_lib.induction import study as study_module
from mha_lib.induction.__main__ import main as cli
from mha_lib.induction.findings import (
    FINDINGS,
    STATED,
    STATED_HEADS,
    check_findings,
    copying_control,
    count_findings,
    count_head_findings,
)
from mha_lib.induction.run import CONFIGS, EVAL_SEED, baselines, role_threshold, run_seed
from mha_lib.induction.study import load_study, study_jobs


@pytest.fixture(scope="module")
def study():
    return load_study()


def test_thresholds_are_computed_from_their_baselines(monkeypatch, tmp_path):
    # No threshold is read from a trained run: baselines() works without any study file.
    monkeypatch.setattr(study_module, "STUDY_FILE", tmp_path / "absent.json")
    for config in CONFIGS.values():
        task = config["task"]
        base = baselines(config)
        assert base["no_copy_loss"] == pytest.approx(math.log(task["vocab_size"]))
        assert base["phase_threshold"] == pytest.approx(base["no_copy_loss"] / 2)
        assert base["uniform_previous_token"] == pytest.approx(uniform_previous_token_score(task["seq_len"]))
        big = repeated_segments(4096, task["seq_len"], task["vocab_size"], tuple(task["segment"]),
                                generator=torch.Generator().manual_seed(EVAL_SEED - 1))
        assert base["uniform_induction"] == pytest.approx(uniform_induction_score(big))
        assert base["previous_token_head"] == pytest.approx(role_threshold(base["uniform_previous_token"]))
        assert base["induction_head"] == pytest.approx(role_threshold(base["uniform_induction"]))


def test_role_threshold_is_halfway_from_uniform_to_one_key():
    assert role_threshold(0.0) == 0.5 and role_threshold(0.5) == 0.75 and role_threshold(1.0) == 1.0


def test_the_committed_study_has_independent_runs_of_every_configuration(study):
    assert set(study.config) == set(CONFIGS)
    for name, config in CONFIGS.items():
        assert study.config[name] == json.loads(json.dumps(config)), f"{name}: the file was made with another set-up"
        for n in config["layers"]:
            runs = study.values(lambda r: r, where=lambda r, name=name, n=n: r["config"] == name and r["num_layers"] == n)
            assert len(runs) >= config["seeds"] >= 10
            seeds = [r["seed"] for r in runs]
            assert len(set(seeds)) == len(seeds), "a seed counted twice"
            assert all(r["data_seed"] == r["seed"] and r["eval_seed"] == EVAL_SEED + r["seed"] for r in runs)
            assert all(len(r["history"]) == len(study.about["steps"][name]) for r in runs)
            assert all(len(r["scores"]) == n and len(r["ablation"]) == n for r in runs)
    assert len(study.values(lambda r: 1, where=lambda r: r["config"] == "learned")) >= 40  # >= 20 seeds x 1, 2 layers


def test_the_committed_study_gives_the_counts_the_chapter_states(study):
    counts = count_findings(study)
    assert counts == STATED, {name: (counts[name], STATED[name]) for name in counts if counts[name] != STATED[name]}
    heads = count_head_findings(study)
    assert heads == STATED_HEADS, {name: (heads[name], STATED_HEADS.get(name)) for name in heads
                                   if heads[name] != STATED_HEADS.get(name)}
    # a finding says something: each can be false, and the untrained models are where they are
    untrained = [dict(run, scores=run["untrained"]) for run in study.runs if run["config"] == "learned"
                 and run["num_layers"] == 2 and run["phase_change"] is not None]
    for name in ("learned: all four layer-2 heads have the induction pattern", "learned: a duplicate-token head in layer 1"):
        assert not any(FINDINGS[name][1](run) for run in untrained), f"{name!r} holds before training too"


def test_check_findings_speaks_only_to_the_runs_a_finding_is_about(study):
    one_layer = next(r for r in study.runs if r["num_layers"] == 1)
    assert set(check_findings(one_layer)) == {"untrained: no head has a role", "untrained: no head copies, by either measure",
                                               "one layer never changes phase", "one layer: no induction pattern"}
    stuck = next(r for r in study.runs if r["num_layers"] == 2 and r["phase_change"] is None)
    assert not any(name.startswith("learned: a duplicate") for name in check_findings(stuck))


def test_jobs_cover_every_configuration_and_seed():
    jobs = study_jobs()
    assert len(jobs) == sum(c["seeds"] * len(c["layers"]) for c in CONFIGS.values())
    assert study_jobs([7, 8], ["learned"]) == [(7, 1, "learned"), (8, 1, "learned"), (7, 2, "learned"), (8, 2, "learned")]


@pytest.fixture
def tiny(monkeypatch):
    """A configuration that trains in a second, so the command can be tested end to end."""
    config = json.loads(json.dumps(CONFIGS["learned"]))
    config["training"]["steps"], config["seeds"] = 6, 2
    config["task"] = {"seq_len": 12, "vocab_size": 16, "segment": [3, 5]}
    config["model"]["d_model"] = 16
    monkeypatch.setitem(CONFIGS, "tiny", config)
    return config


def test_a_run_records_what_the_chapter_reads(tiny):
    run = run_seed(3, 2, "tiny")
    assert (run["config"], run["seed"], run["data_seed"], run["num_layers"]) == ("tiny", 3, 3, 2)
    assert len(run["history"]) == 2  # steps 0 and 6 (log_every 10): the study file's "steps", tested below
    assert set(run["scores"][0]) == {"previous_token", "self", "duplicate", "induction"}
    assert len(run["ablation"]) == 2 and len(run["ablation"][0]) == tiny["model"]["num_heads"]
    assert set(run["composition"]) == {"q", "k", "v"} and all("all" in run["composition"][w] for w in "qkv")
    assert set(run["parts"]) == set(run["parts_all"]) == {"q", "k", "v"}
    assert set(run["parts"]["q"]) == {"token", "position", "bias"} and len(run["parts"]["k"]["bias"]) == 4
    assert len(run["mean_ablation"]["q"]) == 4 and set(run["weight_composition"]) == {"q", "k", "v"}
    assert len(run["copying"]["score"]) == len(run["untrained_copying"]["eigen"]) == 2
    again = run_seed(3, 2, "tiny")
    assert again["history"] == run["history"] and again["scores"] == run["scores"]  # a seed is one run
    other = run_seed(4, 2, "tiny")
    assert other["history"] != run["history"]  # another seed: other weights and other data


def test_the_command_writes_a_study_that_loads(tiny, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert cli(["study", "--configs", "tiny", "--seeds", "0-1", "--workers", "1", "--output", str(out)]) == 0
    written = load_study(out)
    assert len(written.runs) == 4 and set(written.config) == {"tiny"}
    assert written.about["baselines"]["tiny"]["no_copy_loss"] == pytest.approx(math.log(16), abs=1e-4)
    assert written.about["steps"]["tiny"] == [0, 6]  # when each history entry was recorded (log_every 10)
    assert all(len(run["history"]) == 2 for run in written.runs)
    assert "wrote 4 runs" in capsys.readouterr().out


def test_the_command_names_a_bad_configuration(capsys):
    with pytest.raises(SystemExit):
        cli(["study", "--configs", "learned,nope"])
    assert "choose among learned, rotary" in capsys.readouterr().err


def test_load_study_names_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m mha_lib.induction study"):
        load_study(Path(tmp_path) / "none.json")


# --- the mechanism findings, recounted from the JSON by hand (no FINDINGS code) --------------

def _raw():
    return json.loads(Path(study_module.STUDY_FILE).read_text())


def _changed(data, config):
    return [r for r in data["runs"] if r["config"] == config and r["num_layers"] == 2 and r["phase_change"] is not None]


def _argmax(xs):
    return max(range(len(xs)), key=xs.__getitem__)


def test_the_phase_change_is_five_records_in_a_row_recounted_from_the_histories():
    data = _raw()
    for run in data["runs"]:
        steps, history = data["steps"][run["config"]], run["history"]
        threshold = data["baselines"][run["config"]]["phase_threshold"]
        first = None
        for i in range(len(history) - 4):
            if all(loss < threshold for loss in history[i:i + 5]):
                first = steps[i]
                break
        # the recorded losses are rounded to 3 digits: only a loss within 6e-5 above ln(64) / 2 could flip
        assert run["phase_change"] == first, (run["config"], run["seed"])


def test_the_mechanism_counts_recounted_by_hand():
    data = _raw()
    base = data["baselines"]["learned"]
    runs = _changed(data, "learned")
    dup = [_argmax(r["scores"][0]["duplicate"]) for r in runs]
    threshold = base["phase_threshold"]
    position = sum(r["parts"]["q"]["position"][d] >= threshold for r, d in zip(runs, dup))
    token = sum(r["parts"]["q"]["token"][d] < threshold for r, d in zip(runs, dup))
    bias = sum(r["parts"]["q"]["bias"][d] < threshold for r, d in zip(runs, dup))
    mean = sum(r["mean_ablation"]["q"][d] >= threshold for r, d in zip(runs, dup))
    keys = sum(r["composition"]["k"]["all"] < threshold for r in runs)
    values = sum(r["composition"]["v"]["all"] < threshold for r in runs)
    n = len(runs)
    assert STATED["learned: the position part is needed in the queries"] == (position, n)
    assert STATED["learned: the token part is not needed in the queries"] == (token, n)
    assert STATED["learned: the bias part is not needed in the queries"] == (bias, n)
    assert STATED["learned: mean-ablated in the queries, it is needed too"] == (mean, n)
    assert STATED["learned: all four layer-1 heads at once are not needed in the keys"] == (keys, n)
    assert STATED["learned: all four layer-1 heads at once are not needed in the values"] == (values, n)
    single = sum(sum(s >= base["induction_head"] for s in r["scores"][0]["duplicate"]) == 1 for r in runs)
    assert STATED["learned: one duplicate-token head only"] == (single, n)
    copies = sum(min(r["copying"]["score"][1]) >= base["copying_head"] for r in runs)
    assert STATED["learned: all four layer-2 heads copy beyond random weights"] == (copies, n)
    p99 = base["random_composition_p99"]
    high_q = sum(min(r["weight_composition"]["q"][d]) >= p99 for r, d in zip(runs, dup))
    no_high_k = sum(max(x for row in r["weight_composition"]["k"] for x in row) < p99 for r in runs)
    assert STATED["learned: high Q-composition of the duplicate-token head with every layer-2 head"] == (high_q, n)
    assert STATED["learned: no high K-composition score"] == (no_high_k, n)
    untrained = [max(x for layer in r["untrained_copying"]["score"] for x in layer) < data["baselines"][r["config"]]["copying_head"]
                 and max(x for layer in r["untrained_copying"]["eigen"] for x in layer) < 0.5 for r in data["runs"]]
    assert STATED["untrained: no head copies, by either measure"] == (sum(untrained), len(untrained))
    two = [r for r in data["runs"] if r["num_layers"] == 2]
    agree = sum((r["phase_change"] is not None) == (r["loss"]["predictable"] < data["baselines"][r["config"]]["phase_threshold"])
                for r in two)
    assert STATED["two layers: a phase change is a held-out loss below the threshold"] == (agree, len(two))


def test_the_mechanism_findings_can_fail():
    # each new finding is false somewhere it could be: on the runs before training, or on made-up records
    data = _raw()
    run = _changed(data, "learned")[0]
    d = _argmax(run["scores"][0]["duplicate"])
    broken = json.loads(json.dumps(run))
    broken["parts"]["q"]["position"][d] = run["loss"]["predictable"]  # the position part not needed after all
    broken["parts"]["q"]["token"][d] = 4.0  # the token part needed
    broken["copying"]["score"][1][0] = 1 / 64  # a layer-2 head that copies nothing
    broken["weight_composition"]["q"][d] = [0.1] * 4  # no Q-composition above random
    broken["weight_composition"]["k"][0][0] = 0.5
    verdicts = check_findings(broken)
    for name in ("learned: the position part is needed in the queries", "learned: the token part is not needed in the queries",
                 "learned: all four layer-2 heads copy beyond random weights",
                 "learned: all four layer-2 heads copy beyond the one-layer control",
                 "learned: all four layer-2 heads are induction heads",
                 "learned: high Q-composition of the duplicate-token head with every layer-2 head",
                 "learned: no high K-composition score"):
        assert verdicts[name] is False, name


def test_the_copying_and_composition_counts_recounted_by_hand():
    # items of the chapter 08 review: two copying measures, the one-layer control, Q/K/V one by one, a noise floor
    data = _raw()
    base = data["baselines"]["learned"]
    one = [s for r in data["runs"] if r["num_layers"] == 1 for s in r["copying"]["score"][0]]
    assert len(one) == 96
    mean = sum(one) / len(one)
    line = mean + (1 - mean) / 2  # halfway from the control's mean to a perfect copier
    assert copying_control()["threshold"] == pytest.approx(line) and max(one) < line
    assert round(line, 3) == 0.626
    heads = {}
    for config in ("learned", "rotary"):
        runs = _changed(data, config)
        for layer in (1, 0):
            ind = [r["scores"][layer]["induction"][h] >= base["induction_head"] for r in runs for h in range(4)]
            arg = [r["copying"]["score"][layer][h] for r in runs for h in range(4)]
            eig = [r["copying"]["eigen"][layer][h] for r in runs for h in range(4)]
            n, name = len(arg), f"{config}, layer {layer + 1}"
            heads[f"{name}: induction pattern"] = (sum(ind), n)
            heads[f"{name}: copies beyond random weights"] = (sum(a >= base["copying_head"] for a in arg), n)
            heads[f"{name}: copies beyond the one-layer control"] = (sum(a >= line for a in arg), n)
            heads[f"{name}: copies by the eigenvalue measure"] = (sum(e >= 0.5 for e in eig), n)
            heads[f"{name}: induction head"] = (sum(i and a >= line for i, a in zip(ind, arg)), n)
    one_eigen = [e for r in data["runs"] if r["num_layers"] == 1 for e in r["copying"]["eigen"][0]]
    heads["one layer: copies beyond random weights"] = (sum(a >= base["copying_head"] for a in one), 96)
    heads["one layer: copies beyond the one-layer control"] = (sum(a >= line for a in one), 96)
    heads["one layer: copies by the eigenvalue measure"] = (sum(e >= 0.5 for e in one_eigen), 96)
    assert heads == STATED_HEADS
    runs = _changed(data, "learned")
    n, p99, threshold = len(runs), base["random_composition_p99"], base["phase_threshold"]
    all_heads = sum(all(r["scores"][1]["induction"][h] >= base["induction_head"] and r["copying"]["score"][1][h] >= line
                        for h in range(4)) for r in runs)
    assert STATED["learned: all four layer-2 heads are induction heads"] == (all_heads, n)
    assert STATED["learned: all four layer-2 heads copy beyond the one-layer control"] == (
        sum(min(r["copying"]["score"][1]) >= line for r in runs), n)
    dups = [[h for h in range(4) if r["scores"][0]["duplicate"][h] >= base["induction_head"]] for r in runs]
    rows_q = [[h for h in range(4) if min(r["weight_composition"]["q"][h]) >= p99] for r in runs]
    assert STATED["learned: the layer-1 heads with high Q-composition are the duplicate-token heads"] == (
        sum(q == d for q, d in zip(rows_q, dups)), n)
    two = [(r, d) for r, d in zip(runs, dups) if len(d) > 1]
    assert STATED["learned: a second duplicate-token head is not needed in the queries"] == (
        sum(all(r["composition"]["q"]["loss"][h] < threshold for h in d if h != _argmax(r["scores"][0]["duplicate"]))
            for r, d in two), len(two))
    assert STATED["learned: a high V-composition score"] == (
        sum(any(x >= p99 for row in r["weight_composition"]["v"] for x in row) for r in runs), n)
    assert STATED["learned: no duplicate-token head has a high V-composition score"] == (
        sum(all(x < p99 for h in d for x in r["weight_composition"]["v"][h]) for r, d in zip(runs, dups)), n)
    assert STATED["learned: all four layer-1 heads removed from the values lower the loss"] == (
        sum(r["composition"]["v"]["all"] < r["loss"]["predictable"] for r in runs), n)
    rotary = _changed(data, "rotary")
    above = 0
    for r in rotary:
        dup = r["scores"][0]["duplicate"]
        best, lowest = _argmax(dup), min(range(4), key=dup.__getitem__)
        q = r["composition"]["q"]["loss"]
        above += q[best] - r["loss"]["predictable"] > q[lowest] - r["loss"]["predictable"]
    assert STATED["rotary: it raises the loss more than the control head does"] == (above, len(rotary))
    assert STATED["rotary: all four layer-2 heads copy by the eigenvalue measure"] == (
        sum(min(r["copying"]["eigen"][1]) >= 0.5 for r in rotary), len(rotary))


def test_the_new_findings_can_fail():
    data = _raw()
    run = _changed(data, "learned")[0]
    broken = json.loads(json.dumps(run))
    broken["copying"]["eigen"][1][2] = 0.1  # a layer-2 head whose circuit does not raise its own token
    broken["copying"]["score"][1] = [0.9] * 4  # every layer-2 head copies beyond the control
    broken["weight_composition"]["q"][0] = [0.5] * 4  # a head that is not a duplicate-token head, high Q
    broken["weight_composition"]["v"] = [[0.01] * 4] * 4  # no high V-composition
    broken["composition"]["v"]["all"] = 4.0  # the values need layer 1 after all
    verdicts = check_findings(broken)
    for name, expected in (("learned: all four layer-2 heads copy by the eigenvalue measure", False),
                           ("learned: all four layer-2 heads are induction heads", True),
                           ("learned: the layer-1 heads with high Q-composition are the duplicate-token heads", False),
                           ("learned: a high V-composition score", False),
                           ("learned: all four layer-1 heads removed from the values lower the loss", False)):
        assert verdicts[name] is expected, name
    rotary = json.loads(json.dumps(_changed(data, "rotary")[0]))
    dup = rotary["scores"][0]["duplicate"]
    lowest = min(range(4), key=dup.__getitem__)
    rotary["composition"]["q"]["loss"][lowest] = 4.0  # the control head costs more than the duplicate-token head
    assert check_findings(rotary)["rotary: it raises the loss more than the control head does"] is False


def test_the_shipped_model_is_the_study_run_of_seed_0(study):
    from mha_lib.induction.run import eval_batch, measure
    from mha_lib.induction.study import load_trained

    torch.set_num_threads(1)
    run = next(r for r in study.runs if r["config"] == "learned" and r["num_layers"] == 2 and r["seed"] == 0)
    measured = measure(load_trained(), eval_batch(0), mechanism=False)
    assert measured["loss"]["predictable"] == pytest.approx(run["loss"]["predictable"], abs=0.01)
    for layer in range(2):
        assert measured["copying"]["score"][layer] == pytest.approx(run["copying"]["score"][layer], abs=0.05)
    for which in "qkv":
        assert measured["composition"][which]["loss"] == pytest.approx(run["composition"][which]["loss"], abs=0.01)
