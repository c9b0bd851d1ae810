"""Chapter 09's study: the shipped file holds what the chapter says, recounted from its runs."""

from __future__ import annotations

import math

import pytest
import torch

from mha_lib.textlm import load_checkpoint, load_corpus
from mha_lib.textlm.config import MODEL, TRAIN
from mha_lib.textlm.findings import STATED, count_findings, most_needed, strongest, unigram_loss
from mha_lib.textlm.study import Probes, load_study, probe


@pytest.fixture(scope="module")
def study():
    return load_study()


@pytest.fixture(scope="module")
def unigram() -> float:
    corpus = load_corpus()
    return unigram_loss(corpus.train, Probes(corpus, MODEL["max_len"]).targets, len(corpus.tokenizer))


def test_the_study_has_at_least_5_independent_runs_of_the_shipped_configuration(study) -> None:
    runs = study.runs
    assert len(runs) >= 5
    assert len({r["seed"] for r in runs}) == len(runs) and len({r["data_seed"] for r in runs}) == len(runs)
    for r in runs:
        assert r["model"] == MODEL
        assert {k: v for k, v in r["train"].items() if k != "seed"} == {k: v for k, v in TRAIN.items() if k != "seed"}
        assert r["steps"][-1] == TRAIN["steps"] and len(r["probes"]) == len(r["steps"]) == len(r["val_loss"])


def test_the_findings_recount_to_what_the_chapter_states(study, unigram) -> None:
    counts = count_findings(study, unigram)
    for finding, stated in STATED.items():
        assert counts[finding] == stated, finding


def test_a_finding_can_be_false(study, unigram) -> None:
    # Change one run so that a stated finding no longer holds: the count moves.
    run = study.runs[1]
    saved = run["val_loss"][-1]
    try:
        run["val_loss"][-1] = unigram + 1
        assert count_findings(study, unigram)["held-out loss below the unigram model's"][0] == len(study.runs) - 1
    finally:
        run["val_loss"][-1] = saved


def test_the_shipped_model_is_the_study_s_seed_0(study) -> None:
    model, tok, info = load_checkpoint()
    run = next(r for r in study.runs if r["seed"] == 0)
    assert info["history"]["val_loss"] == run["val_loss"]
    corpus = load_corpus()
    again = probe(model, Probes(corpus, MODEL["max_len"]))
    # the scores recomputed here equal the recorded ones up to the last digits of a CPU kernel
    for role, rows in again["scores"].items():
        if role != "uniform":
            torch.testing.assert_close(torch.tensor(rows), torch.tensor(run["probes"][-1]["scores"][role]),
                                       atol=2e-3, rtol=0)
    assert math.isclose(again["icl"], run["probes"][-1]["icl"], abs_tol=2e-3)


def test_strongest_and_most_needed_pick_the_maximum() -> None:
    scores = {"previous": [[0.1, 0.5], [0.7, 0.2]]}
    assert strongest(scores, "previous") == (1, 0)
    run = {"ablation": {"classes": ["a", "b"], "increase": [[[0.1, 0.0], [0.3, 0.2]], [[0.2, 0.9], [0.0, 0.1]]]}}
    assert most_needed(run, "a") == (0, 1) and most_needed(run, "b") == (1, 0)


def test_the_configurations_tried_are_the_ones_the_code_names_and_recount_by_hand(study) -> None:
    """configurations.json holds one run of each entry of CONFIGURATIONS, made by the code as it is
    (the shipped configuration changed where the entry says), and the chapter's table recounts."""
    from mha_lib.textlm.configurations import CONFIGURATIONS, load_configurations, summary
    from mha_lib.textlm.findings import COPY_SHARE
    from mha_lib.textlm.scores import role_threshold

    runs = load_configurations()
    assert [r["name"] for r in runs] == list(CONFIGURATIONS)
    for run in runs:
        model_change, train_change = CONFIGURATIONS[run["name"]]
        assert run["seed"] == 0 and run["data_seed"] == 1000
        assert run["model"] == {**MODEL, **model_change}
        assert {k: v for k, v in run["train"].items() if k not in ("seed", "repeat")} == \
            {**{k: v for k, v in TRAIN.items() if k != "seed"}, **{k: v for k, v in train_change.items() if k != "repeat"}}
        assert run["train"].get("repeat", 0.0) == train_change.get("repeat", 0.0)
        assert run["steps"][-1] == TRAIN["steps"]
        # the summary, by hand
        best_induction = max(s for p in run["probes"] for row in p["scores"]["induction"] for s in row)
        last = run["probes"][-1]
        s = summary(run)
        assert s["induction"] == best_induction and s["val_loss"] == run["val_loss"][-1]
        assert s["copy_gain"] == pytest.approx(last["first_copy"] - last["second_copy"])
        # what the chapter states of every row
        uniform = last["scores"]["uniform"]
        assert best_induction <= uniform["induction"] + 0.005 < role_threshold(uniform["induction"])
        assert s["copy_gain"] < COPY_SHARE * last["first_copy"]
        assert 4 * uniform["previous"] < s["previous"] < role_threshold(uniform["previous"])
    by_name = {r["name"]: summary(r) for r in runs}
    assert max(by_name, key=lambda n: by_name[n]["copy_gain"]) == "context 32, repeats in half"
    assert by_name["repeats in half the windows"]["val_loss"] < min(r["val_loss"][-1] for r in study.runs)
    assert by_name["attention only"]["val_loss"] > max(r["val_loss"][-1] for r in study.runs)


def test_the_local_heads_recount_by_hand_from_the_file(study) -> None:
    """The local role, recounted without mha_lib's findings: a head whose score on the last four keys is
    at least halfway from uniform attention's to 1, at the last evaluation of each run."""
    layer2_counts, layer1_runs = [], 0
    for run in study.runs:
        last = run["probes"][-1]["scores"]
        bar = (1 + last["uniform"]["local"]) / 2
        layer1_runs += any(s >= bar for s in last["local"][0])
        layer2_counts.append(sum(s >= bar for s in last["local"][1]))
    assert min(layer2_counts) >= 3 and layer1_runs == STATED["a local head in layer 1 at the end"][0]
    # a run whose layer-2 heads lose the role drops out of the count
    run = study.runs[0]
    saved = [row[:] for row in run["probes"][-1]["scores"]["local"]]
    try:
        run["probes"][-1]["scores"]["local"] = [[0.0] * 4, [0.0] * 4]
        from mha_lib.textlm.findings import count_findings
        assert count_findings(study, 5.0)["a local head at the end"][0] == len(study.runs) - 1
    finally:
        run["probes"][-1]["scores"]["local"] = saved
