"""CPU seconds of one 30,000-request replay (``fluidpd bench``'s set-up: 4P4D, 2 s / 100 ms,
engine noise 0.05) and the share of it spent in the simulator's control step (the workers'
signals, the demand window and the policies' ``observe``, the switch forecasts included):

    python control_share.py WORKLOAD RPS POLICY [POLICY ...]
"""

from __future__ import annotations

import sys
import time
from typing import Any

from fluidpd.cli.bench_cmd import bench_replay
from fluidpd.profiles import resolve_profile
from fluidpd.sim import simulator
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.workloads import WorkloadError

spent = [0.0]
step = simulator.Simulator._control


def timed_control(self: Any, *args: Any, **kwargs: Any) -> Any:
    t0 = time.process_time()
    try:
        return step(self, *args, **kwargs)
    finally:
        spent[0] += time.process_time() - t0


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit("usage: python control_share.py WORKLOAD RPS POLICY [POLICY ...]")
    simulator.Simulator._control = timed_control  # type: ignore[method-assign]
    try:
        rps = float(sys.argv[2])
    except ValueError:
        sys.exit(f"control_share.py: RPS: expected a number, got {sys.argv[2]!r}")
    if unknown := [p for p in sys.argv[3:] if p not in MECHANISMS]:
        sys.exit(
            f"control_share.py: POLICY: unknown {unknown[0]!r}; one of {', '.join(MECHANISMS)}"
        )
    profile = resolve_profile("llama-3.1-8b", "a100-80gb", None)
    for policy in sys.argv[3:]:
        spent[0] = 0.0
        try:
            r = bench_replay(profile, sys.argv[1], rps, "4P4D", policy, 1, 30000)
        except WorkloadError as e:
            sys.exit(f"control_share.py: WORKLOAD: {e}")
        cpu = r["cpu_s_min"]
        share = 100 * spent[0] / cpu
        print(f"{policy}: {cpu:.2f} CPU-s, control step {spent[0]:.2f} ({share:.0f} %)")


if __name__ == "__main__":
    main()
