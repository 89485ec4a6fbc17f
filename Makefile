# pipelab: two set-up commands for a fresh machine, `make figures` and `make test`.
# Both create the project virtual environment (.venv) on first use.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The preset: `make figures PRESET=paper`, else $PIPELAB_PRESET, else quick.
PRESET ?= $(or $(PIPELAB_PRESET),quick)
# Figures to draw (`make figures FIG="learning_curves schedules_bubble"`); empty: every figure of the preset.
FIG ?=
# Parallel test workers (pytest-xdist; `make test JOBS=0` runs in one process) and extra pytest
# arguments, e.g. `make test PYTEST_ARGS="-k schedules"`.
JOBS ?= auto
PYTEST_ARGS ?=

.PHONY: venv figures test test-fast lint data notebooks-strip lab clean-venv

# The stamp depends on pyproject.toml, so a change of dependencies reinstalls.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# torch first, pinned: the local CPU wheel, not the CUDA build of an open range.
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[studies,dev]"
	touch $@

venv: $(VENV)/.installed

data: venv
	$(PY) -m pipelab data --fetch

figures: venv data
	$(PY) -m pipelab figures --preset $(PRESET) $(FIG)

test: venv
	$(PY) -m pytest -n $(JOBS) $(PYTEST_ARGS)

# Every module, without the tests marked slow (multi-process runs, notebooks, figure rendering): under 2 minutes.
test-fast: venv
	$(PY) -m pytest -n $(JOBS) -m "not slow" $(PYTEST_ARGS)

# Lint (ruff: style, import order, bug patterns), types (mypy) and the import contracts (import-linter: the core
# never imports the studies; the core's layers); configured in pyproject.toml.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy pipelab
	$(VENV)/bin/lint-imports

notebooks-strip: venv
	$(PY) -m pipelab strip-notebooks notebooks

# JupyterLab on the notebooks, listening on this machine only: open the URL it prints (with its token); from another
# machine forward the port first (ssh -L 8888:localhost:8888 HOST). Root (a container) needs --allow-root.
LAB_PORT ?= 8888
lab: venv
	$(VENV)/bin/jupyter lab --no-browser --ip=127.0.0.1 --port=$(LAB_PORT) --notebook-dir=notebooks \
		$(if $(filter 0,$(shell id -u)),--allow-root)

clean-venv:
	rm -rf $(VENV)
