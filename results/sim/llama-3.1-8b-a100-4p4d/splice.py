"""How this folder was assembled (issue #14, 2026-12-02; run from the repository root).

The sweep ran at commit a83f1ae into /tmp/wt14/headline (the command in run.json); its command
and wall times were moved from results.json to run.json. The FluidRole and FluidPD runs were
then rerun at commit d07f9fe (the busy-fraction calibration) into /tmp/wt14/headline-check and
spliced in here, in the sweep's order; static, FluidToken, the oracle and autoscale do not act
on the switch rule. The plots are redrawn from the result.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from fluidpd.sim.plots import write_plots
from fluidpd.sim.report import series_key
from fluidpd.sim.workloads import build_workload

DST = Path("results/sim/llama-3.1-8b-a100-4p4d")
CHECK = Path("/tmp/wt14/headline-check")


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def main() -> None:
    new = {series_key(r): r for r in load(CHECK / "results.json")["runs"]}
    check_run = load(CHECK / "run.json")
    new_wall = {(w["workload"], w["rps"], w["policy"]): w["wall_s"] for w in check_run["wall_s"]}
    doc, run = load(DST / "results.json"), load(DST / "run.json")
    assert sum(1 for r in doc["runs"] if series_key(r) in new) == len(new) == 28
    doc["runs"] = [new.get(series_key(r), r) for r in doc["runs"]]
    (DST / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    for w in run["wall_s"]:
        key = (w["workload"], w["rps"], w["policy"])
        w["wall_s"] = new_wall.get(key, w["wall_s"])
    run["note"] = (
        "static, fluidtoken, oracle, autoscale: run at commit a83f1ae (command above; the "
        "command and wall_s moved here from its results.json); fluidrole, fluidpd: rerun at "
        f"commit d07f9fe with {check_run['command']} and spliced in by splice.py (in this folder)"
    )
    (DST / "run.json").write_text(json.dumps(run, indent=1) + "\n")
    for f in (CHECK / "timeseries").glob("*_35rps_*.json"):
        shutil.copy(f, DST / "timeseries" / f.name)
    series = {}
    for f in (DST / "timeseries").glob("*.json"):
        workload, rps, policy = f.stem.split("_")
        series[(workload, float(rps.removesuffix("rps")), policy)] = load(f)
    edges = {}
    for workload in ("azure-mixed", "azure-staged"):
        w = build_workload(workload, 35.0, seed=0)
        edges[workload] = [float(w.arrivals[a]) for _, a, _ in w.windows[1:]]
    rates = {"azure-mixed": 35.0, "azure-staged": 35.0}
    for path in write_plots(DST, doc["runs"], series, 2.0, edges, rates):
        print("plot", path)


if __name__ == "__main__":
    main()
