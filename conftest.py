"""How pytest-xdist may spread the suite over processes (``make test`` runs ``pytest -n 3
--dist loadgroup --no-loadscope-reorder``; without ``--dist loadgroup`` this file changes
nothing; without ``--no-loadscope-reorder`` xdist hands out the modules with the most tests
first, whatever the order below).

A group runs on one worker, in collection order. Every test module is one group, so a module's
fixtures (a live stack, Prometheus, a Helm release) start once and its tests keep their order.
The modules in ``SPLIT`` hold long tests that are independent of each other (each makes its own
namespace or its own stack), so they are spread test by test and run side by side. With the test
binaries built, the e2e modules are one group instead (``E2E``): one worker runs them all on one
test control plane, where three workers had each started one (a control plane costs tens of
CPU-seconds over a run, and the machine is CPU-bound; the e2e group's 9-10 minutes fit beside the
other workers' share). Without the binaries (a cold run builds them meanwhile) the e2e tests
wait for the build, so they are spread instead, each worker with its own control plane (the
fake kubelets lease pod addresses machine-wide, so two never collide).

Work is handed out in collection order, so the order decides how well the workers are used:
- test binaries built: the longest work first (``LONGEST``, from ``pytest --durations``), since
  a long test started last leaves the other workers idle until it ends;
- not built yet (a cold ``make test`` builds them in the background meanwhile): every test that
  needs none first, then the ones that do (``NEEDS_BINARIES``; they wait for the build).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from harness.binaries import binaries_ready

SPLIT = frozenset({"e2e/test_operator.py", "tests/serve/test_drills.py"})
E2E = "e2e/"
LONGEST = (
    # Real SGLang servers on CPU (60-150 s each to start on two cores, several times that
    # when they start together under load). The text, protocol, observable, FluidToken (every
    # beta, set at run time), FluidRole and crash tests share one 2P1D `fluidpd up` stack and
    # one plain server: four servers in one module, one unit (they were 13-17 in three
    # modules, the FluidToken one a stack per beta; in CI, 2026-12-02, the three overlapped
    # on both workers until the FluidRole stack missed its 600 s start).
    "tests/sglang/test_sglang_shared_stack.py",
    # Two real SGLang servers each (Ready in pods; failing starts: one loads, one fails at once
    # in its argument parser, a bad model is refused before SGLang starts): ~8 min at load 20-50.
    "e2e/test_sglang_backend.py",
    "tests/sglang/test_sglang_start_failures.py",
    "e2e/test_operator.py",
    "tests/monitoring/test_dashboards.py",
    "tests/serve/test_drills.py",
    "tests/serve/test_schemathesis.py",
    "tests/serve/test_retire.py",
    "tests/serve/test_controller.py",
    "e2e/test_controlplane.py",
)
NEEDS_BINARIES = (E2E, "tests/helm/", "tests/monitoring/test_dashboards.py")


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _rank(module: str, ready: bool) -> tuple[int, int]:
    longest = LONGEST.index(module) if module in LONGEST else len(LONGEST)
    waits = not ready and module.startswith(NEEDS_BINARIES)
    return (int(waits), longest)


def _loadgroup(config: pytest.Config) -> bool:
    """``--dist loadgroup``: in the controller ``dist`` says so; in a worker xdist rewrites
    ``dist`` to "no" and keeps the choice as ``loadgroup``. The workers' collections are what
    is scheduled, so the order below must be made there (a check of ``dist`` alone left it
    unsorted)."""
    in_worker = bool(getattr(config.option, "loadgroup", False))
    return config.getoption("dist") == "loadgroup" or in_worker


class _ModuleScheduling(LoadScopeScheduling):
    """One unit per module, except the modules in ``SPLIT`` (one unit per test) and, with the
    test binaries built, the e2e modules (one unit together). Decided here
    from the node id instead of by ``xdist_group`` marks: xdist appends a mark's group to the
    node id only in its own collection hook, after which its scheduler splits it off again, and
    that hook ran before any conftest could add the marks, so every test was its own unit (a
    module's stack then started once on each worker)."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        if module.startswith(E2E) and _ready():
            return E2E
        return nodeid if module in SPLIT else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    return _ModuleScheduling(config, log) if config.getoption("dist") == "loadgroup" else None


@cache
def _ready() -> bool:
    return binaries_ready()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist, in the controller: decide once for all workers (their collections must be the
    same, in the same order, even if the build finishes while they collect)."""
    node.workerinput["fluidpd_binaries_ready"] = _ready()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist") or not _loadgroup(config):
        return
    worker: dict[str, Any] | None = getattr(config, "workerinput", None)
    ready = bool(worker["fluidpd_binaries_ready"]) if worker else _ready()
    items.sort(key=lambda item: _rank(_module(item), ready))  # stable: module order kept
