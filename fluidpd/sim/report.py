"""Writes a sweep's results.json and time series, and formats the attainment table."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fluidpd import __version__
from fluidpd.sim.policies import POLICY_NAMES
from fluidpd.sim.runner import RunOutput
from fluidpd.sim.summary import format_summary, summarize


def slug(text: str) -> str:
    """A file-name-safe form of ``text`` (results, time series and plots are named with it)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


def series_key(record: Mapping[str, Any]) -> tuple[str, float, str]:
    return (str(record["workload"]), float(record["rps"]), str(record["policy"]))


#: Beside results.json: how the results were made (the command, the version, each run's wall
#: seconds), none of which is a result; results.json is a function of the inputs and the seed.
RUN_FILE = "run.json"


def write_results(
    out_dir: Path,
    outputs: Sequence[RunOutput],
    command: str,
    series_rps: float | None = None,
) -> Path:
    """``results.json`` (the ``runs`` list is the contract: the same inputs and seed give the
    same bytes) plus one time-series file per run (only for rate ``series_rps`` when given);
    the command and the measured wall times go to ``run.json`` (``RUN_FILE``) and the command
    also to ``command.txt``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    doc = {"runs": [o.record for o in outputs], "fluidpd_version": __version__}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    run = {
        "command": command,
        "fluidpd_version": __version__,
        "wall_s": [
            {"workload": w, "rps": r, "policy": p, "wall_s": o.wall_s}
            for o in outputs
            if o.wall_s is not None
            for w, r, p in [series_key(o.record)]
        ],
    }
    (out_dir / RUN_FILE).write_text(json.dumps(run, indent=1) + "\n")
    ts_dir = out_dir / "timeseries"
    for o in outputs:
        if not o.series or (series_rps is not None and o.record["rps"] != series_rps):
            continue
        ts_dir.mkdir(exist_ok=True)
        workload, rps, policy = series_key(o.record)
        name = f"{slug(Path(workload).stem)}_{rps:g}rps_{policy}.json"
        (ts_dir / name).write_text(json.dumps(o.series) + "\n")
    (out_dir / "command.txt").write_text(command + "\n")
    return path


def format_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Overall SLO attainment (%) per workload and rate, one column per policy."""
    policies = [p for p in POLICY_NAMES if any(r["policy"] == p for r in records)]
    rows: dict[tuple[str, float], dict[str, Mapping[str, Any]]] = {}
    for r in records:
        workload, rps, policy = series_key(r)
        rows.setdefault((workload, rps), {})[policy] = r
    head = f"{'workload':<16} {'rps':>6}  " + "  ".join(f"{p:>10}" for p in policies)
    lines = ["SLO attainment (%; TTFT and TPOT both met)", head, "-" * len(head)]
    for (workload, rps), by_policy in sorted(rows.items()):
        cells = []
        for p in policies:
            rec = by_policy.get(p)
            cells.append(f"{100 * float(rec['slo_attainment']):>10.1f}" if rec else f"{'-':>10}")
        lines.append(f"{Path(workload).stem[:16]:<16} {rps:>6g}  " + "  ".join(cells))
    detail = [r for r in records if r["policy"] in ("fluidpd", "fluidrole", "fluidtoken")]
    if detail:
        lines.append("")
        # Like the first table, a title that says what the columns are: the abbreviated
        # headers alone left "stolen tok" and "TTFT %" to guesswork.
        lines.append(
            "Per run: role switches, prompt tokens stolen by decode workers (FluidToken), "
            "TTFT and TPOT attainment (%), failed requests"
        )
        lines.append(
            f"{'workload':<16} {'rps':>6}  {'policy':<10} {'switches':>8} {'stolen tok':>11}"
            f" {'TTFT %':>7} {'TPOT %':>7} {'failed':>7}"
        )
        for r in sorted(detail, key=series_key):
            workload, rps, policy = series_key(r)
            switches = r["role_switches"]
            assert isinstance(switches, list)
            lines.append(
                f"{Path(workload).stem[:16]:<16} {rps:>6g}  {policy:<10} {len(switches):>8}"
                f" {r['stolen_tokens']:>11} {100 * float(r['ttft_attainment']):>7.1f}"
                f" {100 * float(r['tpot_attainment']):>7.1f} {r['failed']:>7}"
            )
    return "\n".join(lines)


def report_text(out_dir: Path, records: Sequence[Mapping[str, Any]]) -> str:
    """The attainment table, plus FluidPD against the baselines (also written to
    ``summary.txt``) when the runs include FluidPD."""
    text = format_table(records)
    if any(r["policy"] == "fluidpd" for r in records):
        summary = format_summary(summarize(records))
        (out_dir / "summary.txt").write_text(summary + "\n")
        text += "\n\nFluidPD against the baselines\n" + summary
    return text
