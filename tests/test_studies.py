"""The machinery every seed study shares (mha_lib/studies.py): jobs in worker processes, the
progress bar, the study file and its format, and reading the runs back.

The job functions here are the standard library's (``operator.neg``, ``math.sqrt``,
``os.getenv``): a spawned worker imports them by name without importing this file."""

from __future__ import annotations

import argparse
import io
import json
import math
import operator
import os
import time
from pathlib import Path

import pytest
import torch

from mha_lib import studies
from mha_lib.induction import study as induction_study
from mha_lib.sentiment import study as sentiment_study
from mha_lib.studies import FORMAT, JobError, Progress, Study, load_study, read_study, run_jobs, save_study

MAKE = "python -m mha_lib.example study"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_results_come_back_in_the_order_of_the_jobs():
    stream = io.StringIO()
    results = run_jobs(operator.neg, [1, 2, 3, 4], workers=1, cost=lambda job: job, progress=Progress(4, stream=stream))
    assert results == [-1, -2, -3, -4]  # though they ran as 4, 3, 2, 1 (below)
    lines = stream.getvalue().splitlines()
    assert [line.split("] ")[1].split(",")[0] for line in lines] == ["1/4 runs", "2/4 runs", "3/4 runs", "4/4 runs"]


def test_in_worker_processes_too_with_their_environment(monkeypatch):
    """Two workers (one pool for two claims: spawning one costs seconds). cost = the job's
    number: submitted D, C, B, A, so they cannot finish as A, B, C, D."""
    names = [f"MHA_STUDIES_{letter}" for letter in "ABCD"]
    for name in names:
        monkeypatch.delenv(name, raising=False)
    env = {name: f"value {i}" for i, name in enumerate(names)}
    assert run_jobs(os.getenv, names, workers=2, cost=names.index, env=env, progress=False) == list(env.values())
    assert not set(names) & set(os.environ)  # restored here


def test_the_costliest_job_starts_first_here():
    started: list[int] = []

    def job(n: int) -> int:
        started.append(n)
        return n * 10

    assert run_jobs(job, [1, 3, 2, 3], workers=1, cost=lambda n: n, progress=False) == [10, 30, 20, 30]
    assert started == [3, 3, 2, 1]  # equal costs keep the jobs' order
    assert run_jobs(job, [], workers=2, progress=False) == []  # no worker is started for nothing


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_job_is_named(workers):
    with pytest.raises(JobError, match=r"job -1\.0 failed: ValueError: "):
        run_jobs(math.sqrt, [4.0, -1.0, 9.0], workers=workers, progress=False)


def test_workers_must_be_at_least_one():
    with pytest.raises(ValueError, match="workers must be at least 1, got 0"):
        run_jobs(operator.neg, [1], workers=0)


def test_threads_are_set_for_the_jobs_and_restored_here():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert run_jobs(lambda _: torch.get_num_threads(), [0, 1], workers=1, threads=1, progress=False) == [1, 1]
        assert torch.get_num_threads() == 2
        assert run_jobs(lambda _: torch.get_num_threads(), [0], workers=1, threads=None, progress=False) == [2]
    finally:
        torch.set_num_threads(old)


def test_progress_line_one_line_per_step_in_a_file():
    stream = io.StringIO()
    started = time.perf_counter() - 5
    studies.progress_line("study", 1, 4, started, unit="runs", stream=stream)
    studies.progress_line("study", 4, 4, started, unit="runs", stream=stream)
    assert stream.getvalue() == ("   study [######..................] 1/4 runs, 5 s\n"
                                 "   study [########################] 4/4 runs, 5 s\n")


def test_progress_line_redraws_in_place_on_a_terminal():
    stream = Terminal()
    started = time.perf_counter()
    studies.progress_line("seeds", 1, 2, started, stream=stream)
    studies.progress_line("seeds", 2, 2, started, stream=stream)
    assert stream.getvalue() == ("\r   seeds [############............] 1/2 seeds, 0 s"
                                 "\r   seeds [########################] 2/2 seeds, 0 s\n")


def test_save_and_load_keep_the_runs_and_the_metadata(tmp_path):
    runs = [{"seed": 0, "config": "a", "path": "AVX2", "loss": [1.5, 0.25]},
            {"seed": 1, "config": "b", "path": "DEFAULT", "loss": [1.25, float("nan")]}]
    about = {"what": "an example study", "command": MAKE, "seconds": 12}
    path = save_study(runs, tmp_path / "s.json", about, header={"config": {"steps": 8}, "baselines": {"chance": 0.5}})
    text = path.read_text()
    assert text.count('\n{"seed":') == 2  # one run per line: a re-run gives a small diff
    data = read_study(path, default=tmp_path / "unused.json", make=MAKE)
    assert data["format"] == FORMAT and data["baselines"] == {"chance": 0.5}
    study = load_study(path, default=tmp_path / "unused.json", make=MAKE)
    assert study.runs[0] == runs[0] and math.isnan(study.runs[1]["loss"][1])
    assert study.config == {"steps": 8}
    assert {k: study.about[k] for k in about} == about
    assert set(study.about["made_with"]) == {"python", "torch", "cpu_capability", "platform"}
    assert study.about["made_with"]["torch"] == torch.__version__
    with pytest.raises(ValueError, match=r"may not hold \['runs'\]"):
        save_study(runs, tmp_path / "t.json", about, header={"runs": []})


def test_load_defaults_to_the_shipped_file_and_names_the_command(tmp_path):
    shipped = save_study([{"seed": 3}], tmp_path / "shipped.json", {"what": "shipped"})
    assert load_study(None, default=shipped, make=MAKE).runs == [{"seed": 3}]
    with pytest.raises(FileNotFoundError, match=f"no study at .*absent.json; make one with `{MAKE}`"):
        load_study(None, default=tmp_path / "absent.json", make=MAKE)


def test_a_file_of_a_newer_format_is_refused(tmp_path):
    path = tmp_path / "new.json"
    path.write_text(json.dumps({"format": FORMAT + 1, "about": {}, "runs": []}))
    with pytest.raises(ValueError, match=f"format {FORMAT + 1}, and this mha_lib reads format 1 to {FORMAT}: "
                                         f"update mha_lib \\(git pull\\), or make the file again with `{MAKE}`"):
        read_study(path, default=path, make=MAKE)
    for bad in ("two", 0, True):
        path.write_text(json.dumps({"format": bad, "runs": []}))
        with pytest.raises(ValueError, match="this mha_lib reads format"):
            read_study(path, default=path, make=MAKE)
    path.write_text(json.dumps([{"seed": 0}]))
    with pytest.raises(ValueError, match='is not a study file: it has no list of "runs"'):
        read_study(path, default=path, make=MAKE)


@pytest.mark.parametrize("module", [sentiment_study, induction_study], ids=["sentiment", "induction"])
def test_the_shipped_files_have_no_format_field_and_still_load(module):
    raw = json.loads(Path(module.STUDY_FILE).read_text())
    assert "format" not in raw  # written before it existed: format 1
    study = module.load_study()
    assert isinstance(study, Study) and study.runs == raw["runs"]


def test_select_gives_the_runs_of_one_configuration():
    study = Study(runs=[{"config": "a", "num_layers": 1, "seed": 0}, {"config": "a", "num_layers": 2, "seed": 0},
                        {"config": "b", "num_layers": 2, "seed": 1}])
    assert study.select(config="a", num_layers=2) == [study.runs[1]]
    assert [run["seed"] for run in study.select(num_layers=2)] == [0, 1]
    assert study.select(config="c") == [] and study.seeds == [0, 1]


def test_the_command_line_options_every_study_takes():
    parser = argparse.ArgumentParser()
    studies.add_study_arguments(parser, output="example_study.json")
    args = parser.parse_args(["--seeds", "3-4,7", "--workers", "1"])
    assert (args.seeds, args.workers, args.output, args.device) == ([3, 4, 7], 1, Path("example_study.json"), "cpu")
    assert parser.parse_args([]).seeds is None  # each configuration's own
