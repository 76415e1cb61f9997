# The two commands of the README: `make demo` and `make test`.
# Each creates .venv from the pinned lock file on first use, then runs.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench mutate lint clean

$(STAMP): pyproject.toml requirements/test.lock
	@echo "installing the pinned environment into $(VENV) (about a minute, once)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements/test.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m barrierflow demo

test: $(STAMP)
	$(BIN)/ruff check barrierflow tests benchmarks tools
	$(BIN)/mypy --strict barrierflow
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m benchmarks

# Mutation testing of the seed actors (not part of `make test`, not run by CI): see tools/mutate.py.
mutate: $(STAMP)
	$(BIN)/python tools/mutate.py $(MUTATE_ARGS)

clean:
	rm -rf $(VENV)
