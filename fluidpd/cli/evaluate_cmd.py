"""``fluidpd evaluate``: the live stack against the simulator on the same workload slice.

For each policy: start a local deployment (``fluidpd up``), replay the slice against it
(``fluidpd replay``), stop it. Then simulate the same slice with the same profile, SLOs, seed
and noise (``fluidpd sim``) and compare run by run (``fluidpd compare``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from fluidpd.cli.errors import UserError
from fluidpd.cli.options import GPU_HELP, MODEL_HELP, SEED_HELP, positive_float, positive_int
from fluidpd.cli.up_cmd import LIVE_POLICIES
from fluidpd.sim.workloads import WORKLOAD_NAMES


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "evaluate",
        help="live stack vs simulator: replay a workload slice on `fluidpd up`, then simulate it",
    )
    p.add_argument(
        "--policies",
        default="static,fluidpd",
        help=f"comma list of {', '.join(LIVE_POLICIES)}; each gets its own fresh deployment",
    )
    p.add_argument(
        "--workload",
        default="azure-mixed",
        help=f"{', '.join(WORKLOAD_NAMES)}, or a trace CSV path",
    )
    p.add_argument("--rps", type=positive_float, default=20.0, help="request rate, req/s")
    p.add_argument(
        "--num-requests",
        type=positive_int,
        default=1000,
        help="replay and simulate the first N requests of the workload",
    )
    p.add_argument("--pd", default="4P4D", help="initial split, e.g. 4P4D")
    p.add_argument("--model", default="llama-3.1-8b", help=MODEL_HELP)
    p.add_argument("--gpu", default="a100-80gb", help=GPU_HELP)
    p.add_argument("--seed", type=int, default=0, help=SEED_HELP)
    p.add_argument(
        "--out",
        default="out/evaluate",
        help="output directory, replaced if it exists: live/, sim/, compare.json, up-*/ logs",
    )
    p.add_argument("--no-sim", action="store_true", help="replay only, no simulation")
    p.set_defaults(func=run)


def _fluidpd(*argv: str) -> None:
    exe = shutil.which("fluidpd")
    cmd = [exe] if exe else [sys.executable, "-m", "fluidpd.cli.main"]
    done = subprocess.run([*cmd, *argv], check=False)
    if done.returncode != 0:
        raise UserError(f"`fluidpd {' '.join(argv[:1])}` failed (exit {done.returncode})")


def run(args: argparse.Namespace) -> int:
    from fluidpd.drills.stack import LocalStack

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in LIVE_POLICIES]
    if bad or not policies:
        raise UserError(f"--policies: choose from {', '.join(LIVE_POLICIES)}")
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model = ["--model", args.model, "--gpu", args.gpu]
    slice_args = [
        "--workload", args.workload, "--rps", str(args.rps),
        "--num-requests", str(args.num_requests), "--seed", str(args.seed),
    ]  # fmt: skip
    for policy in policies:
        run_dir = out / f"up-{policy}"
        with LocalStack(run_dir, args.pd, policy, *model, "--seed", str(args.seed)) as stack:
            print(f"== {policy}: {args.pd} at {stack.endpoint}", flush=True)
            # The stack's admin token lets the replay read the router's /admin/stats: the
            # live run's role switches and stolen tokens (without it both read 0).
            _fluidpd(
                "replay", "--endpoint", stack.endpoint, *slice_args, "--label", policy,
                "--model-name", args.model, "--gpu", args.gpu, "--pd", args.pd, "--quiet",
                "--api-key", stack.token, "--out", str(out / "live"),
            )  # fmt: skip
            orphans = stack.stop()
        if orphans:
            raise UserError(f"components outlived the {policy} stack: {', '.join(orphans)}")
    if not args.no_sim:
        _fluidpd(
            "sim", *model, *slice_args, "--pd", args.pd, "--policy", ",".join(policies),
            "--quiet", "--out", str(out / "sim"),
        )  # fmt: skip
        _fluidpd(
            "compare", str(out / "live"), str(out / "sim"), "--label-a", "live",
            "--label-b", "simulated", "--out", str(out / "compare.json"),
        )  # fmt: skip
    return 0
