"""How well does the forecast's capacity model rank static splits? (issue #14: the switch rule
can be no better than the model it asks.)

For every cell of the full matrix at one seed, this replays the cell's workload on every
static split of its workers (no FluidToken, no switching) and keeps each split's SLO
attainment with the demand of the whole trace (``DemandWindow`` over all of its arrivals: the
rate, the means, the prefill-time quantiles, c_a^2). It then asks ``CapacityModel.loss`` to
rank the splits at that demand, with no calibration (scale 1), and scores the ranking by:

- *regret*: the best split's attainment less that of the split the model ranks first;
- *picks off*: cells whose regret passes 2 pp;
- *pairs misordered*: neighbouring splits (one worker apart) whose attainments differ by more
  than 5 pp and that the model orders the other way (or ties);

over every cell, and over the cells whose trace lasts at least the forecast's horizon
(``FluidRoleConfig.horizon_s``, 120 s). The model is of a steady state; the shorter traces
(800 requests of an overloaded cell can arrive in 40 s) end while a decode pool past its
throughput is still filling, and there a split the model reads as failing serves most
requests.

The policy never sees a whole trace; it reads a minute of demand, bounds its rate and
calibrates the model by the pool's pressure. What this measures is the model all of that
rests on: where it ranks splits wrongly at the true demand, no bound or calibration makes a
forecast right.

    python model-accuracy/accuracy.py simulate model-accuracy/seed0.jsonl [SEED]  # 4 min, 2 cores
    python model-accuracy/accuracy.py score model-accuracy/seed0.jsonl [--worst N] [--idc 5]
    python model-accuracy/accuracy.py simulate model-accuracy/heldout.jsonl 0 --profiles A.yml B.yml

``score`` also prints the prefill queue's forecast misses against the simulated TTFT misses
(``prefill_bias``), reading the arrivals' variability as the policy does (c_a^2 of the gaps)
and as the index of dispersion of their counts. ``--idc BIN_S`` ranks the splits with that
index (of the counts per ``BIN_S`` seconds, one of ``IDC_BINS_S``) in place of c_a^2 where it
is higher.

(from ``results/robustness/``; ``summary-seedS.txt`` is the output of ``score --worst 25``;
``score`` takes seconds).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import asdict, replace
from functools import cache
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np

from fluidpd.core.fluidrole import FluidRoleConfig
from fluidpd.core.policy_forecast import CapacityModel, Demand, DemandWindow, Split
from fluidpd.profiles import ProfileError, load_profile_file
from fluidpd.sim import robustness as rb
from fluidpd.sim.metrics import attainment, good_mask
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import simulate

#: Bin widths (seconds) of the arrival counts whose index of dispersion each row keeps.
IDC_BINS_S = (2.0, 5.0, 10.0, 30.0)


def index_of_dispersion(arrivals: Any, bin_s: float) -> float:
    """Variance over mean of the arrivals counted per ``bin_s`` (the last, partial bin left
    out): 1 for a Poisson stream at any width, more where arrivals cluster at that scale."""
    counts = np.bincount((np.asarray(arrivals) // bin_s).astype(int))[:-1]
    if len(counts) < 2 or counts.mean() <= 0:
        return 1.0
    return float(counts.var() / counts.mean())


def _profile_name(row: dict[str, Any]) -> str:
    """``model/gpu``, or a profile file's name without its folder and suffix."""
    if row["model"].startswith(rb.PROFILE_FILE):
        return Path(row["model"][len(rb.PROFILE_FILE) :]).stem
    return f"{row['model']}/{row['gpu']}"


def _simulate_cell(args: tuple[rb.Cell, int, rb.SuiteSize]) -> dict[str, Any] | None:
    cell, seed, size = args
    setup = rb.setup_cell(cell, seed, size)
    if setup is None:
        return None
    w, base = setup.workload, setup.base
    window = DemandWindow(base.profile.prefill_predictor(), window_s=float("inf"))
    for t, p, o in zip(w.arrivals, w.prompt_lens, w.output_lens, strict=True):
        window.add(float(t), int(p), int(o))
    demand = window.demand(float(w.arrivals[-1]))
    static, ttft_miss, tpot_miss = {}, {}, {}
    for n_prefill in range(1, cell.workers):
        split = replace(
            base,
            mechanisms=MECHANISMS["static"],
            n_prefill=n_prefill,
            n_decode=cell.workers - n_prefill,
        )
        requests = simulate(w, split).requests
        static[n_prefill] = attainment(requests, base.slo)
        ttft_ok, tpot_ok = good_mask(requests, base.slo)
        ttft_miss[n_prefill] = 1.0 - float(np.mean(ttft_ok))
        tpot_miss[n_prefill] = 1.0 - float(np.mean(tpot_ok))
    return cell.row() | {
        "rps": setup.rps,
        "trace_s": float(w.arrivals[-1]),
        "demand": asdict(demand),
        "idc": {f"{t:g}": index_of_dispersion(w.arrivals, t) for t in IDC_BINS_S},
        "static": static,
        "ttft_miss": ttft_miss,
        "tpot_miss": tpot_miss,
    }


def simulate_rows(out: str, seed: int, files: list[str]) -> None:
    """Every cell of the full matrix at ``seed``, on the matrix's profiles or, where ``files``
    are given, on those profile files instead (the held-out deployments of ``../heldout/``)."""
    size = rb.SIZES["full"]
    if files:
        size = rb.on_profile_files(size, files)
    cells = [(cell, seed, size) for cell in rb.cells(size)]
    with Pool(2) as pool, open(out, "w") as f:
        for row in pool.imap(_simulate_cell, cells, chunksize=4):
            if row is not None:
                f.write(json.dumps(row) + "\n")


def _demand(row: dict[str, Any], idc_bin: str | None = None) -> Demand:
    """The row's demand; with ``idc_bin``, its arrivals' variability read as the index of
    dispersion of their counts per that bin where that is higher than c_a^2."""
    fields = dict(row["demand"])
    fields["prefill_quantiles"] = tuple(fields["prefill_quantiles"])
    if idc_bin is not None:
        fields["arrival_cv2"] = max(fields["arrival_cv2"], row["idc"][idc_bin])
    return Demand(**fields)


@cache
def _capacity_model(model: str, gpu: str, slo: str) -> CapacityModel:
    return CapacityModel.from_profile(rb.named_profile(model, gpu), rb.SLOS[slo])


def _model(row: dict[str, Any]) -> CapacityModel:
    return _capacity_model(row["model"], row["gpu"], row["slo"])


def score(
    rows: list[dict[str, Any]], worst: int, label: str, idc_bin: str | None = None
) -> list[str]:
    lines: list[str] = []
    regrets: list[float] = []
    by_workload: dict[str, list[float]] = defaultdict(list)
    misordered = pairs = 0
    off: list[tuple[float, str]] = []
    for row in rows:
        model, demand, n = _model(row), _demand(row, idc_bin), row["workers"]
        static = {int(k): v for k, v in row["static"].items()}
        loss = {p: model.loss(demand, Split(p, n - p)) for p in static}
        # Ties go to the split nearer the even one, as the static baseline starts there.
        pick = min(loss, key=lambda p: (loss[p], abs(p - n / 2)))
        best = max(static, key=lambda p: static[p])
        regret = static[best] - static[pick]
        regrets.append(regret)
        by_workload[row["workload"]].append(regret)
        if regret > 0.02:
            name = (
                f"{row['workload']} {_profile_name(row)} {row['slo']} {n}w "
                f"{row['fraction']:g}x: model {pick}P{n - pick}D {100 * static[pick]:.1f} %, "
                f"best {best}P{n - best}D {100 * static[best]:.1f} %"
            )
            off.append((regret, name))
        for p, here in static.items():
            if p + 1 in static and abs(here - static[p + 1]) > 0.05:
                pairs += 1
                order = (loss[p] - loss[p + 1]) * (static[p + 1] - here)
                misordered += order < 0 or loss[p] == loss[p + 1]
    lines.append(
        f"{label}: {len(rows)} cells, mean regret {100 * sum(regrets) / len(rows):.2f} pp,"
        f" picks off by > 2 pp {len(off)}, neighbouring pairs misordered {misordered}/{pairs}"
    )
    for workload, values in sorted(by_workload.items()):
        lines.append(
            f"  {workload:20s} mean regret {100 * sum(values) / len(values):5.2f} pp,"
            f" picks off {sum(v > 0.02 for v in values)}"
        )
    for regret, name in sorted(off, reverse=True)[:worst]:
        lines.append(f"  {100 * regret:5.1f} pp  {name}")
    return lines


def prefill_bias(rows: list[dict[str, Any]]) -> list[str]:
    """The prefill queue's forecast misses against the simulated TTFT misses, on the splits
    whose TTFT misses are the prefill queue's (its workers within capacity, the decode pool
    at most half loaded), over traces of at least the forecast's horizon: with the gaps'
    c_a^2 (``Demand.arrival_cv2``, what the policy reads), and with the index of dispersion
    of the counts per bin where that is higher. Rows are grouped by whether their arrivals
    cluster at 5 s (index of dispersion above 1.5)."""
    horizon = FluidRoleConfig().horizon_s
    keys = ["c_a^2"] + [f"IDC {t}s" for t in rows[0]["idc"]] if rows else []
    groups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["trace_s"] < horizon:
            continue
        model, demand, n = _model(row), _demand(row), row["workers"]
        group = "clustered" if row["idc"]["5"] > 1.5 else "not clustered"
        for p_str, simulated in row["ttft_miss"].items():
            p = int(p_str)
            busy = model.prefill_busy(demand, p)
            wait = model.prefill_wait(demand, p)
            if busy >= 1.0 or model.decode_ratio(demand, n - p, wait) > 0.5:
                continue
            groups[group]["simulated"].append(simulated)
            groups[group]["c_a^2"].append(model.queue_miss(demand, busy, p))
            for width, idc in row["idc"].items():
                bursty = replace(demand, arrival_cv2=max(demand.arrival_cv2, idc))
                groups[group][f"IDC {width}s"].append(model.queue_miss(bursty, busy, p))
    lines = []
    for group, values in sorted(groups.items()):
        simulated = np.array(values["simulated"])
        lines.append(
            f"{group}: {len(simulated)} splits, simulated TTFT misses {simulated.mean():.3f}"
        )
        for key in keys:
            forecast = np.array(values[key])
            lines.append(
                f"  {key:10s} forecast {forecast.mean():.3f}, simulated - forecast"
                f" {np.mean(simulated - forecast):+.3f}, mean abs error"
                f" {np.mean(np.abs(simulated - forecast)):.3f}"
            )
    return lines


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("simulate", "score"):
        print(
            "usage: accuracy.py simulate OUT.jsonl [SEED] [--profiles FILE.yaml ...]"
            " | score ROWS.jsonl [--worst N] [--idc BIN_S]"
        )
        return 2
    if argv[0] == "simulate":
        files = argv[argv.index("--profiles") + 1 :] if "--profiles" in argv else []
        rest = argv[: argv.index("--profiles")] if "--profiles" in argv else argv
        for path in files:
            try:
                load_profile_file(path)
            except ProfileError as e:
                print(f"--profiles: {e}")
                return 2
        simulate_rows(rest[1], int(rest[2]) if len(rest) > 2 else 0, files)
        return 0
    worst = int(argv[argv.index("--worst") + 1]) if "--worst" in argv else 0
    idc_bin = argv[argv.index("--idc") + 1] if "--idc" in argv else None
    try:
        with open(argv[1]) as f:
            rows = [json.loads(line) for line in f]
    except (OSError, json.JSONDecodeError) as e:
        print(f"score: cannot read rows from {argv[1]}: {e}")
        return 2
    horizon = FluidRoleConfig().horizon_s
    long = [row for row in rows if row["trace_s"] >= horizon]
    if idc_bin is not None and rows and idc_bin not in rows[0]["idc"]:
        print(f"--idc: {idc_bin!r} is not a bin the rows keep ({', '.join(rows[0]['idc'])})")
        return 2
    read = "" if idc_bin is None else f", c_a^2 read as the index of dispersion at {idc_bin} s"
    print("\n".join(score(rows, worst, "every cell" + read, idc_bin)))
    print("\n".join(score(long, worst, f"traces of {horizon:g} s or more" + read, idc_bin)))
    if idc_bin is None:
        print("\n".join(prefill_bias(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
