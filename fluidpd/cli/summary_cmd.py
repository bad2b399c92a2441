"""``fluidpd summary``: the attainment table and FluidPD-vs-baselines summary of results."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fluidpd.cli.errors import UserError
from fluidpd.sim.report import report_text, series_key


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


def add_compare_parser(sub: Any) -> None:
    p = sub.add_parser(
        "compare",
        help="compare two result sets run by run (e.g. live replay against the simulator)",
        description="Prints, for every (workload, rps, policy) run in both directories, the "
        "overall SLO attainment of each and their difference in percentage points, and the "
        "mean TTFT of each.",
    )
    p.add_argument("a", metavar="DIR_A", help="first results directory (e.g. a live replay)")
    p.add_argument("b", metavar="DIR_B", help="second results directory (e.g. the simulator)")
    p.add_argument("--label-a", default="A", help="column name for DIR_A, e.g. live")
    p.add_argument("--label-b", default="B", help="column name for DIR_B, e.g. simulated")
    p.add_argument(
        "--out",
        default=None,
        help="also write the comparison as JSON here (default: print it only)",
    )
    p.set_defaults(func=run_compare)


_COMPARED = ("slo_attainment", "ttft_attainment", "tpot_attainment", "mean_ttft_ms", "p99_ttft_ms",
             "mean_tpot_ms", "failed")  # fmt: skip


def _ms(value: Any) -> str:
    return f"{value:.0f}" if isinstance(value, int | float) else "-"


def compare_table(rows: list[dict[str, Any]], label_a: str, label_b: str) -> str:
    """The comparison as a table whose two header lines name every column: what is measured
    (overall SLO attainment, mean TTFT) over which result set."""
    diff = f"{label_a}-{label_b} pp"
    wa, wb, wd = max(len(label_a), 6), max(len(label_b), 6), max(len(diff), 8)
    key = f"{'workload':<14} {'rps':>5} {'policy':<10}"
    attain_w, ttft_w = wa + wb + wd + 2, wa + wb + 1
    lines = [
        f"{'':<{len(key)}} {'SLO attainment (%)':^{attain_w}}  {'mean TTFT (ms)':^{ttft_w}}",
        f"{key} {label_a:>{wa}} {label_b:>{wb}} {diff:>{wd}}  {label_a:>{wa}} {label_b:>{wb}}",
    ]
    for row in rows:
        a, b = row["slo_attainment"]["a"], row["slo_attainment"]["b"]
        lines.append(
            f"{row['workload'][:14]:<14} {row['rps']:>5g} {row['policy'][:10]:<10}"
            f" {100 * a:>{wa}.1f} {100 * b:>{wb}.1f} {row['slo_attainment_diff_pp']:>+{wd}.1f}"
            f"  {_ms(row['mean_ttft_ms']['a']):>{wa}} {_ms(row['mean_ttft_ms']['b']):>{wb}}"
        )
    return "\n".join(lines)


def run_compare(args: argparse.Namespace) -> int:
    a = {series_key(r): r for r in _runs(Path(args.a) / "results.json")}
    b = {series_key(r): r for r in _runs(Path(args.b) / "results.json")}
    common = sorted(set(a) & set(b))
    if not common:
        raise UserError("no run (workload, rps, policy) appears in both result sets")
    rows = []
    for key in common:
        ra, rb = a[key], b[key]
        row: dict[str, Any] = {"workload": key[0], "rps": key[1], "policy": key[2]}
        for field in _COMPARED:
            row[field] = {"a": ra.get(field), "b": rb.get(field)}
        diff = 100 * (ra["slo_attainment"] - rb["slo_attainment"])
        row["slo_attainment_diff_pp"] = round(diff, 2)
        rows.append(row)
    print(compare_table(rows, args.label_a, args.label_b))
    if args.out:
        doc = {"a": args.a, "b": args.b, "labels": {"a": args.label_a, "b": args.label_b},
               "runs": rows,
               "max_abs_diff_pp": max(abs(r["slo_attainment_diff_pp"]) for r in rows)}  # fmt: skip
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0
