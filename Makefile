# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3.11
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The engines' wheels (test venv only): requirements/engines.txt, --no-deps.
ENGINES := $(VENV)/.engines-installed
# The documentation tools (pyproject's `docs` extra): `make docs` and `make test`, not `make run`.
DOCS := $(VENV)/.docs-installed
CONFIG ?= configs/default.toml
# The compiled hot path (device_pool/native.py): the .pyx twins of the hot
# primitives. A failed build leaves the pure-Python modules in use, with a note.
NATIVE := build/native/manifest.json
PURE_TESTS := tests/device_pool tests/hicache/test_radix_cache.py tests/hicache/tree/test_token_keys.py \
	tests/hicache/test_cache_stateful.py tests/hicache/test_misuse_stateful.py
NATIVE_SRC := scripts/build_native.py device_pool/native.py device_pool/page_table.pyx hicache/tree/token_ids.pyx

.PHONY: run test test-slow test-mooncake lint bench docs format clean redis-server

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

$(DOCS): $(STAMP)
	$(PY) -m pip install --quiet -e ".[docs]"
	touch $(DOCS)

$(NATIVE): $(STAMP) $(NATIVE_SRC)
	$(PY) -m pip install --quiet "cython>=3.0,<4" && $(PY) scripts/build_native.py \
		|| echo "note: compiled hot path not built; hicache runs pure Python"

run: $(STAMP) $(NATIVE)
	$(VENV)/bin/hicache bench tiering --config $(CONFIG)

# -rs: every skip says why; the "ci" hypothesis profile draws the same examples
# on every run, so a failure in CI reproduces (tests/conftest.py). The main run
# uses the compiled hot path (when built; it builds the documentation site too,
# tests/test_docs_site.py); then the tree, allocator and cache property tests
# again on the pure-Python modules.
test: $(STAMP) $(ENGINES) $(NATIVE) $(DOCS) lint redis-server
	$(PY) -m pytest -rs --hypothesis-profile=ci
	HICACHE_PURE=1 $(PY) -m pytest -rs --hypothesis-profile=ci $(PURE_TESTS)

# The redis backend tests run real servers; installs Debian's redis-server when missing.
redis-server:
	sh scripts/ensure-deb.sh redis-server redis-server

# The optional Mooncake backend against a real mooncake_master and holder. Not in
# `make test` (CI does not run it): its extra (a 46 MB wheel) and Debian's
# libibverbs1 take over a minute to install on a fresh machine.
test-mooncake: $(STAMP)
	sh scripts/ensure-deb.sh libibverbs1
	$(PY) -m pip freeze | grep -i '^torch==' > $(VENV)/torch-pin.txt
	$(PY) -m pip install --quiet -c $(VENV)/torch-pin.txt -e ".[mooncake]"
	$(PY) -m pytest -rs tests -k mooncake

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

# The documentation site (docs/, mkdocs.yml) into site/, warnings as errors. No
# network: the theme's web fonts are off and no plug-in calls out.
docs: $(DOCS)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build site *.egg-info
