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
sys.path[:0] = [os.path.join(R, "stress")]
from dataclasses import replace
import stress
from cell_bins import CELLS_PER_SEED
from fluidpd.core import fluidrole
from fluidpd.core.types import Role
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim import robustness as rb
from fluidpd.sim.simulator import simulate

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
if len(sys.argv) > 5:
    # A matrix cell on one of the suite's profiles, or on a profile file (the held-out set).
    size, fields = rb.SIZES["full"], sys.argv[5].split()
    if len(sys.argv) > 6:
        size = rb.on_profile_files(size, [sys.argv[6]])
        fields[1:1] = [rb.PROFILE_FILE + sys.argv[6], "file"]
    wl, m, g, slo, n, f = fields
    s = rb.setup_cell(rb.Cell(wl, (m, g), slo, int(n), float(f)), seed0, size)
    w, base = s.workload, s.base
else:
    cell = next(c for c in stress.cells(CELLS_PER_SEED[seed0], seed0) if c[0] == index)
    profile, slo, _, w = stress.cell_trace(cell)
    base = stress.base_config(cell, profile, slo)
simulate(w, replace(base, mechanisms=MECHANISMS["fluidpd"]))
