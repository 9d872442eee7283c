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

.PHONY: run test test-fast lint clean-runs

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev,efficientnet]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

run: $(STAMP)
	$(PY) -m fedsmix run --preset $(PRESET) --parties $(PARTIES)

# The container file spends its time waiting (Podman, image builds, a killed SuperNode's missed heartbeats),
# so it runs beside the rest of the suite in its own pytest; `make test` fails when either does.
CONTAINER_LOG ?= /tmp/fedsmix-test-containers.log
test: $(STAMP)
	$(PY) -m ruff check .
	@$(PY) -m pytest tests/test_containers.py $(PYTEST_ARGS) > $(CONTAINER_LOG) 2>&1 & containers=$$!; \
	echo "tests/test_containers.py runs beside the rest (pid $$containers; its output follows the suite's)"; \
	$(PY) -m pytest --ignore=tests/test_containers.py $(PYTEST_ARGS); rest=$$?; \
	wait $$containers; status=$$?; \
	echo "==================== tests/test_containers.py (exit $$status) ===================="; \
	cat $(CONTAINER_LOG); \
	test $$rest -eq 0 && test $$status -eq 0

test-fast: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -m "not slow and not sim" $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .

clean-runs:
	rm -rf runs .flwr
