"""FluidRole's state at every STEP-th control interval (default 2) from T0 to T1 s of one cell,
with the forecast of each direction (lb/la: loss before/after, net, saved/noise), the
arrivals' c_a^2, the decode pool's mean KV wait by Little's law (W) against the TTFT slack
(sl), and the decode calibration reading (obs):

    PYTHONPATH=<tree> python trail.py SEED CELL T0 T1                  # a stress cell
    PYTHONPATH=<tree> python trail.py SEED 0 T0 T1 "WORKLOAD MODEL GPU SLO WORKERS FRACTION"
    PYTHONPATH=<tree> python trail.py 0 0 T0 T1 "WORKLOAD SLO WORKERS FRACTION" PROFILE.yaml
"""
import os, sys
R = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [os.path.join(R, "tried-s26"), os.path.join(R, "stress")]
from dataclasses import replace
import stress
from cell_bins import CELLS_PER_SEED
from fluidpd.core import fluidrole
from fluidpd.core.types import Role
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import SimConfig, simulate

seed0, index, t0, t1 = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
STEP = int(os.environ.get("STEP", "2"))
orig = fluidrole.FluidRolePolicy.observe
def observe(self, now, workers, demand=None):
    out = orig(self, now, workers, demand)
    if t0 <= now <= t1 and int(now) % STEP == 0:
        p = self.last_pressure
        extra = ""
        if demand is not None and demand.reliable and self.model is not None:
            parts = []
            for src in (Role.DECODE, Role.PREFILL):
                f = self._forecast(now, p, demand, src)
                parts.append(f"{src.value[0]}:lb{f.loss_before:.3f} la{f.loss_after:.3f} net{f.net:.1f} B{f.before:.2f}/{f.after:.2f} don{f.donor_after:.2f} sv{f.saved:.0f}/nz{f.noise:.0f}")
            extra = " | ".join(parts)
            obs = round(self._decode_observed(now, demand.seen_s) or 0, 3)
            W = p.decode_waiting / (demand.rate / max(1, p.n_decode)) if demand.rate > 0 else 0
            extra += f" | cv2{demand.arrival_cv2:.2f} rate{demand.rate:.1f} pr{demand.prompt:.0f} out{demand.output:.0f} W{W:.2f} sl{self.model.slo.ttft - demand.prefill_s:.2f} obs{obs}"
        print(f"t={now:.0f} {p.n_prefill}P{p.n_decode}D ppi{p.ppi_bar:.2f} load{p.dpi_load_bar:.2f} adm{p.dpi_adm_bar:.2f} wait{p.decode_waiting:.1f} busy{p.prefill_busy} rec={self.last_recommendation} out={out} {extra}")
    return out
fluidrole.FluidRolePolicy.observe = observe
if len(sys.argv) > 6:
    from fluidpd.sim import robustness as rb
    path = sys.argv[6]
    wl, slo, n, f = sys.argv[5].split()
    size = rb.on_profile_files(rb.SIZES["full"], [path])
    s = rb.setup_cell(rb.Cell(wl, (rb.PROFILE_FILE + path, "file"), slo, int(n), float(f)), 0, size)
    simulate(s.workload, replace(s.base, mechanisms=MECHANISMS["fluidpd"]))
elif len(sys.argv) > 5:
    from fluidpd.sim.robustness import Cell, setup_cell, SIZES
    wl, m, g, slo, n, f = sys.argv[5].split()
    s = setup_cell(Cell(wl, (m, g), slo, int(n), float(f)), seed0, SIZES["full"])
    simulate(s.workload, replace(s.base, mechanisms=MECHANISMS["fluidpd"]))
else:
    cell = next(c for c in stress.cells(CELLS_PER_SEED[seed0], seed0) if c[0] == index)
    _, _, _, _, workers, pd, _, seed = cell
    profile, slo, _, w = stress.cell_trace(cell)
    cfg = replace(SimConfig(profile, slo, pd, workers - pd), noise=0.05, seed=seed, mechanisms=MECHANISMS["fluidpd"])
    simulate(w, cfg)
