"""The seed study behind chapters 07 and 11: the committed file, its command, and the findings
the chapters assert, checked on the committed runs and on seeds trained here and now."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import torch

from mha_lib.sentiment import load_study, make_datasets
from mha_lib.sentiment.__main__ import parse_seeds
from mha_lib.sentiment.study import (
    CONFIG,
    FINDINGS,
    PARTS,
    STUDY_FILE,
    Study,
    check_findings,
    learned,
    negation_head_of,
    run_seed,
    save_study,
)

ROOT = Path(__file__).resolve().parent.parent
GROUPS_06 = {"negated", "plain", "plain+", "plain-", "negated+", "negated-"}
GROUPS_08 = {"plain", "same half", "different halves"}


@pytest.fixture(scope="module")
def study() -> Study:
    return load_study()


def check_run(run: dict) -> None:
    """The fields the chapters read, with values in range."""
    assert {"seed", "path", "torch", "threads", "aten_cpu_capability"} <= set(run)
    heads = run["heads"]
    for accuracy in (heads["accuracy"], heads["feed_forward_off"], *heads["silenced"].values()):
        assert set(accuracy) == GROUPS_06 and all(0 <= a <= 1 for a in accuracy.values())
    assert set(heads["silenced"]) == {"head 0", "head 1", "both"}
    for group, shares in heads["cls_shares"].items():
        assert group in GROUPS_06 and list(shares) == ["<cls>", "not", "sentiment word", "other words"]
        for h in range(2):  # each head's four shares add up to all of <cls>'s attention
            assert math.isclose(sum(s[h] for s in shares.values()), 1, abs_tol=1e-3)
    assert all(len(heads[key]) == 2 for key in ("cls_to_not", "word_to_not", "not_to_word"))
    assert all(len(curve) == CONFIG["training"]["epochs"] for curve in heads["history"].values())
    assert set(run["halves"]) == {"free, tested free", "free, tested restricted", "trained restricted"}
    assert all(set(accuracy) == GROUPS_08 for accuracy in run["halves"].values())


def test_committed_study_covers_seeds_and_kernel_paths(study):
    assert study.config == json.loads(json.dumps(CONFIG)) and study.about["parts"] == list(PARTS)
    assert len(study.paths) >= 2 and "DEFAULT" in study.paths  # ATEN_CPU_CAPABILITY=default, and another
    for path in study.paths:
        seeds = sorted(run["seed"] for run in study.runs if run["path"] == path)
        assert seeds == study.seeds and len(seeds) >= 20  # every seed on every path, once
    assert {run["threads"] for run in study.runs} == {1}
    for run in study.runs:
        check_run(run)
        assert (run["aten_cpu_capability"] is None) == (run["path"] == study.paths[0])  # native first


def test_every_committed_run_shows_the_robust_findings(study):
    """What the chapters assert on the learner's model held in every run it applies to."""
    seen = {name: 0 for name in FINDINGS}
    for run in study.runs:
        results = check_findings(run)
        assert all(results.values()), (run["seed"], run["path"], results)
        for name in results:
            seen[name] += 1
    assert all(n >= 40 for n in seen.values()), seen  # each finding rests on many runs
    assert sum(learned(run) for run in study.runs) >= 0.75 * len(study.runs)


def test_study_helpers(study, tmp_path):
    assert study.count(lambda r: True) == (len(study.runs), len(study.runs))
    k, n = study.count(lambda r: negation_head_of(r) == 0, where=learned)
    assert 0 < k < n  # which head becomes the negation head is chance
    low, high = study.span(lambda r: r["heads"]["accuracy"]["plain"], path=study.paths[0])
    assert 0 <= low <= high <= 1
    path = save_study(study.runs[:3], tmp_path / "s.json", command="python -m mha_lib.sentiment study")
    again = load_study(path)
    assert again.runs == study.runs[:3] and again.about["command"].startswith("python -m")
    with pytest.raises(FileNotFoundError, match="make one with `python -m mha_lib.sentiment study`"):
        load_study(tmp_path / "missing.json")


def test_study_file_ships_with_the_package():
    assert resources.files("mha_lib.sentiment").joinpath("study.json").is_file()
    assert STUDY_FILE.is_file()
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "study.json" in pyproject["tool"]["setuptools"]["package-data"]["mha_lib.sentiment"]


def test_seed_parsing():
    assert parse_seeds("0-3,7") == [0, 1, 2, 3, 7]
    assert parse_seeds("5") == [5]
    for bad in ("a-b", "", "-1"):
        with pytest.raises(Exception, match="seeds must"):
            parse_seeds(bad)


def test_command_trains_fresh_seeds_that_show_the_findings(tmp_path):
    """`python -m mha_lib.sentiment study` end to end, on this machine's own kernel path: three
    seeds that learned on all three paths of the committed study, measured and checked."""
    out = tmp_path / "fresh.json"
    result = subprocess.run(
        [sys.executable, "-m", "mha_lib.sentiment", "study", "--seeds", "1,3-4", "--parts", "heads",
         "--kernels", "native", "--output", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "3/3 seeds" in result.stderr and f"wrote 3 runs to {out}" in result.stdout
    runs = load_study(out).runs
    assert [run["seed"] for run in runs] == [1, 3, 4] and all("halves" not in run for run in runs)
    checked = [check_findings(run) for run in runs]
    assert all(all(results.values()) for results in checked), checked
    assert sum(map(bool, checked)) >= 2  # at least two runs learned, so the findings were checked


def test_halves_part_measures_three_models(monkeypatch):
    """The chapter 11 part, on a tiny training run (one epoch on 200 sentences), on the caller's
    threads: only the command line's own worker process sets them."""
    monkeypatch.setitem(CONFIG["training"], "epochs", 1)
    threads = torch.get_num_threads()
    monkeypatch.setattr(torch, "set_num_threads", lambda n: pytest.fail(f"run_seed set the threads to {n}"))
    data = make_datasets(200, 150, seed=2)
    run = run_seed(0, parts=["halves"], data=data)
    assert torch.get_num_threads() == threads
    assert set(run) >= {"seed", "path", "halves"} and "heads" not in run
    for accuracy in run["halves"].values():
        assert set(accuracy) == GROUPS_08 and all(0 <= a <= 1 for a in accuracy.values())
    with pytest.raises(ValueError, match=r"parts must be among \('heads', 'halves'\), got \['ffn'\]"):
        run_seed(0, parts=["ffn"], data=data)


def test_command_line_errors():
    result = subprocess.run([sys.executable, "-m", "mha_lib.sentiment", "study", "--kernels", "sse9"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and "choose among native, avx512, avx2, default" in result.stderr
