# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3.11
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= configs/default.toml

.PHONY: run test lint bench format clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev,bench]"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/hicache bench tiering --config $(CONFIG)

test: $(STAMP) lint
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: $(STAMP)
	$(VENV)/bin/hicache bench tree --config $(CONFIG) --json bench-tree.json

clean:
	rm -rf $(VENV) build *.egg-info
