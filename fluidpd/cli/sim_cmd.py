"""``fluidpd sim``: compare policies on a workload over a sweep of request rates."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from fluidpd import __version__
from fluidpd.cli.errors import UserError
from fluidpd.cli.options import (
    GPU_HELP,
    MODEL_HELP,
    PROFILE_HELP,
    SEED_HELP,
    add_float,
    float_list,
    positive_float,
    positive_int,
)
from fluidpd.cli.policy_options import (
    add_fluidrole_options,
    add_fluidtoken_options,
    add_slo_options,
    fluidrole_config,
    fluidtoken_config,
    slo_config,
)
from fluidpd.core.pairing import PAIRINGS
from fluidpd.profiles import resolve_profile
from fluidpd.sim.policies import POLICY_NAMES, AutoscaleConfig, parse_pd, parse_policies
from fluidpd.sim.report import RUN_FILE, report_text, series_key, write_results
from fluidpd.sim.robustness import (
    SIZES,
    count_cells,
    format_overall,
    format_rows,
    overall,
    run_suite,
)
from fluidpd.sim.runner import RunOutput, RunSpec, default_jobs, run_many
from fluidpd.sim.simulator import SimConfig
from fluidpd.sim.workloads import WORKLOAD_NAMES, build_workload

DEFAULT_OUT = "out/sim"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sim",
        help="simulate policies on a workload over a sweep of request rates",
        description=(
            "Discrete-event simulation of a P/D-disaggregated deployment running the same "
            "scheduler and policies as the live sidecars. Writes DIR/results.json, per-run "
            "time series and plots, and prints an attainment table."
        ),
    )
    g = p.add_argument_group("deployment")
    g.add_argument("--model", default="llama-3.1-8b", help=MODEL_HELP)
    g.add_argument("--gpu", default="a100-80gb", help=GPU_HELP)
    g.add_argument("--profile", default=None, help=PROFILE_HELP)
    g.add_argument("--pd", default="4P4D", help="initial prefill/decode split (default 4P4D)")
    g.add_argument(
        "--pairing",
        choices=PAIRINGS,
        default="round-robin",
        help="P/D pairing (default round-robin; random is SGLang's own mini_lb)",
    )
    w = p.add_argument_group("workload")
    w.add_argument(
        "--workload",
        default="azure-mixed",
        help=f"{', '.join(WORKLOAD_NAMES)}, or a trace CSV path; comma-separated for several "
        "(default azure-mixed)",
    )
    w.add_argument(
        "--rps", type=float_list, default=[20.0], help="request rates to sweep, e.g. 10,20,30"
    )
    w.add_argument(
        "--num-requests",
        type=positive_int,
        default=None,
        help="simulate the first N requests of the workload (default: all of it)",
    )
    w.add_argument("--seed", type=int, default=0, help=SEED_HELP)
    add_slo_options(p.add_argument_group("SLOs (seconds)"))
    r = p.add_argument_group("policies")
    r.add_argument(
        "--policy",
        default="all",
        help=f"one of {', '.join(POLICY_NAMES)}, a comma list of them, or all",
    )
    add_fluidtoken_options(r)
    add_fluidrole_options(r)
    r.add_argument(
        "--autoscale-max-workers",
        type=positive_int,
        default=None,
        help="autoscale baseline GPU cap (default: workers in --pd + 2)",
    )
    add_float(r, "--autoscale-detection", 5.0, "autoscale detection delay, s", allow_zero=True)
    add_float(
        r, "--autoscale-provisioning", 200.0, "autoscale provisioning delay, s", allow_zero=True
    )
    e = p.add_argument_group("engine model")
    add_float(e, "--noise", 0.05, "sigma of log-normal noise on step times", allow_zero=True)
    add_float(e, "--drift", 1.0, "true engine time / profile prediction")
    e.add_argument("--adaptive", action="store_true", help="recalibrate predictors online")
    add_float(e, "--timeout", 60.0, "cancel requests without a first token after this long, s")
    o = p.add_argument_group("output")
    o.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    o.add_argument(
        "--jobs",
        type=positive_int,
        default=default_jobs(),
        help=f"runs simulated in parallel processes (default: the CPU count, at most 4; "
        f"{default_jobs()} here)",
    )
    o.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    o.add_argument(
        "--timeseries-rps",
        type=positive_float,
        default=None,
        help="rate whose time series are plotted (default: the middle of --rps)",
    )
    o.add_argument(
        "--series-json",
        choices=("all", "plotted"),
        default="all",
        help="write time-series JSON for every run, or only for the plotted rate (default all)",
    )
    o.add_argument("--quiet", action="store_true", help="no progress bar")
    s = p.add_argument_group("suites")
    s.add_argument(
        "--suite",
        choices=("robustness",),
        default=None,
        help="run a fixed matrix instead of the options above: robustness = FluidPD vs static "
        "and oracle over workloads x profiles x SLOs x sizes x rates (uses --seed, --jobs, --out; "
        "default: none, run the options above)",
    )
    s.add_argument(
        "--suite-size",
        choices=tuple(SIZES),
        default="full",
        help="full matrix, or the reduced one CI runs (default full)",
    )
    p.set_defaults(func=run)


def _workloads(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise UserError("--workload: empty")
    return list(dict.fromkeys(names))


def specs_from_args(args: argparse.Namespace) -> list[RunSpec]:
    profile = resolve_profile(args.model, args.gpu, args.profile)
    n_prefill, n_decode = parse_pd(args.pd)
    policies = parse_policies(args.policy)
    workloads = _workloads(args.workload)
    slo = slo_config(args)
    token_cfg = fluidtoken_config(args)
    role_cfg = fluidrole_config(args)
    if args.min_prefill + args.min_decode > n_prefill + n_decode:
        raise UserError("--min-prefill + --min-decode exceed the workers in --pd")
    max_workers = args.autoscale_max_workers or n_prefill + n_decode + 2
    autoscale = AutoscaleConfig(
        detection_s=args.autoscale_detection,
        provisioning_s=args.autoscale_provisioning,
        max_workers=max_workers,
    )
    for workload in workloads:  # fail fast on a bad workload, before any long run
        build_workload(
            workload,
            args.rps[0],
            seed=args.seed,
            context_limit=profile.context_limit,
            num_requests=args.num_requests,
        )
    base = SimConfig(
        profile=profile,
        slo=slo,
        n_prefill=n_prefill,
        n_decode=n_decode,
        token_cfg=token_cfg,
        role_cfg=role_cfg,
        autoscale_cfg=autoscale,
        pairing=args.pairing,
        timeout_s=args.timeout,
        noise=args.noise,
        drift=args.drift,
        adaptive=args.adaptive,
        seed=args.seed,
    )
    return [
        RunSpec(policy, workload, rps, base, args.num_requests)
        for workload in workloads
        for rps in args.rps
        for policy in policies
    ]


def run(args: argparse.Namespace) -> int:
    if args.suite == "robustness":
        return _run_robustness(args)
    specs = specs_from_args(args)
    out_dir = Path(args.out)
    command = "fluidpd " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    started = time.perf_counter()
    bar = tqdm(total=len(specs), unit="run", disable=args.quiet, file=sys.stderr)

    def progress(out: RunOutput) -> None:
        r = out.record
        bar.set_postfix_str(f"{r['workload']} {r['rps']:g}rps {r['policy']}")
        bar.update()

    outputs = run_many(specs, jobs=args.jobs, progress=progress)
    bar.close()
    chosen = _series_rate(args)
    path = write_results(
        out_dir, outputs, command, chosen if args.series_json == "plotted" else None
    )
    if not args.no_plots:
        _plots(out_dir, outputs, args, chosen)
    print(report_text(out_dir, [o.record for o in outputs]))
    print(f"\nwrote {path} ({len(outputs)} runs, {time.perf_counter() - started:.1f} s)")
    return 0


def _series_rate(args: argparse.Namespace) -> float:
    rates = sorted(args.rps)
    return float(args.timeseries_rps if args.timeseries_rps in rates else rates[len(rates) // 2])


def _plots(
    out_dir: Path, outputs: list[RunOutput], args: argparse.Namespace, chosen: float
) -> None:
    series = {
        series_key(o.record): o.series
        for o in outputs
        if o.series and float(o.record["rps"]) == chosen
    }
    edges: dict[str, list[float]] = {}
    for o in outputs:
        if o.series and o.record["workload"] not in edges:
            spec_workload = build_workload(
                str(o.record["workload"]), chosen, seed=args.seed, num_requests=args.num_requests
            )
            edges[str(o.record["workload"])] = [
                float(spec_workload.arrivals[a]) for _, a, _ in spec_workload.windows[1:]
            ]
    records = [o.record for o in outputs]
    ablation_rps = {str(r["workload"]): chosen for r in records}
    from fluidpd.sim.plots import write_plots  # lazily, as in replay_cmd._plots

    for written in write_plots(out_dir, records, series, args.ttft_slo, edges, ablation_rps):
        print(f"plot: {written}")


def _run_robustness(args: argparse.Namespace) -> int:
    out_dir = Path(args.out)
    command = "fluidpd " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    size = SIZES[args.suite_size]
    started = time.perf_counter()
    bar = tqdm(total=count_cells(size), unit="cell", disable=args.quiet, file=sys.stderr)
    out_dir.mkdir(parents=True, exist_ok=True)
    # One line per finished cell, so that an interrupted run keeps what it measured.
    partial = (out_dir / "cells.jsonl").open("w")

    def progress(row: dict[str, Any]) -> None:
        partial.write(json.dumps(row) + "\n")
        partial.flush()
        bar.update()

    with partial:
        rows = run_suite(size, seed=args.seed, jobs=args.jobs, progress=progress)
    bar.close()
    summary = overall(rows)
    doc = {"size": args.suite_size, "seed": args.seed, "overall": summary, "cells": rows}
    (out_dir / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    run_doc = {
        "command": command,
        "fluidpd_version": __version__,
        "wall_s": round(time.perf_counter() - started, 3),
    }
    (out_dir / RUN_FILE).write_text(json.dumps(run_doc, indent=1) + "\n")
    text = format_rows(rows) + "\n\n" + format_overall(summary)
    (out_dir / "summary.txt").write_text(text + "\n")
    (out_dir / "command.txt").write_text(command + "\n")
    print(text)
    print(
        f"\nwrote {out_dir / 'results.json'} ({len(rows)} cells, "
        f"{time.perf_counter() - started:.1f} s)"
    )
    return 0
