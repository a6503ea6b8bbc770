# Two commands set everything up on a fresh machine: `make run` and `make test` (see README.md).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run train test lint

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch (from this machine's local wheel); GPU images bring their own CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[trainer,service,dev]"
	touch $(STAMP)

# The main job on the embedded default: a short training run, printing its step breakdown.
run: setup
	$(PY) -m service quickstart --config examples/quickstart.yaml --workdir runs/quickstart

lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy

test: setup lint
	$(PY) -m pytest
