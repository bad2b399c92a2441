"""``fluidpd summary``: the attainment table and FluidPD-vs-baselines summary of results."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fluidpd.cli.errors import UserError
from fluidpd.sim.report import report_text


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "summary",
        help="print (and rewrite summary.txt for) the results in DIR/results.json",
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="directories holding results.json")
    p.set_defaults(func=run)


def _runs(path: Path) -> list[dict[str, Any]]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list):
        raise UserError(f"{path}: expected an object with a 'runs' list")
    need = {"policy", "rps", "workload", "slo_attainment", "tpot_attainment", "failed"}
    for i, run in enumerate(runs):
        missing = need - set(run) if isinstance(run, dict) else need
        if missing:
            raise UserError(f"{path}: runs[{i}] lacks {', '.join(sorted(missing))}")
    return runs


def run(args: argparse.Namespace) -> int:
    for d in args.dirs:
        out_dir = Path(d)
        runs = _runs(out_dir / "results.json")
        print(f"== {out_dir}\n{report_text(out_dir, runs)}\n")
    return 0
