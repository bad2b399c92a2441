"""``fluidpd evaluate`` replays a slice on a live stack of its own: the live run must read the
router's ``/admin/stats`` (its role switches and stolen tokens), which takes the stack's admin
token. Without it the replay ran blind to them, and every live FluidPD run recorded 0 role
switches and 0 stolen tokens while its controller had switched twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_the_live_replay_reads_the_routers_stats(tmp_path: Path) -> None:
    out = tmp_path / "ev"
    argv = [sys.executable, "-m", "fluidpd.cli.main", "evaluate", "--workload", "azure-mixed"]
    argv += ["--rps", "4", "--num-requests", "12", "--pd", "1P1D", "--policies", "fluidpd"]
    done = subprocess.run(
        [*argv, "--no-sim", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run,) = json.loads((out / "live" / "results.json").read_text())["runs"]
    assert run["admin_stats"] is True
    assert run["completed"] == 12
