"""Prints the decode pool at each FluidPD switch of one robustness-matrix cell (seed 0), with
the mean wait for decode KV by Little's law (requests waiting per worker / arrivals per worker):

    PYTHONPATH=<tree> python mprobe.py "WORKLOAD MODEL GPU SLO WORKERS FRACTION"
"""
import sys
from dataclasses import replace
from fluidpd.core import fluidrole
from fluidpd.sim.robustness import Cell, setup_cell, SIZES
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import simulate
orig = fluidrole.FluidRolePolicy._commit
def commit(self, now, workers, source, rec, pressure, forecast, demand, undo=False, shared=False):
    d = orig(self, now, workers, source, rec, pressure, forecast, demand, undo=undo, shared=shared)
    if d is not None:
        lam = demand.rate / pressure.n_decode if demand else float("nan")
        print(f"t={now:.1f} {rec} n={pressure.n_prefill}P{pressure.n_decode}D dpi_adm={pressure.dpi_adm_bar:.3f} waiting/worker={pressure.decode_waiting:.2f} rate/worker={lam:.2f} W_little={pressure.decode_waiting/lam if lam else 0:.2f}s prefill_s={demand.prefill_s if demand else 0:.3f} output={demand.output if demand else 0:.0f}")
    return d
fluidrole.FluidRolePolicy._commit = commit
wl, m, g, slo, n, f = sys.argv[1].split()
s = setup_cell(Cell(wl, (m, g), slo, int(n), float(f)), 0, SIZES["full"])
print("ttft", s.base.slo.ttft)
simulate(s.workload, replace(s.base, mechanisms=MECHANISMS["fluidpd"]))
