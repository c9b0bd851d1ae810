# The course's commands. `make help` lists them.
#
#   make lab             set up .venv (first time only) and start JupyterLab on the course
#   make exercise N=01   copy exercise 01 into workspace/ (never overwrites your copy)
#   make test            set up .venv, then run the whole suite (what CI runs)
#   make test-gpu        the same on an NVIDIA GPU: tests on CUDA, notebooks with MHA_DEVICE=cuda
#   make notebooks       regenerate exercises/, re-execute every notebook, re-pair it (maintainers)
#   make study           re-train the seed study that chapters 06 and 08 quote (~10 min, maintainers)

PYTHON ?= python3
VENV   ?= .venv
PORT   ?= 8888
HOST   ?= 127.0.0.1
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-k attention -x"`.
PYTEST_ARGS ?=

PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help setup lab exercise test test-lib test-notebooks test-gpu notebooks study clean

help:
	@sed -n 's/^#   //p' Makefile

# Set-up: a virtual environment with the pinned requirements and mha_lib
# (editable, so changes to mha_lib/ are picked up without reinstalling).
# It is redone only when requirements.txt or pyproject.toml change.
setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { \
	  echo "error: the course needs Python >= 3.10, but $(PYTHON) is $$($(PYTHON) --version 2>&1)."; \
	  echo "       Run e.g. 'make $(MAKECMDGOALS) PYTHON=python3.11'."; exit 1; }
	@test -x $(PY) || { echo "Creating $(VENV) with $$($(PYTHON) --version)"; $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $@

# JupyterLab refuses to run as root unless told; the token comes from
# JUPYTER_TOKEN when set (otherwise Jupyter makes one and prints the URL).
# .venv/bin goes first on PATH, so `python` in JupyterLab's terminal is the course's.
lab: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/jupyter lab --no-browser --ip=$(HOST) --port=$(PORT) \
	  $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) \
	  $(if $(JUPYTER_TOKEN),--IdentityProvider.token=$(JUPYTER_TOKEN)) \
	  --ServerApp.root_dir=$(CURDIR) \
	  --LabApp.default_url=/lab/tree/chapters/01_dot_product_attention.ipynb

exercise: $(STAMP)
	@test -n "$(N)" || { echo "usage: make exercise N=01"; exit 2; }
	$(PY) -m mha_lib start $(N)

# Everything: mha_lib's tests and every notebook under nbval (see pyproject.toml).
test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile $(PYTEST_ARGS)

test-lib: $(STAMP)
	$(PY) -m pytest tests $(PYTEST_ARGS)

test-notebooks: $(STAMP)
	$(PY) -m pytest chapters exercises solutions $(PYTEST_ARGS)

# On a machine with an NVIDIA GPU (the GPU CI job): mha_lib's tests, whose CUDA cases run
# there, and every notebook with MHA_DEVICE=cuda. The stored outputs come from the CPU and
# a GPU may print a float differently in the last digit, so nbval runs lax: every cell
# runs and the notebooks' own asserts check the results; only cells marked
# `# NBVAL_CHECK_OUTPUT` are compared. The first line fails at once when MHA_DEVICE
# names a device this machine lacks. `make test-gpu MHA_DEVICE=cpu` tries it on a CPU.
test-gpu: MHA_DEVICE ?= cuda
test-gpu: $(STAMP)
	MHA_DEVICE=$(MHA_DEVICE) $(PY) -c 'import mha_lib; print("test-gpu runs on", mha_lib.get_device())'
	MHA_DEVICE=$(MHA_DEVICE) $(PY) -m pytest -n 2 --dist loadfile -m "not browser" tests $(PYTEST_ARGS)
	MHA_DEVICE=$(MHA_DEVICE) $(PY) -m pytest -n 2 --dist loadfile --nbval-lax chapters exercises solutions $(PYTEST_ARGS)

notebooks: $(STAMP)
	$(PY) tools/make_exercises.py
	$(PY) tools/build_notebooks.py

# Chapters 06 and 08 quote what held over many seeds and CPU kernel paths, not one run:
# this trains them all (one CPU core, niced) and rewrites the committed results file.
# `.venv/bin/python -m mha_lib.sentiment study --help` for seeds, kernel paths, parts.
study: $(STAMP)
	nice -n 10 $(PY) -m mha_lib.sentiment study --output mha_lib/sentiment/study.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
