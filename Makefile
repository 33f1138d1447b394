# The README's commands. Each target sets itself up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-test
export TF_CPP_MIN_LOG_LEVEL ?= 2
export TF_USE_LEGACY_KERAS ?= 1

.PHONY: test demo bench bench-prioritized lint venv clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): setup.py | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check tfreplay tests benchmarks examples tutorials
	$(PY) -m ruff format --check tfreplay tests benchmarks examples tutorials/build_notebooks.py
	$(PY) -m mypy tfreplay

test: $(STAMP) lint
	$(PY) -m pytest -q tests

demo: $(STAMP)
	$(PY) -m examples.demo

bench: $(STAMP)
	$(PY) -m benchmarks.run

$(VENV)/.installed-bench: setup.py $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	touch $@

bench-prioritized: $(VENV)/.installed-bench
	$(PY) -m benchmarks.prioritized

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
