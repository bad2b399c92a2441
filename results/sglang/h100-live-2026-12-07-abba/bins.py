"""Mean TTFT (s) and requests within 2 s, per 5 s of arrivals, for each run of live.json's
per-request logs (fluidpd replay's DIR/requests/, kept by sglang_live.py).

    python bins.py [live.json]

Columns: the static runs, then the others, each kind in the order run.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def main() -> None:
    doc = json.loads(Path(sys.argv[1] if len(sys.argv) > 1 else "live.json").read_text())
    logs = {k.rsplit("_", 1)[-1]: v for k, v in doc["requests"].items()}
    runs = sorted(doc["runs"], key=lambda r: (not r.startswith("static"), r))
    ttft = {run: [r["ttft_ms"] for r in logs[run]] for run in runs}
    due = [r["scheduled_s"] for r in logs["static"]]
    tokens = [r["prompt_len"] for r in logs["static"]]
    print("arrivals   n  prompt tok  mean TTFT s: " + " ".join(f"{r:>12}" for r in runs)
          + "   within 2 s: " + " ".join(f"{r:>12}" for r in runs))  # fmt: skip
    for t0 in range(0, int(max(due)) + 5, 5):
        idx = [i for i, t in enumerate(due) if t0 <= t < t0 + 5]
        if not idx:
            continue
        means = [statistics.mean(ttft[r][i] for i in idx) / 1e3 for r in runs]
        met = [sum(ttft[r][i] < 2000 for i in idx) for r in runs]
        print(f"{t0:3d}-{t0 + 5:3d} s {len(idx):3d} {sum(tokens[i] for i in idx):11d}  "
              + "             " + " ".join(f"{m:12.1f}" for m in means)
              + "               " + " ".join(f"{m:12d}" for m in met))  # fmt: skip


if __name__ == "__main__":
    main()
