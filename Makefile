# nightbench: `make nightly` runs tonight's check on the embedded default; `make test` the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_WORKERS_MAX ?= 4

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
	# Two parts. The bulk on every core (pytest-xdist, one file to a worker, at most
	# $(TEST_WORKERS_MAX)); then the tests marked `measured`, one at a time with nothing beside
	# them: they assert verdicts on real latency, which a neighbour moves (tests/conftest.py).
	# Both parts run whatever the first gives; either failing fails the target.
	$(PY) -m pytest -m "not measured" -n auto --maxprocesses $(TEST_WORKERS_MAX) --dist loadfile; \
	bulk=$$?; $(PY) -m pytest -m measured; measured=$$?; \
	test $$bulk -eq 0 && test $$measured -eq 0

clean:
	rm -rf $(VENV) .nightbench
