# One Makefile for developers and CI. `make demo` and `make test` bootstrap .venv
# themselves (torch pinned to the local CPU build: a bare `torch` pulls CUDA wheels).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_PIN ?= torch==2.13.0
# Two cores: two pytest workers keep torchrun jobs from starving each other.
WORKERS ?= 2

.PHONY: venv demo test lint typecheck contracts unit bench screenshots clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_PIN)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/ddptop demo

lint: $(STAMP)
	$(BIN)/ruff check ddptop tests bench probes

typecheck: $(STAMP)
	$(BIN)/mypy

contracts: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest -q -m "not slow" -n $(WORKERS)

test: $(STAMP) lint typecheck contracts
	$(BIN)/pytest -q -n $(WORKERS) --durations=15

bench: $(STAMP)
	$(BIN)/python bench/reporter_overhead.py

screenshots: $(STAMP)
	$(BIN)/python screenshots/generate.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
