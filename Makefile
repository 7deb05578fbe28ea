# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3.11
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The engines' wheels (test venv only): requirements/engines.txt, --no-deps.
ENGINES := $(VENV)/.engines-installed
CONFIG ?= configs/default.toml

.PHONY: run test test-slow lint bench format clean redis-server

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev,bench]"
	touch $(STAMP)

# The pip constraint keeps the venv's torch (a CPU build) whatever an engine's
# dependency asks for: any other torch is a multi-GB CUDA download.
$(ENGINES): $(STAMP) requirements/engines.txt requirements/engine-deps.txt
	$(PY) -m pip freeze | grep -i '^torch==' > $(VENV)/torch-pin.txt
	$(PY) -m pip install --quiet -c $(VENV)/torch-pin.txt -r requirements/engine-deps.txt
	$(PY) -m pip install --quiet --no-deps -c $(VENV)/torch-pin.txt -r requirements/engines.txt
	touch $(ENGINES)

run: $(STAMP)
	$(VENV)/bin/hicache bench tiering --config $(CONFIG)

test: $(STAMP) $(ENGINES) lint redis-server
	$(PY) -m pytest

# The redis backend tests run real servers; installs Debian's redis-server when missing.
redis-server:
	sh scripts/ensure-redis-server.sh

# Long soak tests (damage fuzzing at many offsets, `make run` 20 times): not in CI.
test-slow: $(STAMP)
	HICACHE_SLOW=1 $(PY) -m pytest -m slow

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
