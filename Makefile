# FluidPD developer entry points. The README's two set-up commands are `make run` and
# `make test`; CI (.ci/run) calls `make test` on a clean clone.

PYTHON ?= python3
PIP := $(PYTHON) -m pip
OUT ?= out/evaluate

.PHONY: install install-dev system-deps run sim test lint typecheck unit bench results clean \
	chart-crds dashboards requirements testplane cluster

install:
	$(PIP) install --quiet -e .

install-dev: system-deps
	$(PIP) install --quiet -e '.[dev]'

system-deps:
	sh scripts/install-system-deps.sh

# The main job on the embedded default: a local FluidPD deployment (8 sim-engine sidecars
# starting 4P4D, router, controller) serves 2,000 requests of Azure (mixed) at 20 req/s, once
# with the static split and once with FluidPD; the simulator runs the same slice; the
# attainment table compares all four.
run: install
	fluidpd evaluate --workload azure-mixed --rps 20 --num-requests 2000 --out $(OUT)

# The simulator alone: every policy on Azure (mixed) at 20 req/s.
sim: install
	fluidpd sim --out out/sim

lint: install-dev
	ruff check .
	ruff format --check fluidpd tests worker-sidecar operator scripts e2e

typecheck: install-dev
	mypy fluidpd worker-sidecar/fluidpd_sidecar operator/fluidpd_operator e2e/harness

unit: install-dev testplane
	$(PYTHON) -m pytest -q

test: lint typecheck unit

# The e2e test plane's binaries (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# etcd, helm), built from the Go module proxy once (5-10 min) and cached in ~/.cache/fluidpd.
testplane:
	sh e2e/testplane/build-binaries.sh

# A local cluster to poke at: the test control plane plus the fake kubelet; prints
# `export KUBECONFIG=...`, runs until Ctrl-C.
cluster: install-dev testplane
	cd e2e && $(PYTHON) -m harness.cluster

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
dashboards:
	$(PYTHON) scripts/make_dashboards.py

# Pinned requirements files of the images (requirements/*.txt) from pyproject.toml, at the
# versions installed here (tests/images checks they match and resolve).
requirements:
	$(PYTHON) scripts/lock_requirements.py

clean:
	rm -rf out build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
