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
from mha_lib.induction.findings import FINDINGS, STATED, check_findings, count_findings
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
    # a finding says something: each can be false, and the untrained models are where they are
    untrained = [dict(run, scores=run["untrained"]) for run in study.runs if run["config"] == "learned"
                 and run["num_layers"] == 2 and run["phase_change"] is not None]
    for name in ("learned: all four layer-2 heads are induction heads", "learned: a duplicate-token head in layer 1"):
        assert not any(FINDINGS[name][1](run) for run in untrained), f"{name!r} holds before training too"


def test_check_findings_speaks_only_to_the_runs_a_finding_is_about(study):
    one_layer = next(r for r in study.runs if r["num_layers"] == 1)
    assert set(check_findings(one_layer)) == {"untrained: no head has a role", "one layer never changes phase",
                                               "one layer: no induction head"}
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
    assert set(run["composition"]) == {"q", "k", "v"}
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
