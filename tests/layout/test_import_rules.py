"""The import rules of ``../shared/DESIGN.md`` as a test: each part imports only what it may.

Core imports nothing of the project; the simulator, the sidecar and the controller build on
the core; the router and the operator add the HTTP protocol (``fluidpd.api``). Only the CLI,
the composition root, may import any part, and no part imports the CLI. Imports inside
functions count too (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {
    "fluidpd": ROOT / "fluidpd",
    "fluidpd_sidecar": ROOT / "worker-sidecar" / "fluidpd_sidecar",
    "fluidpd_operator": ROOT / "operator" / "fluidpd_operator",
}
#: Leaf libraries any part may use: the version string, model-directory loading, process
#: liveness. They import nothing of the project's parts (checked below like every part).
LEAVES = {"fluidpd", "fluidpd.modeldir", "fluidpd.procs"}
CORE, API = "fluidpd.core", "fluidpd.api"
#: What each part may import besides itself and the leaves.
ALLOWED: dict[str, set[str]] = {
    CORE: set(),
    API: {CORE},
    "fluidpd.profiles": {CORE},
    "fluidpd.sim": {CORE, "fluidpd.profiles"},
    # The benchmark harnesses over the simulator's results and time series.
    "fluidpd.replay": {CORE, "fluidpd.sim"},
    "fluidpd.controller": {CORE, API},
    "fluidpd.router": {CORE, API},
    "fluidpd_sidecar": {CORE, API},
    # The operator runs the same FluidRole control loop as `fluidpd controller`, with the
    # workers' profile read as `fluidpd controller --profile` reads it (its own process has
    # no CLI to hand it one).
    "fluidpd_operator": {CORE, API, "fluidpd.controller", "fluidpd.profiles"},
    "fluidpd.drills": {CORE, API},
    "fluidpd.modeldir": set(),
    "fluidpd.procs": set(),
    # The listening sockets `fluidpd up` hands its processes (only the CLI uses them).
    "fluidpd.listeners": set(),
    "fluidpd": set(),
}
#: The composition root: it wires the parts into commands.
ANYTHING = "fluidpd.cli"


def part_of(module: str) -> str:
    bits = module.split(".")
    return ".".join(bits[:2]) if bits[0] == "fluidpd" and len(bits) > 1 else bits[0]


def imports(source: str, module: str) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every absolute or relative import in ``source``."""
    package = module.split(".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                bits = package[: len(package) - node.level]
                base = ".".join([*bits, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            if base == "fluidpd":  # `from fluidpd import sim` imports the part `fluidpd.sim`
                for alias in node.names:
                    is_part = (SOURCES["fluidpd"] / alias.name).exists() or (
                        SOURCES["fluidpd"] / f"{alias.name}.py"
                    ).exists()
                    yield node.lineno, f"fluidpd.{alias.name}" if is_part else base
            else:
                yield node.lineno, base


def violations(source: str, module: str) -> list[str]:
    src = part_of(module)
    if src == ANYTHING:
        return []
    allowed = ALLOWED[src] | LEAVES | {src}
    found = []
    for line, target in imports(source, module):
        if target.split(".")[0] not in SOURCES:
            continue  # third-party or the standard library
        dst = part_of(target)
        if dst not in allowed or (src in LEAVES and dst not in {src, "fluidpd"}):
            found.append(f"{module}:{line} imports {target} ({src} -> {dst} is not allowed)")
    return found


def private_imports(source: str, module: str) -> list[str]:
    """``from <another module> import _name``: a private name is its module's own business
    (``replay`` once imported ``sim.report._slug``); what another module needs is made public.
    Within one package (``fluidpd_sidecar``, ``fluidpd.core``, ...) the modules are one unit."""
    src = part_of(module)
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or node.level:
            continue  # a relative import stays inside its package
        base = node.module or ""
        if base.split(".")[0] not in SOURCES or part_of(base) == src:
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                found.append(f"{module}:{node.lineno} imports {base}.{alias.name} (private)")
    return found


def project_modules() -> Iterator[tuple[str, Path]]:
    for root in SOURCES.values():
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root.parent).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            yield ".".join(parts), path


def test_every_part_has_a_rule() -> None:
    parts = {part_of(m) for m, _ in project_modules()}
    assert parts - set(ALLOWED) - {ANYTHING} == set()


def test_no_forbidden_import() -> None:
    found = [v for m, p in project_modules() for v in violations(p.read_text(), m)]
    assert found == []


def test_no_part_imports_another_parts_private_names() -> None:
    found = [v for m, p in project_modules() for v in private_imports(p.read_text(), m)]
    assert found == []


def test_a_private_import_is_caught() -> None:
    assert private_imports("from fluidpd.sim.report import _slug\n", "fluidpd.replay.results")
    assert not private_imports("from fluidpd.sim.report import slug\n", "fluidpd.replay.results")
    # Inside one part its modules share their private names; relative imports likewise.
    assert not private_imports("from fluidpd.sim.report import _slug\n", "fluidpd.sim.plots")
    assert not private_imports("from .report import _slug\n", "fluidpd.sim.plots")


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("fluidpd_operator.deployment", "from fluidpd.cli.sidecar_cmd import ENGINES\n"),
        ("fluidpd.core.scheduler.worker", "from fluidpd.api.internal import PressureReport\n"),
        ("fluidpd.core.policy", "def f():\n    import fluidpd.sim.simulator\n"),
        ("fluidpd.router.app", "from fluidpd_sidecar.engine import SimEngine\n"),
        ("fluidpd_sidecar.service", "from fluidpd.router import dispatch\n"),
        ("fluidpd.sim.report", "from fluidpd.cli.options import add_float\n"),
        ("fluidpd.modeldir.text", "from fluidpd.core import types\n"),
        ("fluidpd.core.signals", "from .. import profiles\n"),
        ("fluidpd.router.app", "from fluidpd import cli\n"),
    ],
)
def test_a_forbidden_import_is_caught(module: str, source: str) -> None:
    assert violations(source, module)


def test_allowed_imports_pass() -> None:
    assert not violations("from fluidpd.core.types import Role\nimport numpy\n", "fluidpd.api.x")
    assert not violations("from fluidpd.api.commands import ENGINES\n", "fluidpd_operator.x")
    assert not violations("from fluidpd_operator.main import run\n", "fluidpd.cli.operator_cmd")
    assert not violations("from . import signals\n", "fluidpd.core.fluidrole")
