# FluidPD developer entry points. The README's two set-up commands are `make run` and
# `make test`; CI (.ci/run) calls `make test` on a clean clone.

PYTHON ?= python3
PIP := $(PYTHON) -m pip
OUT ?= out/sim

.PHONY: install install-dev system-deps run test lint typecheck unit bench results clean

install:
	$(PIP) install --quiet -e .

install-dev: system-deps
	$(PIP) install --quiet -e '.[dev]'

system-deps:
	sh scripts/install-system-deps.sh

# The main job on the embedded default: the simulator comparing every policy on Azure
# (mixed) at 20 RPS, 8 workers starting 4P4D, Llama-3.1-8B on A100-80GB.
run: install
	fluidpd sim --out $(OUT)

lint: install-dev
	ruff check .
	ruff format --check fluidpd tests

typecheck: install-dev
	mypy fluidpd

unit: install-dev
	$(PYTHON) -m pytest -q

test: lint typecheck unit

bench: install
	fluidpd bench --out results/bench

# Regenerates the committed simulator results (see results/README.md for each command).
results: install
	sh results/sim/run.sh

clean:
	rm -rf out build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
