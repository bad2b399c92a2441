"""``make test``'s distribution (conftest.py): under ``-n 3 --dist loadgroup`` each test module
runs whole on one worker, so its module fixtures (a live stack, SGLang servers) start once."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("tests/core/test_role_control.py", "tests/core/test_repair.py")


def test_each_module_runs_on_one_worker() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup",
         "--no-loadscope-reorder", "-v", "-p", "no:cacheprovider", *MODULES],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for gw, nodeid in re.findall(r"^\[(gw\d)\] \[ *\d+%\] PASSED (\S+)", out.stdout, re.M):
        workers[nodeid.split("::", 1)[0]].add(gw)
    assert set(workers) == set(MODULES), out.stdout[-3000:]
    assert all(len(gws) == 1 for gws in workers.values()), dict(workers)
