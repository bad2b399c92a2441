"""Hour-long traces unlike the robustness matrix's (issue #14): static against FluidPD.

    python hourlong.py OUT.jsonl [TRACE_DIR]

writes three Azure-format trace CSVs to TRACE_DIR (default: a temporary folder), reads each back
through ``fluidpd sim``'s CSV loader, and runs every trace on five deployments at 0.5, 0.8, 1.0
and 1.2 x r_best (the suite's capacity rate, ``best_capacity_rate``; no rate picked by hand),
scored exactly as a matrix cell (``fluidpd.sim.robustness.score``: static from the start split,
FluidPD from it, the oracle; engine noise 0.05, seed 0). One JSON line per cell, with the bars
it misses. The traces (7,200 to 24,000 requests, 20 minutes to 2 hours at r_best; nothing here
was tuned on them):

- ``drifting-chat``: the issue's kind of workload, long-context conversations (prompts
  lognormal, mean 12K tokens, sigma 0.6; outputs mean 340, sigma 0.9), gamma gaps with a
  coefficient of variation of 1.5, the rate drifting +-40 % over a sine of a sixth of the trace.
- ``phases``: four equal phases, chat (2K / 400), RAG (10K / 60), agent turns (20K / 900), chat
  again (prompt / output medians), with on-off bursts (1.6x / 0.4x the mean rate, 80 phases)
  and gamma gaps with a coefficient of variation of 2.
- ``heavy-tail``: Pareto prompts (alpha 1.3 from 300 tokens, capped at 60K) and bimodal outputs
  (70 % around 30 tokens, 30 % around 800), Poisson arrivals whose rate steps up 1.6x half-way.
"""

from __future__ import annotations

import csv
import json
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from fluidpd.profiles import resolve_profile
from fluidpd.sim import robustness as rb
from fluidpd.sim.workloads import build_workload

FRACTIONS = (0.5, 0.8, 1.0, 1.2)
#: (model, GPU, SLO, workers)
DEPLOYMENTS = (
    ("llama-3.1-8b", "a100-80gb", "medium", 8),
    ("llama-3.1-8b", "a100-80gb", "medium", 4),
    ("qwen3-14b", "a100-80gb", "relaxed", 8),
    ("qwen3-30b-a3b", "a100-80gb", "medium", 4),
    ("llama-3.1-8b", "h200", "strict", 4),
)


def _warp(unit_times: np.ndarray, rate_of: Any) -> np.ndarray:
    """Arrival times of a unit-rate stream mapped through a time-varying relative rate."""
    horizon = float(unit_times[-1])
    s = np.linspace(0.0, horizon, 50001)
    r = rate_of(s, horizon)
    cum = np.concatenate([[0.0], np.cumsum((r[1:] + r[:-1]) / 2 * np.diff(s))])
    return np.interp(unit_times, cum, s)


def _gamma_gaps(rng: np.random.Generator, n: int, cv: float) -> np.ndarray:
    k = 1.0 / cv**2
    return np.cumsum(rng.gamma(k, 1.0 / k, n))


def _lognormal(rng: np.random.Generator, mean: Any, sigma: float, n: int) -> np.ndarray:
    return rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, n)


def drifting_chat(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = 7200
    prompts = np.clip(_lognormal(rng, 12000, 0.6, n), 64, 60000)
    outputs = np.clip(_lognormal(rng, 340, 0.9, n), 1, 4000)
    t = _warp(_gamma_gaps(rng, n, 1.5), lambda s, h: 1 + 0.4 * np.sin(2 * np.pi * s / (h / 6)))
    return t, prompts, outputs


def phases(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = 12000
    kinds = np.array([(2000, 400), (10000, 60), (20000, 900), (2000, 400)], dtype=float)
    which = np.minimum(np.arange(n) * len(kinds) // n, len(kinds) - 1)
    t = _warp(
        _gamma_gaps(rng, n, 2.0),
        lambda s, h: np.where((s // (h / 80)).astype(int) % 2 == 0, 1.6, 0.4),
    )
    prompts = np.clip(_lognormal(rng, kinds[which, 0], 0.5, n), 32, 60000)
    outputs = np.clip(_lognormal(rng, kinds[which, 1], 0.8, n), 1, 4000)
    return t, prompts, outputs


def heavy_tail(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = 24000
    prompts = np.minimum(300 * (1 + rng.pareto(1.3, n)), 60000)
    short = rng.random(n) < 0.7
    outputs = np.where(short, _lognormal(rng, 30, 0.6, n), _lognormal(rng, 800, 0.6, n))
    outputs = np.clip(outputs, 1, 4000)
    t = _warp(np.cumsum(rng.exponential(1.0, n)), lambda s, h: np.where(s < h / 2, 1.0, 1.6))
    return t, prompts, outputs


TRACES = {"drifting-chat": drifting_chat, "phases": phases, "heavy-tail": heavy_tail}


def write_trace(name: str, folder: Path, seed: int = 0) -> Path:
    t, prompts, outputs = TRACES[name](np.random.default_rng(seed))
    path = folder / f"{name}.csv"
    start = datetime(2024, 5, 1)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for a, p, o in zip(t, prompts, outputs, strict=True):
            stamp = start + timedelta(seconds=float(a))
            w.writerow([stamp.strftime("%Y-%m-%d %H:%M:%S.%f"), int(p), int(o)])
    return path


def cell(args: tuple[str, Path, tuple[str, str, str, int], float]) -> dict[str, Any]:
    name, path, (model, gpu, slo_name, workers), fraction = args
    profile = resolve_profile(model, gpu, None)
    row: dict[str, Any] = {"workload": name, "model": model, "gpu": gpu, "slo": slo_name}
    row |= {"workers": workers, "fraction": fraction}
    setup = rb.setup_at(
        lambda rps: replace(build_workload(str(path), rps, 0, profile.context_limit), name=name),
        profile,
        rb.SLOS[slo_name],
        workers,
        fraction,
        0,
    )
    if setup is None:
        row["skipped"] = "no static split meets TTFT at any rate"
        return row
    row |= {"rps": setup.rps} | rb.score(setup.workload, setup.base)
    row["misses"] = rb.check(row)
    return row


def main(out: str, folder: Path) -> None:
    try:
        f = open(out, "w")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        sys.exit(f"hourlong.py: cannot write OUT.jsonl {out}: {exc.strerror}")
    paths = {name: write_trace(name, folder) for name in TRACES}
    work = [(n, p, d, x) for n, p in paths.items() for d in DEPLOYMENTS for x in FRACTIONS]
    with ProcessPoolExecutor(2) as pool, f:
        for row in pool.map(cell, work):
            f.write(json.dumps(row) + "\n")
            if "skipped" in row:
                print(f"{row['workload']:<14} {row['model']}/{row['gpu']}: {row['skipped']}")
                continue
            print(
                f"{row['workload']:<14} {row['model']}/{row['gpu']:<10} {row['slo']:<7}"
                f" {row['workers']}w {row['fraction']:>4g}x {row['rps']:>7g} req/s"
                f"  static {100 * row['static']:5.1f}  FluidPD {100 * row['fluidpd']:5.1f}"
                f"  oracle {100 * row['oracle']:5.1f}  {row['vs_static_pp']:+6.2f} pp"
                f"  {row['switches']} switches  {','.join(row['misses'])}",
                flush=True,
            )


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python hourlong.py OUT.jsonl [TRACE_DIR]")
    if len(sys.argv) == 3:
        trace_dir = Path(sys.argv[2])
        if not trace_dir.is_dir():
            sys.exit(f"hourlong.py: TRACE_DIR {trace_dir} is not a folder")
        main(sys.argv[1], trace_dir)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(sys.argv[1], Path(tmp))
