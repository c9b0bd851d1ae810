"""The seed study behind chapters 07 and 12: the committed file, its command, its baselines and
thresholds, and the findings the chapters state, checked on the committed runs and on seeds
trained here and now."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import torch

from mha_lib.sentiment import load_study, make_datasets
from mha_lib.sentiment.__main__ import parse_heads, parse_seeds
from mha_lib.sentiment import findings as findings_module
from mha_lib.sentiment.findings import (
    FINDINGS,
    STATED,
    ablation_outcomes,
    attended_polarities,
    check_findings,
    colliding_pairs,
    count_findings,
    findings_table,
    independent,
    kernel_path_changes,
    learned,
    learning_order,
    negation_head_of,
    outcome,
    outcomes_table,
    robust_seeds,
    sent_token,
    wording,
)
from mha_lib.sentiment.run import CONFIG, baselines, run_seed
from mha_lib.sentiment.study import HEADS, RUNS, STUDY_FILE, Study, save_study, study_jobs

ROOT = Path(__file__).resolve().parent.parent
GROUPS_07 = {"negated", "plain", "plain+", "plain-", "negated+", "negated-"}
GROUPS_11 = {"plain", "same half", "different halves"}
# Seeds that are not in the committed study, chosen before they were ever trained.
FRESH_SEEDS = (1000, 1001)


@pytest.fixture(scope="module")
def study() -> Study:
    return load_study()


def check_run(run: dict, halves: bool = True) -> None:
    """The fields the chapters read, with values in range (``halves``: the run was asked for
    chapter 12's part too)."""
    H = run["num_heads"]
    assert {"seed", "data_seed", "num_heads", "replica", "path", "torch", "threads", "baselines", "untrained"} <= set(run)
    heads = run["heads"]
    for accuracy in (heads["accuracy"], heads["feed_forward_off"]):
        assert set(accuracy) == GROUPS_07 and all(0 <= a <= 1 for a in accuracy.values())
    assert set(heads["ablation"]) == {"zero", "mean", "resample"}
    if H == 2 and not run["replica"] or "mean_from" in heads:  # the control of mean-ablation (chapter 07 reads it)
        assert set(heads["mean_from"]) == {"plain", "negated"}
    for per_head in [*heads["ablation"].values(), *heads.get("mean_from", {}).values()]:
        assert set(per_head) == {f"head {h}" for h in range(H)}
        assert all(set(a) == GROUPS_07 and all(0 <= x <= 1 for x in a.values()) for a in per_head.values())
    assert set(heads["without_word"]) == {"plain", "negated"} and all(0 <= x <= 1 for x in heads["without_word"].values())
    for group, shares in heads["cls_shares"].items():
        assert group in GROUPS_07 and list(shares) == ["<cls>", "not", "sentiment word", "other words"]
        for h in range(H):  # each head's four shares add up to all of <cls>'s attention
            assert math.isclose(sum(s[h] for s in shares.values()), 1, abs_tol=1e-3)
    assert all(len(heads[key]) == H for key in ("cls_to_not", "word_to_not", "not_to_word"))
    for group, terms in heads["logit_attribution"].items():
        assert list(terms) == ["embedding", *(f"head {h}" for h in range(H)), "W_o bias", "feed-forward", "constant"]
    history = heads["history"]
    assert all(len(history[key]) == CONFIG["training"]["epochs"] for key in ("negated", "plain", "cls_to_not", "cls_to_word"))
    assert all(len(shares) == H for shares in history["cls_to_not"])
    if H == 2 and not run["replica"] and halves:
        assert set(run["halves"]) == {"free, tested free", "free, tested restricted", "trained restricted"}
        assert all(set(accuracy) == GROUPS_11 for accuracy in run["halves"].values())
        assert all(len(c) == CONFIG["n_test"] and set(c) <= {"0", "1"} for c in run["halves_correct"].values())
    else:
        assert "halves" not in run


def test_committed_runs_are_independent_and_complete(study):
    """Each configuration: its own seeds, each with its own data; replicas apart."""
    assert study.config == json.loads(json.dumps(CONFIG))
    for H in HEADS:
        seeds = [r["seed"] for r in study.runs if independent(r, H)]
        assert sorted(seeds) == list(range(RUNS[H])) and RUNS[H] >= 20
    assert RUNS[2] >= 30
    assert all(r["data_seed"] == r["seed"] for r in study.runs)  # each run its own sentences
    replicas = [r for r in study.runs if r["replica"]]
    assert sorted(r["seed"] for r in replicas) == list(range(RUNS[2])) and {r["num_heads"] for r in replicas} == {2}
    assert {r["path"] for r in replicas} == {"DEFAULT"} and "DEFAULT" not in {r["path"] for r in study.runs
                                                                            if not r["replica"]}
    assert {r["threads"] for r in study.runs} == {1}
    for run in study.runs:
        check_run(run)


def test_data_differs_between_runs():
    """Two seeds draw different held-out sentences: the runs do not share their data."""
    a, b = (make_datasets(CONFIG["n_train"], CONFIG["n_test"], seed=s)[1] for s in (0, 1))
    assert [e.tokens for e in a] != [e.tokens for e in b]


def test_every_threshold_comes_from_its_baseline(study):
    """Each run's baselines are what baselines() computes from its own held-out sentences, and
    the thresholds are the stated functions of the baselines, not numbers typed in."""
    for run in study.runs[:: max(1, len(study.runs) // 12)]:
        test = make_datasets(CONFIG["n_train"], CONFIG["n_test"], seed=run["data_seed"])[1]
        assert run["baselines"] == baselines(test)
    test = make_datasets(100, 200, seed=3)[1]
    base = baselines(test)
    negated = [e for e in test if e.negated]
    uniform = sum(1 / (len(e.tokens) + 1) for e in negated) / len(negated)  # <cls> + the words
    assert base["uniform"] == pytest.approx(uniform, abs=1e-4)
    assert base["role"] == pytest.approx(uniform + (1 - uniform) / 2, abs=1e-4)
    assert base["chance"] == 0.5 and base["learned_at"] == pytest.approx(1 - (1 - 0.5) / 10)
    assert base["near_chance"] == pytest.approx((base["chance"] + base["learned_at"]) / 2)
    assert base["inverted"] == pytest.approx(base["chance"] - (base["near_chance"] - base["chance"]))  # mirrored
    with pytest.raises(ValueError, match="negated"):
        baselines([e for e in test if not e.negated])


def test_findings_read_their_thresholds_from_the_run(study):
    """Move a run's baseline and the finding that uses it flips: nothing is typed into a test."""
    run = next(r for r in study.runs if independent(r) and learned(r) and check_findings(r)["a negation head"])
    moved = copy.deepcopy(run)
    moved["baselines"]["role"] = 1.01
    assert check_findings(moved)["a negation head"] is False
    assert check_findings(moved)["untrained: no head has a role"] is True
    moved["baselines"]["role"] = 0.0
    assert check_findings(moved)["untrained: no head has a role"] is False
    moved["baselines"]["learned_at"] = 1.01
    assert "a negation head" not in check_findings(moved)  # no longer a run that learned


def test_the_counts_support_the_chapters_wording(study):
    """STATED says "all", "most", "some" or "none" of each finding; the committed counts agree."""
    counts = count_findings(study)
    assert set(STATED) <= set(FINDINGS) and STATED
    for name, said in STATED.items():
        k, n = counts[name]
        assert n >= 10, (name, k, n)  # each statement rests on many runs
        if isinstance(said, tuple):  # the text gives the count itself
            assert (k, n) == said, name
        else:
            assert wording(k, n) == said, (name, k, n)


def test_learning_order_counts_ties_as_ties():
    run = {"baselines": {"learned_at": 0.95}, "heads": {"history": {"plain": [0.5, 0.96], "negated": [0.6, 0.97]}}}
    assert learning_order(run) == "together"
    run["heads"]["history"]["negated"] = [0.6, 0.9]
    assert learning_order(run) == "plain first"
    run["heads"]["history"]["plain"] = [0.5, 0.9]
    assert learning_order(run) == "together"  # neither got there


def test_study_helpers(study, tmp_path):
    assert study.count(lambda r: True) == (len(study.runs), len(study.runs))
    k, n = study.count(lambda r: negation_head_of(r) == 0, where=lambda r: independent(r) and learned(r))
    assert 0 < k < n  # which head becomes the negation head is chance
    path = save_study(study.runs[:3], tmp_path / "s.json", command="python -m mha_lib.sentiment study")
    again = load_study(path)
    assert again.runs == study.runs[:3] and again.about["command"].startswith("python -m")
    with pytest.raises(FileNotFoundError, match="make one with `python -m mha_lib.sentiment study`"):
        load_study(tmp_path / "missing.json")


def test_jobs():
    jobs = study_jobs()
    assert len(jobs) == sum(RUNS.values()) + RUNS[2]
    assert study_jobs([7, 8], heads=[1, 2], replicas=True) == [(7, 1, False), (8, 1, False), (7, 2, False),
                                                               (8, 2, False), (7, 2, True), (8, 2, True)]
    assert study_jobs([7], heads=[4], replicas=True) == [(7, 4, False)]


def test_study_file_ships_with_the_package():
    assert resources.files("mha_lib.sentiment").joinpath("study.json").is_file()
    assert STUDY_FILE.is_file()
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "study.json" in pyproject["tool"]["setuptools"]["package-data"]["mha_lib.sentiment"]


def test_seed_and_heads_parsing():
    assert parse_seeds("0-3,7") == [0, 1, 2, 3, 7]
    assert parse_seeds("5") == [5]
    for bad in ("a-b", "", "-1"):
        with pytest.raises(Exception, match="seeds must"):
            parse_seeds(bad)
    assert parse_heads("2,8") == [2, 8]
    for bad in ("3", "two", ""):
        with pytest.raises(Exception, match="heads: choose among 1, 2, 4, 8"):
            parse_heads(bad)


def test_command_trains_fresh_seeds_that_show_the_findings(tmp_path):
    """`python -m mha_lib.sentiment study` end to end on seeds outside the committed study:
    what the chapters say held in every run holds in each fresh run it speaks to."""
    out = tmp_path / "fresh.json"
    seeds = ",".join(map(str, FRESH_SEEDS))
    result = subprocess.run(
        [sys.executable, "-m", "mha_lib.sentiment", "study", "--seeds", seeds, "--heads", "2", "--parts", "heads",
         "--no-replicas", "--output", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert f"{len(FRESH_SEEDS)}/{len(FRESH_SEEDS)} runs" in result.stderr
    runs = load_study(out).runs
    assert [run["seed"] for run in runs] == list(FRESH_SEEDS) and all("halves" not in run for run in runs)
    for run in runs:
        check_run(run, halves=False)
        results = check_findings(run)
        always = {name for name, said in STATED.items() if said == "all"}
        assert all(results[name] for name in always & set(results)), (run["seed"], results)


def test_halves_part_measures_three_models(monkeypatch):
    """The chapter 12 part, on a tiny training run (one epoch on 200 sentences), on the caller's
    threads: only the study's own worker processes set them."""
    monkeypatch.setitem(CONFIG["training"], "epochs", 1)
    threads = torch.get_num_threads()
    monkeypatch.setattr(torch, "set_num_threads", lambda n: pytest.fail(f"run_seed set the threads to {n}"))
    data = make_datasets(200, 150, seed=2)
    run = run_seed(0, parts=["halves"], data=data)
    assert torch.get_num_threads() == threads
    assert set(run) >= {"seed", "path", "halves", "halves_correct"} and "heads" not in run and run["data_seed"] is None
    for accuracy in run["halves"].values():
        assert set(accuracy) == GROUPS_11 and all(0 <= a <= 1 for a in accuracy.values())
    assert all(len(c) == 150 for c in run["halves_correct"].values())
    assert "halves" not in run_seed(0, num_heads=1, parts=["halves"], data=data)  # two heads only
    with pytest.raises(ValueError, match=r"parts must be among \('heads', 'halves'\), got \['ffn'\]"):
        run_seed(0, parts=["ffn"], data=data)


def test_command_line_errors():
    result = subprocess.run([sys.executable, "-m", "mha_lib.sentiment", "study", "--heads", "3"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and "heads: choose among 1, 2, 4, 8" in result.stderr
    result = subprocess.run([sys.executable, "-m", "mha_lib.sentiment", "study", "--workers", "0"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and "--workers must be at least 1" in result.stderr


def test_wording_follows_the_count():
    assert [wording(k, 10) for k in (10, 9, 7, 6, 5, 1, 0)] == ["all", "most", "most", "some", "some", "some", "none"]
    assert wording(16, 25) == "some" and wording(17, 25) == "most" and wording(14, 25) == "some"  # 2/3 = 16.7 of 25
    assert wording(16, 24) == "some" and wording(17, 24) == "most"  # exactly two thirds is not "most"
    assert wording(2, 3) == "some" and wording(20, 30) == "some" and wording(21, 30) == "most"
    for k, n in ((1, 0), (-1, 4), (5, 4)):
        with pytest.raises(ValueError, match="0 <= k <= n"):
            wording(k, n)


def test_findings_table_fails_when_the_study_stops_supporting_the_text(study, monkeypatch):
    table = findings_table(study, ["4 heads: learned"])
    k, n = count_findings(study)["4 heads: learned"]
    assert f"{k:>3} of {n:<3}" in table and "most" in table
    monkeypatch.setitem(STATED, "4 heads: learned", "all")  # what the text would say if it overclaimed
    with pytest.raises(AssertionError, match="4 heads: learned.*the text says 'all'"):
        findings_table(study, ["4 heads: learned"])
    with pytest.raises(KeyError, match="unknown findings"):
        findings_table(study, ["heads are detectives"])


def test_kernel_paths_are_a_robustness_check(study):
    """Replicas pair with their seeds; the rounding changes an outcome in some seeds, not most."""
    k, n = kernel_path_changes(study)
    assert n == sum(independent(r) and "heads" in r for r in study.runs)  # every two-head seed has a replica
    assert wording(k, n) == "some"
    replicas = {r["seed"]: r for r in study.runs if r.get("replica")}
    for seed in robust_seeds(study):
        run = next(r for r in study.runs if independent(r) and r["seed"] == seed)
        assert learned(run) and learned(replicas[seed])
    flipped = copy.deepcopy(study)
    run = next(r for r in flipped.runs if independent(r) and learned(r))
    run["heads"]["accuracy"]["negated"] = 0.5  # this seed now learned on one path only
    assert kernel_path_changes(flipped) == (k + 1, n) and run["seed"] not in robust_seeds(flipped)


def _run_with(**baselines_moved: float) -> dict:
    base = {"chance": 0.5, "learned_at": 0.95, "near_chance": 0.725, "inverted": 0.275, "uniform": 0.13, "role": 0.57}
    return {"baselines": base | baselines_moved}


def test_outcomes_come_from_the_baselines():
    """still learned >= 95%, hurt >= 72.5%, near chance >= 27.5%, inverted below: each bound from
    the run's baselines, so moving a baseline moves the outcome."""
    run = _run_with()
    assert [outcome(run, a) for a in (1.0, 0.95, 0.9, 0.725, 0.5, 0.275, 0.27, 0.0)] == [
        "still learned", "still learned", "hurt", "hurt", "near chance", "near chance", "inverted", "inverted"]
    assert outcome(_run_with(inverted=0.1), 0.2) == "near chance"
    assert outcome(_run_with(learned_at=0.99), 0.97) == "hurt"
    old = _run_with()
    del old["baselines"]["inverted"]  # a run from before the baseline existed: the same mirror of near_chance
    assert outcome(old, 0.27) == "inverted" and outcome(old, 0.28) == "near chance"


def _one_head_run(sent: dict[str, str | None]) -> dict:
    """A one-head run whose head sends each group the given role with share 0.9 (None: spread)."""
    roles = ("<cls>", "not", "sentiment word", "other words")
    shares = {group: {r: [0.9 if r == role else 0.1 / 3] if role else [0.25] for r in roles}
              for group, role in sent.items()}
    return _run_with() | {"num_heads": 1, "replica": False, "heads": {"cls_shares": shares}}


def test_colliding_pairs_are_opposite_labels_with_the_same_token():
    run = _one_head_run({"plain+": "sentiment word", "plain-": "sentiment word", "negated+": "not", "negated-": "not"})
    assert sent_token(run, "negated+", 0) == "not" and colliding_pairs(run) == [("negated+", "negated-")]
    run = _one_head_run({"plain+": "sentiment word", "plain-": "other words", "negated+": "sentiment word",
                         "negated-": "not"})
    assert colliding_pairs(run) == [("plain+", "negated+")]  # "good" and "not good" get the same word
    run = _one_head_run({"plain+": "sentiment word", "plain-": "sentiment word", "negated+": "sentiment word",
                         "negated-": "sentiment word"})
    assert colliding_pairs(run) == [("plain+", "negated+"), ("plain-", "negated-")]  # "good" is not "bad"
    run = _one_head_run({"plain+": None, "plain-": None, "negated+": None, "negated-": None})
    assert colliding_pairs(run) == [] and sent_token(run, "plain+", 0) is None  # a spread head sends no one token
    run = _one_head_run({"plain+": "other words", "plain-": "sentiment word", "negated+": "not",
                         "negated-": "other words"})
    assert colliding_pairs(run) == []  # "good" and "not bad" share their label: no collision


def test_absence_reading_follows_the_unattended_polarity():
    """A run that looks at positive words only reads a deleted word as negative, and the other way."""
    shares = {g: {"<cls>": [0, 0], "not": [0, 0], "sentiment word": [0.0, 0.0], "other words": [1, 1]}
              for g in ("plain+", "plain-", "negated+", "negated-")}
    shares["plain+"]["sentiment word"] = [0.9, 0.1]  # "good" fetched by head 0; "bad" by no head
    run = _run_with() | {"heads": {"cls_shares": shares, "without_word": {"plain": 0.1, "negated": 0.5}}}
    assert attended_polarities(run) == (True, False)
    assert findings_module._absence_read(run)  # 90% called negative: the polarity no head looks at
    run["heads"]["without_word"]["plain"] = 0.5
    assert not findings_module._absence_read(run)  # a coin's answer is no reading of absence
    shares["plain+"]["sentiment word"] = [0.1, 0.1]
    shares["plain-"]["sentiment word"] = [0.1, 0.9]
    run["heads"]["without_word"]["plain"] = 0.8
    assert attended_polarities(run) == (False, True) and findings_module._absence_read(run)


def test_absence_control_reads_the_direction_not_the_firmness():
    """Where both polarities get a head, a firm answer counts as firm either way; the direction
    counts only toward the polarity that fewer heads fetch."""
    shares = {g: {"<cls>": [0, 0], "not": [0, 0], "sentiment word": [0.0, 0.0], "other words": [1, 1]}
              for g in ("plain+", "plain-", "negated+", "negated-")}
    shares["plain+"]["sentiment word"] = [0.9, 0.8]  # "good": two heads
    shares["plain-"]["sentiment word"] = [0.1, 0.9]  # "bad": one head
    run = _run_with() | {"heads": {"cls_shares": shares, "without_word": {"plain": 0.1, "negated": 0.5}}}
    assert findings_module.heads_on_word(run) == (2, 1) and attended_polarities(run) == (True, True)
    assert findings_module._read_one_way(run) and findings_module._fewer_heads_read(run)  # 90% negative
    run["heads"]["without_word"]["plain"] = 0.9  # as firm, the other way
    assert findings_module._read_one_way(run) and not findings_module._fewer_heads_read(run)
    run["heads"]["without_word"]["plain"] = 0.5
    assert not findings_module._read_one_way(run) and not findings_module._fewer_heads_read(run)


def test_ablation_outcomes_count_each_group(study):
    """The outcome table adds up to the runs that learned, group by group, and agrees with the
    per-run accuracies it is made of."""
    learned_runs = [r for r in study.runs if independent(r) and "heads" in r and learned(r)]
    for who in ("negation", "other"):
        for how in ("zero", "mean", "resample"):
            counts = ablation_outcomes(study, who, how)
            assert all(sum(c.values()) == len(learned_runs) for c in counts.values())
    r = learned_runs[0]
    expected = outcome(r, r["heads"]["ablation"]["mean"][f"head {negation_head_of(r)}"]["plain+"])
    assert ablation_outcomes(Study(runs=[r]), "negation", "mean")["plain+"] == {expected: 1}
    with pytest.raises(ValueError, match="who must be"):
        ablation_outcomes(study, "third", "mean")
    table = outcomes_table(study)
    assert table.count("\n") == 6 and "mean-ablated negation head" in table
    # the control: the negation head's mean over one kind of sentence only, read from "mean_from"
    expected = outcome(r, r["heads"]["mean_from"]["plain"][f"head {negation_head_of(r)}"]["plain+"])
    assert ablation_outcomes(Study(runs=[r]), "negation", "plain-only mean")["plain+"] == {expected: 1}
    controls = [("negation", "mean"), ("negation", "plain-only mean"), ("negation", "negated-only mean")]
    table = outcomes_table(study, controls)
    assert table.count("\n") == 3 and "negation head, plain-only mean" in table
    # a different measurement from the mean over all sentences: some run's plain group moves
    assert any(ablation_outcomes(Study(runs=[run]), "negation", "mean")
               != ablation_outcomes(Study(runs=[run]), "negation", "plain-only mean") for run in learned_runs)


def test_findings_table_checks_an_exact_count_where_the_text_gives_one(study, monkeypatch):
    k, n = count_findings(study)["2 heads: learned"]
    monkeypatch.setitem(STATED, "2 heads: learned", (k, n))
    assert f"{k:>3} of {n:<3}" in findings_table(study, ["2 heads: learned"])
    monkeypatch.setitem(STATED, "2 heads: learned", (k + 1, n))
    with pytest.raises(AssertionError, match=f"the text says {k + 1} of {n}"):
        findings_table(study, ["2 heads: learned"])


def test_new_counts_recomputed_by_hand_from_the_json():
    """The per-group, inverted, absence and one-head counts, recounted from the raw JSON without
    the findings module's helpers: each run's own baselines, the negation head as the head with
    the larger share on "not", the other head as the other one."""
    runs = json.loads(STUDY_FILE.read_text())["runs"]
    two = [r for r in runs if not r["replica"] and r["num_heads"] == 2]
    won = [r for r in two if min(r["heads"]["accuracy"]["negated"], r["heads"]["accuracy"]["plain"])
           >= r["baselines"]["learned_at"]]

    def acc(r, how, head, group):
        return r["heads"]["ablation"][how][f"head {head}"][group]

    def inverted_at(r):
        return r["baselines"]["chance"] - (r["baselines"]["near_chance"] - r["baselines"]["chance"])

    by_hand = {}
    for how in ("zero", "mean", "resample"):
        inverted_plain = other_broke = 0
        for r in won:
            neg = 0 if r["heads"]["cls_to_not"][0] >= r["heads"]["cls_to_not"][1] else 1
            inverted_plain += any(acc(r, how, neg, g) < inverted_at(r) for g in ("plain+", "plain-"))
            other_broke += any(acc(r, how, 1 - neg, g) < r["baselines"]["near_chance"] for g in ("negated+", "negated-"))
        by_hand[f"{how}-ablating the negation head: a plain group inverted"] = (inverted_plain, len(won))
        by_hand[f"{how}-ablating the other head: a negated group near chance or inverted"] = (other_broke, len(won))
    one = [r for r in runs if not r["replica"] and r["num_heads"] == 1]
    roles = ("<cls>", "not", "sentiment word", "other words")

    def top(r, g):
        shares = r["heads"]["cls_shares"][g]
        best = max(roles, key=lambda role: shares[role][0])
        return best if shares[best][0] >= r["baselines"]["role"] else None

    collide = 0
    for r in one:
        pairs = [("plain+", "plain-"), ("plain+", "negated+"), ("plain-", "negated-"), ("negated+", "negated-")]
        collide += any(top(r, a) is not None and top(r, a) == top(r, b)
                       and (top(r, a) != "sentiment word" or a[-1] == b[-1]) for a, b in pairs)
    by_hand["1 head: two groups with opposite labels get the same token"] = (collide, len(one))
    # absence: the word-deleted plain sentences, by the number of heads with a role on each polarity's word
    firm = direction = fewer = 0
    both = []
    for r in won:
        share_positive, bar = r["heads"]["without_word"]["plain"], r["baselines"]["near_chance"]
        on = [sum(x >= r["baselines"]["role"] for x in r["heads"]["cls_shares"][g]["sentiment word"])
              for g in ("plain+", "plain-")]
        if min(on) > 0:
            both.append(r)
            firm += max(share_positive, 1 - share_positive) >= bar
        if on[0] != on[1]:
            fewer += 1
            direction += (share_positive if on[0] < on[1] else 1 - share_positive) >= bar
    by_hand["both polarities looked at: word deleted, read one way"] = (firm, len(both))
    by_hand["plain, word deleted: read as the polarity fewer heads look at"] = (direction, fewer)
    # the control of mean-ablation: the negation head replaced by its plain-only or negated-only mean
    for kind in ("plain", "negated"):
        inverted_plain = 0
        for r in won:
            neg = 0 if r["heads"]["cls_to_not"][0] >= r["heads"]["cls_to_not"][1] else 1
            inverted_plain += any(r["heads"]["mean_from"][kind][f"head {neg}"][g] < inverted_at(r)
                                  for g in ("plain+", "plain-"))
        by_hand[f"{kind}-only mean, negation head: a plain group inverted"] = (inverted_plain, len(won))
    counts = count_findings(load_study())
    assert {name: counts[name] for name in by_hand} == by_hand
    assert by_hand["mean-ablating the negation head: a plain group inverted"] == STATED[
        "mean-ablating the negation head: a plain group inverted"]
