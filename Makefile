# The two commands of the README: `make demo` and `make test`; `make check` is the fast tier.
# Each creates .venv from the pinned lock file on first use, then runs.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# pytest-xdist on every core; --dist loadgroup keeps each xdist_group (the Spark and cluster
# tests, see tests/_tiers.py) on one worker, so no worker starts a second SparkSession.
WORKERS ?= auto
XDIST   := -n $(WORKERS) --dist loadgroup

.PHONY: demo check test lint bench mutate clean

$(STAMP): pyproject.toml requirements/test.lock
	@echo "installing the pinned environment into $(VENV) (about a minute, once)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements/test.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m barrierflow demo

lint: $(STAMP)
	$(BIN)/ruff check barrierflow tests benchmarks tools
	$(BIN)/mypy --strict barrierflow

# The fast tier, after every edit: lint and the unit tier (no Spark, no server, no child
# process; the guard in tests/_tiers.py fails a unit test that starts one). Under 2 minutes.
check: lint
	$(BIN)/python -m pytest --tier unit $(XDIST) --durations=10

# Everything, before landing (and in CI): lint and the whole suite in parallel.
test: lint
	$(BIN)/python -m pytest $(XDIST) --durations=25

bench: $(STAMP)
	$(BIN)/python -m benchmarks

# Mutation testing of the seed actors (not part of `make test`, not run by CI): see tools/mutate.py.
mutate: $(STAMP)
	$(BIN)/python tools/mutate.py $(MUTATE_ARGS)

clean:
	rm -rf $(VENV)
