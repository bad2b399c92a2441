"""`python -m harness.drill_operator` (run from e2e/): the operator SIGKILLed mid scale-in and
at each point of a role switch, round after round, on the test control plane under load
through the router; writes JSON.

This drill lives with the test harness, not in ``fluidpd drill``: it needs the test control
plane (kube-apiserver, etcd, ... built by e2e/testplane/build-binaries.sh) and the fake
kubelet, which are test infrastructure and not part of the shipped ``fluidpd`` package.

Each round is the two scenarios of ``e2e/test_operator_chaos.py``, through the same code
(``harness.operator_chaos``), each on a fresh FluidPDDeployment (sim engine) in one namespace
with its own load:

- scale-in: 6 workers (3P3D) scaled to 5, 4 and 3; the operator is SIGKILLed the moment each
  victim pod gets its retire annotation, then restarted;
- switch: 2P2D; the operator is SIGKILLed, a switch is staged at one of the three points an
  operator can die in one (intent only; sidecar draining; sidecar done, label stale), and the
  operator is restarted.

Per kill it records where the operator died, the pod and change, restart to the change done
in the cluster and to the router serving it, restart to the new operator process up (kopf's
startup, from its log: on a loaded machine most of the time to done), the deployment's pod
restarts and replaced pods, and the requests of the kill's window (sent, completed, failed,
hung, in flight at the kill).
Exit status: 0 when every change completed with no pod restart and nothing lost, 1 otherwise,
2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fluidpd.cli.errors import UserError
from fluidpd.cli.help_format import HelpFormatter
from fluidpd.cli.options import SEED_HELP, non_negative_int, positive_float, positive_int
from harness.binaries import CONTROL_PLANE, ensure_binaries
from harness.controlplane import ControlPlane
from harness.kubelet import FakeKubelet
from harness.load import HANG_S
from harness.namespace import create_namespace, delete_namespace
from harness.operator import Operator, install_crd
from harness.operator_chaos import (
    Deployment,
    Kill,
    account,
    chaos_load,
    scale_in_killed,
    start_scale_in_deployment,
    start_switch_deployment,
    switches_killed,
)

PROG = "python -m harness.drill_operator"
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "out" / "drills" / "operator-chaos.json"
PHASES = ("scale-in", "switch")

log = logging.getLogger("fluidpd.e2e.drill_operator")


class _Parser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr and exit 2, as in ``fluidpd``."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        formatter_class=HelpFormatter,
        description="The operator SIGKILLed mid scale-in and mid-switch, repeatedly, on the e2e "
        "test control plane under load through the router (issue #15); writes JSON. Run it "
        "from e2e/. It is not a `fluidpd drill`: the control plane and the fake kubelet are "
        "test infrastructure (e2e/harness), not shipped in the fluidpd package.",
    )
    p.add_argument(
        "--rounds",
        type=positive_int,
        default=3,
        help="rounds; each is a scale-in round (3 kills) and a switch round (3 kills), each on "
        "a fresh deployment",
    )
    p.add_argument(
        "--duration",
        type=positive_float,
        default=None,
        help="start no round after this many seconds of rounds (default: no limit; --rounds "
        "is then the count)",
    )
    p.add_argument(
        "--rps", type=positive_float, default=2.0, help="open-loop load through the router"
    )
    p.add_argument("--seed", type=non_negative_int, default=0, help=SEED_HELP)
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="keep the control plane's files, the pods' output and the operator's log here "
        "(default: a temporary directory, removed afterwards)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON result file")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The arguments, checked; ``UserError`` (one line) when they are not usable."""
    args = build_parser().parse_args(argv)
    if args.out.is_dir():
        raise UserError(f"argument --out: {args.out} is a directory")
    # Now, not after the rounds: a drill's minutes must not be lost to an unwritable path.
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"argument --out: cannot create {args.out.parent}: {e.strerror}") from None
    if args.run_dir is not None and args.run_dir.exists():
        if not args.run_dir.is_dir():
            raise UserError(f"argument --run-dir: {args.run_dir} is not a directory")
        if any(args.run_dir.iterdir()):
            raise UserError(f"argument --run-dir: {args.run_dir} is not empty")
    return args


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "mean": round(statistics.fmean(values), 3),
        "p50": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def _phase(
    kind: str,
    n: int,
    cp: ControlPlane,
    k8s_api: Any,
    ns: str,
    op: Operator,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One scale-in or switch round on a fresh deployment, deleted afterwards. Never raises for
    a failed step: the error is recorded, with every kill up to it."""
    name = f"chaos-{kind}-{n}"
    kills: list[Kill] = []
    out: dict[str, Any] = {"round": n, "phase": kind, "deployment": name, "error": ""}
    t0 = time.time()
    dep: Deployment | None = None
    load = None
    try:
        start = start_scale_in_deployment if kind == "scale-in" else start_switch_deployment
        dep = start(cp, ns, name)
        out["ready_s"] = round(time.time() - t0, 2)
        # A different request sequence for every phase of every round, reproducible by --seed.
        load = chaos_load(dep.url, seed=args.seed * 1000 + 2 * n + PHASES.index(kind), rps=args.rps)
        if kind == "scale-in":
            scale_in_killed(dep, k8s_api, op, kills)
        else:
            switches_killed(dep, op, kills)
    except Exception as e:  # recorded: the drill reports what happened, then stops
        log.exception("%s round %d failed", kind, n)
        out["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    finally:
        if load is not None:
            report = load.stop()
            account(report.outcomes, kills)
            out["requests"] = report.summary(HANG_S)
        if op.proc is None:  # killed when the step failed: the deletion needs its finalizer
            op.start()
    out["kills"] = [asdict(k) for k in kills]
    if dep is not None:
        try:
            out["pod_restarts"] = sum(dep.restarts().values())
            out["pods_replaced"] = dep.replaced()
            dep.delete()
        except Exception as e:
            log.exception("cleaning up %s failed", name)
            out["error"] = out["error"] or f"cleanup: {type(e).__name__}: {e}".splitlines()[0]
    out["seconds"] = round(time.time() - t0, 1)
    return out


def summarize(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over every phase, and per kill point."""
    kills = [k for p in phases for k in p["kills"]]
    by_where: dict[str, dict[str, Any]] = {}
    for where in dict.fromkeys(k["where"] for k in kills):
        mine = [k for k in kills if k["where"] == where]
        row: dict[str, Any] = {
            "kills": len(mine),
            "completed": sum(1 for k in mine if k["completed_s"] is not None),
            "completed_s": _stats([k["completed_s"] for k in mine if k["completed_s"] is not None]),
            "routed_s": _stats([k["routed_s"] for k in mine if k["routed_s"] is not None]),
            "operator_up_s": _stats(
                [k["operator_up_s"] for k in mine if k["operator_up_s"] is not None]
            ),
            "pod_restarts": sum(k["pod_restarts"] or 0 for k in mine),
        }
        if where.startswith("scale-in"):
            row["mid_way"] = sum(1 for k in mine if k["mid_way"])
        by_where[where] = row
    loads = [p["requests"] for p in phases if "requests" in p]
    errors: Counter[str] = Counter()
    for s in loads:
        errors.update(s["errors"])
    requests = {
        key: sum(s[key] for s in loads) for key in ("sent", "completed", "failed_clearly", "hung")
    }
    totals = {
        "phases": len(phases),
        "kills": len(kills),
        "completed": sum(1 for k in kills if k["completed_s"] is not None),
        "pod_restarts": sum(p.get("pod_restarts", 0) for p in phases),
        "pods_replaced": sum(len(p.get("pods_replaced", [])) for p in phases),
        "requests": requests | {"errors": dict(errors)},
        "by_where": by_where,
        "phase_errors": [f"{p['phase']} {p['round']}: {p['error']}" for p in phases if p["error"]],
    }
    totals["ok"] = bool(
        phases
        and not totals["phase_errors"]
        and totals["completed"] == totals["kills"]
        and totals["pod_restarts"] == 0
        and totals["pods_replaced"] == 0
        and requests["completed"] == requests["sent"]
        and requests["hung"] == 0
    )
    return totals


def _git_commit() -> str:
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return proc.stdout.strip() or "unknown"


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {
        "command": f"{PROG} {shlex.join(argv)}".strip(),
        "cwd": os.getcwd(),
        "commit": _git_commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "rps": args.rps,
        "hang_s": HANG_S,
    }
    phases: list[dict[str, Any]] = []
    bin_dir = ensure_binaries(CONTROL_PLANE)
    with tempfile.TemporaryDirectory(prefix="fluidpd-opdrill-") as tmp:
        run_dir = args.run_dir or Path(tmp)
        t_plane = time.monotonic()
        with ControlPlane(bin_dir, workdir=run_dir / "controlplane") as cp, FakeKubelet(cp):
            install_crd(cp)
            result["plane_up_s"] = round(time.monotonic() - t_plane, 1)
            api = cp.api_client()
            ns = create_namespace(api, "operator-drill")
            op = Operator(cp, ns, run_dir / "operator.log")
            op.start()
            t0 = time.monotonic()
            try:
                for n in range(args.rounds):
                    if args.duration is not None and time.monotonic() - t0 > args.duration:
                        break
                    for kind in PHASES:
                        phases.append(_phase(kind, n, cp, api, ns, op, args))
                        log.warning("round %d %s: %s", n, kind, _line(phases[-1]))
                        if phases[-1]["error"]:
                            break
                    if phases[-1]["error"]:
                        break
            except KeyboardInterrupt:
                result["interrupted"] = True
            finally:
                result["rounds_s"] = round(time.monotonic() - t0, 1)
                op.delete_all_and_stop()
                delete_namespace(api, ns)
                api.close()
    result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["rounds"] = len({p["round"] for p in phases})
    result["totals"] = summarize(phases)
    result["phases"] = phases
    return result


def _line(phase: dict[str, Any]) -> str:
    r = phase.get("requests", {})
    done = sum(1 for k in phase["kills"] if k["completed_s"] is not None)
    return (
        f"{done}/{len(phase['kills'])} completed after the restart, "
        f"{phase.get('pod_restarts')} pod restarts; requests {r.get('completed')}/{r.get('sent')} "
        f"completed, {r.get('failed_clearly')} failed, {r.get('hung')} hung"
        + (f"; error: {phase['error']}" if phase["error"] else "")
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
    except UserError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    result = run(args, argv)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    t = result["totals"]
    r = t["requests"]
    print(
        f"{result['rounds']} rounds, {t['kills']} operator kills, {t['completed']} changes "
        f"completed after the restart, {t['pod_restarts']} pod restarts; requests "
        f"{r['completed']}/{r['sent']} completed, {r['failed_clearly']} failed, {r['hung']} "
        f"hung; {'ok' if t['ok'] else 'NOT ok'}; wrote {args.out}"
    )
    return 0 if t["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
