"""The robustness suite (issue #14): FluidPD against the static split and the oracle over a fixed
matrix of workloads, profiles, SLOs, deployment sizes and rates.

Rates are not picked by hand per workload: for each cell the capacity model (the one FluidRole's
predictive rule uses, from the profile's predictors) gives ``r_best``, the highest rate at which
the best static split of that deployment keeps every phase within its SLO headroom, and the
suite runs at fixed fractions of it (comfortable, near capacity, overloaded). Azure workloads are
thinned (every k-th request of the full trace built at k times the rate, which keeps the staged
windows and the burst shape) so that a cell takes seconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fluidpd.core.fluidrole import FluidRoleConfig
from fluidpd.core.policy_forecast import CapacityModel, Demand, Split
from fluidpd.core.profile import Profile
from fluidpd.core.types import SLO
from fluidpd.profiles import load_profile_file, resolve_profile
from fluidpd.sim.longctx import LONG_WORKLOAD_NAMES
from fluidpd.sim.metrics import attainment, good_mask
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.runner import RunSpec, run_oracle
from fluidpd.sim.simulator import SimConfig, simulate
from fluidpd.sim.workloads import Workload, build_workload

PROFILES = (
    ("llama-3.1-8b", "a100-80gb"),
    ("qwen3-14b", "a100-80gb"),
    ("qwen3-30b-a3b", "a100-80gb"),
    ("llama-3.1-8b", "h200"),
)
SLOS = {"strict": SLO(1.0, 0.05), "medium": SLO(2.0, 0.1), "relaxed": SLO(3.0, 0.15)}
WORKERS = (4, 8)
WORKLOADS = ("azure-staged", "azure-mixed", *LONG_WORKLOAD_NAMES)
SUITE_NOISE = 0.05
#: Fractions of r_best: comfortable, near capacity, overloaded.
RATE_FRACTIONS = (0.6, 0.9, 1.2)


@dataclass(frozen=True, slots=True)
class SuiteSize:
    """A factorial matrix (every combination of the tuples), or, when ``one_factor`` is set,
    only the cells that differ from the base deployment (first profile, ``medium``, first
    worker count) in at most one of profile, SLO and worker count: every dimension is covered
    without the full product."""

    long_requests: int
    azure_thin: int
    workloads: tuple[str, ...]
    profiles: tuple[tuple[str, str], ...]
    slos: tuple[str, ...]
    workers: tuple[int, ...]
    fractions: tuple[float, ...]
    one_factor: bool = False
    #: Workloads of the cells off the base deployment (one-factor matrices).
    side_workloads: tuple[str, ...] = ()


SIZES = {
    # Every combination: 576 cells, about 6 minutes with two processes on a 2-core machine.
    "full": SuiteSize(800, 15, WORKLOADS, PROFILES, tuple(SLOS), WORKERS, RATE_FRACTIONS),
    # The committed run: every workload at every rate on the base deployment, and three
    # workloads (one Azure, one Poisson and one bursty long-context) on every other profile,
    # SLO and size.
    "standard": SuiteSize(
        600,
        10,
        WORKLOADS,
        PROFILES,
        tuple(SLOS),
        WORKERS,
        RATE_FRACTIONS,
        one_factor=True,
        side_workloads=("azure-staged", "long-chat-poisson", "long-long-bursty"),
    ),
    # CI: every dimension present, one value of most.
    "ci": SuiteSize(
        300,
        60,
        ("azure-staged", "long-chat-poisson", "long-long-bursty"),
        (PROFILES[0], PROFILES[3]),
        ("medium",),
        (4,),
        (0.9, 1.2),
    ),
}


@dataclass(frozen=True, slots=True)
class Cell:
    workload: str
    profile: tuple[str, str]
    slo: str
    workers: int
    fraction: float

    @property
    def label(self) -> str:
        model, gpu = self.profile
        return f"{self.workload} {model}/{gpu} {self.slo} {self.workers}w {self.fraction:g}x"

    def row(self) -> dict[str, Any]:
        """The cell as the first fields of its JSON row."""
        return {
            "workload": self.workload,
            "model": self.profile[0],
            "gpu": self.profile[1],
            "slo": self.slo,
            "workers": self.workers,
            "fraction": self.fraction,
        }


#: A cell's model name for a profile file run in place of the matrix's shipped profiles (the
#: held-out deployments): ``file:PATH``, with ``file`` for its GPU.
PROFILE_FILE = "file:"


def on_profile_files(size: SuiteSize, files: Sequence[str]) -> SuiteSize:
    """``size`` with the profile files ``files`` in place of its profiles."""
    return replace(size, profiles=tuple((PROFILE_FILE + f, "file") for f in files))


def named_profile(model: str, gpu: str) -> Profile:
    """The profile a cell names: a profile file (``PROFILE_FILE``) or a shipped profile."""
    if model.startswith(PROFILE_FILE):
        return load_profile_file(model[len(PROFILE_FILE) :])
    return resolve_profile(model, gpu, None)


def cells(size: SuiteSize) -> Iterator[Cell]:
    base = (size.profiles[0], "medium", size.workers[0])
    for profile in size.profiles:
        for slo in size.slos:
            for workers in size.workers:
                off = sum(a != b for a, b in zip((profile, slo, workers), base, strict=True))
                if size.one_factor and off > 1:
                    continue
                names = size.workloads if off == 0 or not size.one_factor else size.side_workloads
                for workload in names:
                    for fraction in size.fractions:
                        yield Cell(workload, profile, slo, workers, fraction)


def thinned(name: str, rps: float, seed: int, profile: Profile, size: SuiteSize) -> Workload:
    """The cell's workload at mean rate ``rps``."""
    limit = profile.context_limit
    if name in LONG_WORKLOAD_NAMES:
        return build_workload(name, rps, seed, limit, size.long_requests)
    k = size.azure_thin
    full = build_workload(name, rps * k, seed, limit)
    keep = np.arange(0, len(full), k)
    windows = []
    start = 0
    for label, a, b in full.windows:
        n = int(np.count_nonzero((keep >= a) & (keep < b)))
        if n:
            windows.append((label, start, start + n))
            start += n
    arrivals = full.arrivals[keep]
    return Workload(
        name=name,
        arrivals=arrivals - arrivals[0],
        prompt_lens=full.prompt_lens[keep],
        output_lens=full.output_lens[keep],
        windows=tuple(windows),
        description=f"{full.description} Thinned to every {k}th request.",
        capped_prompts=int(full.capped_prompts),
    )


def best_capacity_rate(model: CapacityModel, w: Workload, workers: int) -> float:
    """r_best: the highest rate at which some static split keeps the bottleneck at 1 (by
    bisection; the bottleneck grows with the rate)."""
    prompts = w.prompt_lens.astype(np.float64)
    pre = float(np.mean(model.prefill.time(prompts)))
    base = Demand(1.0, float(prompts.mean()), float(w.output_lens.mean()), pre)

    # The suite's rates keep the definition they were first set by (each prefill worker's
    # arrivals as the whole stream's), so that its cells stay where they were as the
    # policy's model is refined.
    model = replace(model, split_arrivals=False)

    def ok(rate: float) -> bool:
        d = replace(base, rate=rate)
        return any(
            model.bottleneck(d, Split(p, workers - p), reservations=False) <= 1.0
            for p in range(1, workers)
        )

    lo, hi = 0.0, 1.0
    while ok(hi) and hi < 1e6:
        lo, hi = hi, hi * 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def max_switches_per(switches: Sequence[dict[str, Any]], window_s: float) -> int:
    times = sorted(float(s["t"]) for s in switches)
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - window_s:
            j += 1
        best = max(best, i - j + 1)
    return best


def quick_reversals(switches: Sequence[dict[str, Any]], cooldown_s: float) -> int:
    """Switches undone by the next one (opposite direction) within ``cooldown_s``."""
    n = 0
    for a, b in itertools.pairwise(switches):
        if a["from"] == b["to"] and float(b["t"]) - float(a["t"]) < cooldown_s:
            n += 1
    return n


@dataclass(frozen=True, slots=True)
class CellSetup:
    """A cell made concrete: its rate, its workload at that rate and its base deployment (the
    even split, the suite's engine noise)."""

    rps: float
    workload: Workload
    base: SimConfig


def setup_cell(
    cell: Cell, seed: int, size: SuiteSize, profile: Profile | None = None
) -> CellSetup | None:
    """The cell at ``fraction x r_best``, on ``profile`` (default: the shipped one its model
    and GPU name); None when no split carries any rate."""
    chosen = profile or named_profile(*cell.profile)
    return setup_at(
        lambda rps: thinned(cell.workload, rps, seed, chosen, size),
        chosen,
        SLOS[cell.slo],
        cell.workers,
        cell.fraction,
        seed,
    )


def setup_at(
    build: Callable[[float], Workload],
    profile: Profile,
    slo: SLO,
    workers: int,
    fraction: float,
    seed: int,
) -> CellSetup | None:
    """The workload ``build(rps)`` at ``fraction x r_best`` (three significant figures) on the
    even split of ``workers``; None when no split carries any rate."""
    model = CapacityModel.from_profile(profile, slo)
    r_best = best_capacity_rate(model, build(1.0), workers)
    if r_best <= 0:
        return None
    rps = float(f"{fraction * r_best:.3g}")
    half = workers // 2
    # The sim command's default engine noise, so that forecasts are not trivially exact.
    base = SimConfig(profile, slo, half, workers - half, noise=SUITE_NOISE, seed=seed)
    return CellSetup(rps, build(rps), base)


def run_cell(
    cell: Cell, seed: int, size: SuiteSize, profile: Profile | None = None
) -> dict[str, Any]:
    """One cell's row; ``profile`` runs it on another profile than its model and GPU name."""
    slo = SLOS[cell.slo]
    out = cell.row()
    setup = setup_cell(cell, seed, size, profile)
    if setup is None:
        # No split carries any rate: the mean prompt alone outlasts the TTFT target (Qwen3-14B
        # on an A100 needs more than 1 s for an 8K-token prefill). Every policy would miss
        # every request, so the cell says so instead of comparing zeros.
        out["skipped"] = f"no static split meets TTFT {slo.ttft:g} s at any rate"
        return out
    return out | {"rps": setup.rps} | score(setup.workload, setup.base)


def score(w: Workload, base: SimConfig) -> dict[str, Any]:
    """A cell's figures for workload ``w`` on deployment ``base``: static (``base``'s split),
    FluidPD from it and the oracle, with FluidPD's switches (``check`` reads the bars)."""
    slo = base.slo
    out: dict[str, Any] = {
        "requests": len(w),
        "capped_prompts": w.capped_prompts,
        "trace_s": round(float(w.arrivals[-1]), 1),
    }
    for policy in ("static", "fluidpd"):
        result = simulate(w, replace(base, mechanisms=MECHANISMS[policy]))
        out[policy] = attainment(result.requests, slo)
        if policy == "fluidpd":
            switches = [s.as_dict() for s in result.switches]
            out["switches"] = len(switches)
            out["max_switches_10min"] = max_switches_per(switches, 600.0)
            out["quick_reversals"] = quick_reversals(
                switches, FluidRoleConfig().reversal_cooldown_s
            )
            out["failed_fluidpd"] = sum(r.failed for r in result.requests)
    oracle = _oracle(w, base)
    out["oracle"] = oracle
    hours = max(float(w.arrivals[-1]), 1.0) / 3600
    out["switches_per_hour"] = round(out["switches"] / hours, 1)
    out["vs_static_pp"] = round(100 * (out["fluidpd"] - out["static"]), 2)
    out["vs_oracle_pp"] = round(100 * (out["fluidpd"] - oracle), 2)
    return out


def cell_timeseries(
    cell: Cell, seed: int, size: SuiteSize, bin_s: float, profile: Profile | None = None
) -> str:
    """Why a cell scores what it does: its arrivals and misses per ``bin_s`` seconds for every
    static split and for FluidPD, with FluidPD's switches."""
    setup = setup_cell(cell, seed, size, profile)
    if setup is None:
        return f"{cell.label}: skipped (no static split meets TTFT at any rate)\n"
    w, base = setup.workload, setup.base
    t = np.asarray(w.arrivals)
    edges = np.arange(0.0, float(t[-1]) + bin_s, bin_s)
    which = np.digitize(t, edges) - 1

    def per_bin(mask: Any) -> str:
        return " ".join(f"{int(np.sum(mask & (which == b))):4d}" for b in range(len(edges) - 1))

    lines = [
        f"{cell.workload} {base.profile.name} {cell.slo} {cell.workers}w {cell.fraction:g}x: "
        f"{setup.rps:g} req/s",
        f"{'arrivals':>16s} {'':>6s} {per_bin(np.ones(len(w), dtype=bool))}",
    ]
    n = cell.workers
    runs = [
        (f"static {p}P{n - p}D", replace(base, n_prefill=p, n_decode=n - p)) for p in range(1, n)
    ]
    runs.append(("fluidpd", replace(base, mechanisms=MECHANISMS["fluidpd"])))
    for label, cfg in runs:
        result = simulate(w, cfg)
        ttft_ok, tpot_ok = good_mask(result.requests, base.slo)
        good = ttft_ok & tpot_ok
        lines.append(f"{label:>16s} {100 * float(np.mean(good)):5.1f}% {per_bin(~good)}")
        lines.extend(f"{'':>24s}switch {switch.as_dict()}" for switch in result.switches)
    return "\n".join(lines) + "\n"


def _oracle(w: Workload, base: SimConfig) -> float:
    """Best static split per window in hindsight (the sweep's oracle)."""
    return float(run_oracle(RunSpec("oracle", w.name, 1.0, base), w).record["slo_attainment"])


def check(row: dict[str, Any]) -> list[str]:
    """The issue's bars this cell misses (none for a skipped cell)."""
    if "skipped" in row:
        return []
    misses = []
    if row["vs_static_pp"] < -1.0:
        misses.append("static-1pp")
    if row["oracle"] >= 0.9 and row["vs_oracle_pp"] < -2.0:
        misses.append("oracle-2pp")
    gain = row["oracle"] - row["static"]
    if gain > 0.10 and row["fluidpd"] - row["static"] < gain / 2:
        misses.append("half-gain")
    if row["max_switches_10min"] > 2:
        misses.append("flap")
    if row["quick_reversals"]:
        misses.append("reversal")
    return misses


def count_cells(size: SuiteSize) -> int:
    return sum(1 for _ in cells(size))


def _checked_cell(args: tuple[Cell, int, SuiteSize]) -> dict[str, Any]:
    row = run_cell(*args)
    row["misses"] = check(row)
    return row


def run_suite(
    size: SuiteSize,
    seed: int = 0,
    jobs: int = 1,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every cell of the matrix, in matrix order (cells run in ``jobs`` processes)."""
    work = [(cell, seed, size) for cell in cells(size)]
    rows: list[dict[str, Any]] = []
    if jobs <= 1:
        results: Iterator[dict[str, Any]] = map(_checked_cell, work)
        for row in results:
            rows.append(row)
            if progress is not None:
                progress(row)
        return rows
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for row in pool.map(_checked_cell, work):
            rows.append(row)
            if progress is not None:
                progress(row)
    return rows


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        f"{'workload':<18} {'profile':<24} {'slo':<7} {'w':>2} {'x':>4} {'rps':>7}"
        f" {'static':>6} {'fpd':>6} {'oracle':>6} {'-stat':>6} {'-orac':>6} {'sw/h':>6}  misses"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        where = (
            f"{r['workload']:<18} {r['model'] + '/' + r['gpu']:<24} {r['slo']:<7}"
            f" {r['workers']:>2} {r['fraction']:>4g}"
        )
        if "skipped" in r:
            lines.append(f"{where}  skipped: {r['skipped']}")
            continue
        lines.append(
            f"{where} {r['rps']:>7g}"
            f" {100 * r['static']:>6.1f} {100 * r['fluidpd']:>6.1f} {100 * r['oracle']:>6.1f}"
            f" {r['vs_static_pp']:>+6.1f} {r['vs_oracle_pp']:>+6.1f}"
            f" {r['switches_per_hour']:>6.1f}  {','.join(r['misses'])}"
        )
    return "\n".join(lines)


def overall(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The bars over the cells that ran; skipped cells are only counted."""
    skipped = sum(1 for r in rows if "skipped" in r)
    rows = [r for r in rows if "skipped" not in r]
    if not rows:
        return {}
    worst = min(rows, key=lambda r: r["vs_static_pp"])
    near = [r for r in rows if r["oracle"] >= 0.9]
    worst_o = min(near, key=lambda r: r["vs_oracle_pp"]) if near else None
    return {
        "cells": len(rows),
        "cells_skipped": skipped,
        "cells_missing_a_bar": sum(1 for r in rows if r["misses"]),
        "worst_vs_static_pp": worst["vs_static_pp"],
        "worst_vs_static_cell": _cell_name(worst),
        "mean_vs_static_pp": round(float(np.mean([r["vs_static_pp"] for r in rows])), 2),
        "worst_vs_oracle_pp_where_oracle_90": worst_o["vs_oracle_pp"] if worst_o else None,
        "worst_vs_oracle_cell": _cell_name(worst_o) if worst_o else None,
        "max_switches_per_hour": max(r["switches_per_hour"] for r in rows),
        "max_switches_10min": max(r["max_switches_10min"] for r in rows),
        "quick_reversals": sum(r["quick_reversals"] for r in rows),
        "misses": {
            m: sum(1 for r in rows if m in r["misses"])
            for m in ("static-1pp", "oracle-2pp", "half-gain", "flap", "reversal")
        },
    }


def _cell_name(r: dict[str, Any]) -> str:
    return (
        f"{r['workload']} {r['model']}/{r['gpu']} {r['slo']} {r['workers']}w "
        f"{r['fraction']:g}x ({r['rps']:g} req/s)"
    )


def format_overall(o: dict[str, Any]) -> str:
    if not o:
        return "no cells"
    lines = [
        f"cells: {o['cells']} (and {o['cells_skipped']} skipped), missing a bar: "
        f"{o['cells_missing_a_bar']} {o['misses']}",
        f"worst FluidPD - static: {o['worst_vs_static_pp']:+.1f} pp ({o['worst_vs_static_cell']});"
        f" mean {o['mean_vs_static_pp']:+.2f} pp",
    ]
    if o["worst_vs_oracle_pp_where_oracle_90"] is not None:
        lines.append(
            f"worst FluidPD - oracle where oracle >= 90 %: "
            f"{o['worst_vs_oracle_pp_where_oracle_90']:+.1f} pp ({o['worst_vs_oracle_cell']})"
        )
    lines.append(
        f"switches: at most {o['max_switches_per_hour']:g}/hour, at most "
        f"{o['max_switches_10min']} in any 10 minutes, {o['quick_reversals']} quick reversals"
    )
    return "\n".join(lines)
