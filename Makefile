# The course's commands. `make help` lists them (every target; tests/test_workflows.py checks).
#
#   make lab             set up .venv (first time only) and start JupyterLab on the course
#   make exercise N=01   copy exercise 01 into workspace/ (never overwrites your copy)
#   make progress        run your notebooks in workspace/ and show which exercises pass
#   make update          update the course (git pull), even after you ran and saved the chapters
#   make book            build the course as a web book in build/book/ (from the committed notebooks)
#   make help            this list
#
#   For maintainers:
#   make setup           set up .venv with everything: what a learner needs, and the tests' and the book's tools
#   make test            set up .venv, then run the whole suite (what CI runs)
#   make test-lib        only tests/ (no notebook under nbval)
#   make test-notebooks  only the notebooks under nbval (chapters/, exercises/, solutions/)
#   make test-gpu        the same on an NVIDIA GPU: tests on CUDA, notebooks with MHA_DEVICE=cuda
#   make notebooks       regenerate exercises/, re-execute every notebook, re-pair it
#   make study           re-train the seed studies that chapters 07, 08, 09 and 12 quote (~2 hours)
#   make clean           delete .venv, build/, *.egg-info and .pytest_cache

PYTHON ?= python3
VENV   ?= .venv
PORT   ?= 8888
HOST   ?= 127.0.0.1
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-k attention -x"`.
PYTEST_ARGS ?=

PY    := $(VENV)/bin/python
# Two stamps: what a learner needs (requirements.txt: `make lab`, `make exercise`,
# `make progress`), and on top of it what only the tests, CI and the book need
# (requirements-dev.txt: pytest, Playwright, actionlint, Sphinx).
STAMP     := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
# JupyterLab's settings for the course (no news pop-up, Markdown opens rendered), as
# defaults in .venv, never in your home folder: your own settings still win.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
# Where JupyterLab keeps its layout for the course (in .venv, not in your home folder), seeded
# with one that shows README.md, so that /lab opens on it too; after that, your own layout.
LAB_WORKSPACES := $(VENV)/share/jupyter/lab/workspaces
LAB_WORKSPACE  := $(LAB_WORKSPACES)/default-37a8.jupyterlab-workspace
# The file browser shows each notebook once (not its paired py:percent file, NN_name.py, a name
# no module of mha_lib has) and no build output. Jupyter's own defaults are kept.
LAB_HIDE := __pycache__ '*.pyc' '*.pyo' .DS_Store '*~' '[0-9][0-9]_*.py' build '*.egg-info' .pytest_cache .ipynb_checkpoints

.PHONY: help setup lab exercise progress update book test test-lib test-notebooks test-gpu notebooks study clean

help:
	@sed -n 's/^#   //p' Makefile

# Set-up: a virtual environment with the pinned requirements and mha_lib
# (editable, so changes to mha_lib/ are picked up without reinstalling).
# It is redone only when requirements.txt or pyproject.toml change. `make setup` is
# everything, for maintainers; `make lab` installs only what a learner needs.
setup: $(STAMP) $(DEV_STAMP) $(LAB_OVERRIDES)

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { \
	  echo "error: the course needs Python >= 3.10, but $(PYTHON) is $$($(PYTHON) --version 2>&1)."; \
	  echo "       Run e.g. 'make $(MAKECMDGOALS) PYTHON=python3.11'."; exit 1; }
	@test -x $(PY) || { echo "Creating $(VENV) with $$($(PYTHON) --version)"; $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $@

# nbgrader (requirements-dev.txt, for tests/test_grading_tools.py) switches on its JupyterLab menus and
# server extensions; `make lab` is the learner's JupyterLab, so they are switched off again, in .venv only.
NBGRADER_SERVER_EXTENSIONS := formgrader validate_assignment assignment_list course_list

$(DEV_STAMP): requirements-dev.txt $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@$(VENV)/bin/jupyter labextension disable --level=sys_prefix @jupyter/nbgrader >/dev/null 2>&1 || true
	@for e in $(NBGRADER_SERVER_EXTENSIONS); do \
	  $(VENV)/bin/jupyter server extension disable --sys-prefix nbgrader.server_extensions.$$e >/dev/null 2>&1 || true; done
	@touch $@

$(LAB_OVERRIDES): .jupyterlab/overrides.json $(STAMP)
	@mkdir -p $(@D)
	cp .jupyterlab/overrides.json $@

$(LAB_WORKSPACE): .jupyterlab/default.jupyterlab-workspace $(STAMP)
	@mkdir -p $(@D)
	cp .jupyterlab/default.jupyterlab-workspace $@

# JupyterLab refuses to run as root unless told; the token comes from
# JUPYTER_TOKEN when set (otherwise Jupyter makes one and prints the URL).
# .venv/bin goes first on PATH, so `python` in JupyterLab's terminal is the course's.
# It opens on README.md, rendered (the chapter table; tests/test_browser.py checks it), at
# the printed address and at /lab alike (tests/test_lab_files.py checks /lab and the file browser).
lab: $(STAMP) $(LAB_OVERRIDES) $(LAB_WORKSPACE)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" JUPYTERLAB_WORKSPACES_DIR="$${JUPYTERLAB_WORKSPACES_DIR:-$(CURDIR)/$(LAB_WORKSPACES)}" \
	  $(VENV)/bin/jupyter lab --no-browser --ip=$(HOST) --port=$(PORT) \
	  $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) \
	  $(if $(JUPYTER_TOKEN),--IdentityProvider.token=$(JUPYTER_TOKEN)) \
	  --ServerApp.root_dir=$(CURDIR) \
	  $(foreach glob,$(LAB_HIDE),--ContentsManager.hide_globs=$(glob)) \
	  --LabApp.default_url=/lab/tree/README.md

# The learner's commands are the package mha_course (apart from mha_lib, so that they never
# import PyTorch and answer at once). `start` exits 3 when you already have a copy: make
# reports that (your work is kept) and succeeds; an unknown N still fails.
exercise: $(STAMP)
	@test -n "$(N)" || { echo "usage: make exercise N=01"; exit 2; }
	@$(PY) -m mha_course start $(N) || [ $$? -eq 3 ]

# Runs a copy of each of your notebooks in workspace/ (never modifies them); `make progress
# N=03` for one chapter, PROGRESS_TIMEOUT=300 for slow machines (seconds per notebook).
progress: $(STAMP)
	@$(PY) -m mha_course progress $(N) $(if $(PROGRESS_TIMEOUT),--timeout $(PROGRESS_TIMEOUT))

# The course's newest version: puts back the course notebooks that only running changed,
# saves your own edits to course files in workspace/saved/<date>/ first, then
# `git pull --ff-only`; never touches the rest of workspace/. Needs only git and Python (no .venv).
update:
	@$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m mha_course update

# The web book, from the notebooks as committed (no execution): build/book/index.html.
book: $(DEV_STAMP)
	$(PY) book/build.py

# Everything: mha_lib's tests and every notebook under nbval (see pyproject.toml).
test: $(DEV_STAMP) $(LAB_OVERRIDES)
	$(PY) -m pytest -n 2 --dist loadfile $(PYTEST_ARGS)

test-lib: $(DEV_STAMP) $(LAB_OVERRIDES)
	$(PY) -m pytest -n 2 --dist loadfile tests $(PYTEST_ARGS)

test-notebooks: $(DEV_STAMP)
	$(PY) -m pytest -n 2 --dist loadfile chapters exercises solutions $(PYTEST_ARGS)

# On a machine with an NVIDIA GPU (the GPU CI job): mha_lib's tests, whose CUDA cases run
# there, and every notebook with MHA_DEVICE=cuda. The stored outputs come from the CPU and
# a GPU may print a float differently in the last digit, so nbval runs lax: every cell
# runs and the notebooks' own asserts check the results; only cells marked
# `# NBVAL_CHECK_OUTPUT` are compared. The first line fails at once when MHA_DEVICE
# names a device this machine lacks. `make test-gpu MHA_DEVICE=cpu` tries it on a CPU.
test-gpu: MHA_DEVICE ?= cuda
test-gpu: $(DEV_STAMP)
	MHA_DEVICE=$(MHA_DEVICE) $(PY) -c 'import mha_lib; print("test-gpu runs on", mha_lib.get_device())'
	MHA_DEVICE=$(MHA_DEVICE) $(PY) -m pytest -n 2 --dist loadfile -m "not browser" tests $(PYTEST_ARGS)
	MHA_DEVICE=$(MHA_DEVICE) $(PY) -m pytest -n 2 --dist loadfile --nbval-lax chapters exercises solutions $(PYTEST_ARGS)

notebooks: $(STAMP)
	$(PY) tools/make_exercises.py
	$(PY) tools/build_notebooks.py

# Chapters 07, 08, 09 and 12 quote what held over many independent runs (each its own
# initialisation and data), not one run: this trains them all (niced) and rewrites the
# committed results files. On 2 cores the sentiment study takes ~13 min, the induction
# study ~20 min and the language model's ~40 min (it also rewrites the model chapter 09
# ships), and the configurations chapter 09 tried next to it, one run each, ~40 min more.
# `.venv/bin/python -m mha_lib.sentiment study --help` (or induction, textlm) for seeds and
# the rest.
study: $(STAMP)
	nice -n 10 $(PY) -m mha_lib.sentiment study --output mha_lib/sentiment/study.json
	nice -n 10 $(PY) -m mha_lib.induction study --output mha_lib/induction/study.json
	nice -n 10 $(PY) -m mha_lib.textlm study --seeds 0-5 --output mha_lib/textlm/study.json \
	  --checkpoint mha_lib/textlm/model_seed0.pt
	nice -n 10 $(PY) -m mha_lib.textlm configurations

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
