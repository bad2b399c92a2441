"""The slice of these runs in the simulator (this folder's profile: the H100 8B shape with the
live runs' 16,384-token pools, 2P2D, 1.5 req/s, TTFT 2 s / TPOT 50 ms), static and FluidToken
under each P/D pairing: round-robin (FluidPD's router in the live runs), least-loaded, and
random (SGLang's mini_lb, the live static runs) over SEEDS draws.

    python pairing_sim.py SLICE_CSV [SEEDS]     # SLICE_CSV: .sglwhl/slice/azure-mixed-slice.csv
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def attainment(slice_csv: str, pairing: str, seed: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [
                sys.executable, "-m", "fluidpd.cli.main", "sim",
                "--profile", str(HERE / "abba" / "profile.yaml"), "--pd", "2P2D",
                "--pairing", pairing, "--seed", str(seed), "--workload", slice_csv,
                "--rps", "1.5", "--num-requests", "100", "--ttft-slo", "2", "--tpot-slo", "0.05",
                "--policy", "static,fluidtoken", "--out", out, "--no-plots", "--quiet",
            ],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        runs = json.loads((Path(out) / "results.json").read_text())["runs"]
    return {r["policy"]: 100 * r["slo_attainment"] for r in runs}


def main() -> None:
    slice_csv = sys.argv[1]
    seeds = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    for pairing in ("round-robin", "least-loaded"):
        a = attainment(slice_csv, pairing, 0)
        print(f"{pairing:13s} static {a['static']:5.1f} %  fluidtoken {a['fluidtoken']:5.1f} %")
    draws = [attainment(slice_csv, "random", s) for s in range(seeds)]
    for policy in ("static", "fluidtoken"):
        v = sorted(d[policy] for d in draws)
        print(
            f"random, {seeds} seeds, {policy}: mean {statistics.mean(v):.1f} %, sd "
            f"{statistics.stdev(v):.1f}, min {v[0]:.1f}, median {statistics.median(v):.1f}, "
            f"max {v[-1]:.1f}"
        )


if __name__ == "__main__":
    main()
