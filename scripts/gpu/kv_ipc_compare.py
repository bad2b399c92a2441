"""Side by side: a live run with ``--kv-transfer cuda-ipc --drain-mode migrate`` (labels ending
in ``-cuda-ipc``) next to the committed shm + drain-wait runs of ``results/gpu/live-8b-shared``.

``python scripts/gpu/kv_ipc_compare.py NEW/results.json OUT.txt``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OLD = Path("results/gpu/live-8b-shared/results.json")


def main() -> None:
    new_path, out = Path(sys.argv[1]), Path(sys.argv[2])
    old = {(r["policy"], r["rps"]): r for r in json.loads(OLD.read_text())["runs"]}
    new = json.loads(new_path.read_text())["runs"] if new_path.exists() else []
    nan = float("nan")
    lines = [
        "rps  run                  attain%  TTFT mean ms  TPOT mean ms  failed  switches"
        "  | shm+wait attain%  TTFT mean ms"
    ]
    for r in sorted(new, key=lambda r: (r["rps"], r["policy"])):
        o = old.get((r["policy"].removesuffix("-cuda-ipc"), r["rps"]), {})
        sw = r.get("role_switches")
        sw = len(sw) if isinstance(sw, list) else sw
        lines.append(
            f"{r['rps']:4.0f} {r['policy']:20s} {100 * r['slo_attainment']:7.1f} "
            f"{r['mean_ttft_ms']:13.1f} {r['mean_tpot_ms']:13.1f} {r['failed']:7d} {sw!s:>9s}"
            f"  | {100 * o.get('slo_attainment', nan):16.1f} {o.get('mean_ttft_ms', nan):13.1f}"
        )
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
