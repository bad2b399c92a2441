# FluidPD developer entry points. The README's two set-up commands are `make run` and
# `make test`; CI (.ci/run) calls `make test` on a clean clone.
#
# Everything installs into the project's virtual environment $(VENV), never into the global
# Python: it is created when missing, and one that exists is used as it is (the install step
# still runs, so new dependencies arrive). ~/.cache/fluidpd keeps the wheels
# (scripts/install-python-deps.sh says why pip's own cache does not) and the test binaries, so a
# second run, even from a fresh clone, is fast; neither cache is needed.

PYTHON ?= python3
VENV ?= .venv
OUT ?= out/evaluate
# Workers of the test run (pytest-xdist). Three on two cores: many tests wait on real timers, on
# the registry (tests/images) or on a server's start, so a third worker fills the idle CPU (a
# warm run, 2026-12-03: pytest 14 min 45 s with two workers, 13 min 26 s with three).
TEST_JOBS ?= 3

VENV_PY := $(VENV)/bin/python
FLUIDPD_CACHE := $(or $(FLUIDPD_CACHE_DIR),$(HOME)/.cache/fluidpd)
# The images' pinned closures (make requirements) constrain the install, so the suite runs the
# versions the images ship (tests/images checks it) on any machine, on any day.
INSTALL := sh scripts/install-python-deps.sh $(VENV_PY)
# Recipes (and the processes they start: sidecars, kubelet pods) find the venv's fluidpd first.
export PATH := $(abspath $(VENV))/bin:$(PATH)
export VIRTUAL_ENV := $(abspath $(VENV))
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv install install-dev system-deps run sim test checks lint typecheck unit pytest \
	bench results clean chart-crds dashboards requirements testplane cluster

$(VENV_PY):
	$(PYTHON) -m venv $(VENV)

venv: $(VENV_PY)

install: $(VENV_PY)
	$(INSTALL) .

install-dev: $(VENV_PY) system-deps
	$(INSTALL) '.[dev]'

system-deps:
	sh scripts/install-system-deps.sh

# The main job on the embedded default: a local FluidPD deployment (8 sim-engine sidecars
# starting 4P4D, router, controller) serves 2,000 requests of Azure (mixed) at 20 req/s, once
# with the static split and once with FluidPD; the simulator runs the same slice; the last
# table compares live and simulated run by run.
run: install
	fluidpd evaluate --workload azure-mixed --rps 20 --num-requests 2000 --out $(OUT)

# The simulator alone: every policy on Azure (mixed) at 20 req/s.
sim: install
	fluidpd sim --out out/sim

# The whole suite. The test binaries (Go: CPU-bound, long when nothing is cached) build in the
# background at the lowest CPU priority from the start, while pip installs (network-bound), the
# linters run and pytest runs every test that needs no binary (those mostly wait on timers, so
# the build takes the idle CPU without slowing them); the tests that need a binary come last
# and wait for the build (e2e/harness/binaries.py). Its log: out/testplane-build.log. A failure
# or Ctrl-C stops the build too (it runs in its own process group).
test:
	@mkdir -p out; \
	setsid nice -n 19 sh e2e/testplane/build-binaries.sh >/dev/null 2>out/testplane-build.log & \
	build=$$!; trap 'kill -TERM -$$build 2>/dev/null; exit 130' INT TERM; \
	status=0; $(MAKE) --no-print-directory checks pytest || status=$$?; \
	if [ $$status -ne 0 ]; then kill -TERM -$$build 2>/dev/null; wait $$build; exit $$status; fi; \
	if ! wait $$build; then \
	  tail -n 20 out/testplane-build.log; echo "make test: building the test binaries failed"; \
	  exit 1; \
	fi

checks: lint typecheck

lint: install-dev
	ruff check .
	ruff format --check fluidpd tests worker-sidecar operator scripts e2e conftest.py

# mypy's cache is kept with the others: a fresh clone re-checks only what changed (33 s -> 3 s);
# mypy validates every cached module against its source, so a stale cache costs only time.
typecheck: install-dev
	mypy --cache-dir $(FLUIDPD_CACHE)/mypy fluidpd worker-sidecar/fluidpd_sidecar operator/fluidpd_operator e2e/harness

unit: install-dev testplane
	@$(MAKE) --no-print-directory pytest

pytest:
	$(VENV_PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup --no-loadscope-reorder --durations=25

# The binaries the tests run (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# etcd, helm, prometheus, promtool), built from the Go module proxy once and cached in
# ~/.cache/fluidpd (e2e/README.md).
testplane:
	sh e2e/testplane/build-binaries.sh >/dev/null

# A local cluster to poke at: the test control plane plus the fake kubelet; prints
# `export KUBECONFIG=...`, runs until Ctrl-C.
cluster: install-dev testplane
	cd e2e && $(abspath $(VENV_PY)) -m harness.cluster

bench: install
	fluidpd bench --out results/bench

# Regenerates the committed results (see results/README.md for each command).
results: install
	sh results/sim/run.sh
	sh results/live/run.sh

# The chart renders the CRD from an exact copy of crds/ (tests/helm checks they are identical).
chart-crds:
	cp crds/fluidpd.io_fluidpddeployments.yaml helm/fluidpd/files/

# The Grafana dashboards the chart ships are generated (tests/monitoring checks they are fresh).
dashboards: $(VENV_PY)
	$(VENV_PY) scripts/make_dashboards.py

# Pinned requirements files of the images (requirements/*.txt) from pyproject.toml, at the
# versions installed here (tests/images checks they match and resolve).
requirements: $(VENV_PY)
	$(VENV_PY) scripts/lock_requirements.py

clean:
	rm -rf out build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
