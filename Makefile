# nightbench: `make nightly` runs tonight's check on the embedded default; `make test` the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: nightly test lint venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build on this machine's disk; an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

nightly: $(STAMP)
	$(VENV)/bin/nightbench nightly

lint: $(STAMP)
	$(VENV)/bin/ruff check service workers suite tests benchmarks migrations
	$(VENV)/bin/ruff format --check service workers suite tests benchmarks migrations
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

test: $(STAMP)
	$(VENV)/bin/ruff check service workers suite tests benchmarks migrations
	$(VENV)/bin/ruff format --check service workers suite tests benchmarks migrations
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(PY) -m pytest

clean:
	rm -rf $(VENV) .nightbench
