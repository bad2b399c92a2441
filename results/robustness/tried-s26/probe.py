"""Prints FluidRole's forecast at each committed switch of one stress cell:

    PYTHONPATH=<tree> python probe.py SEED CELL    (KVW=1: with kvpatch.py, rule B)

run from this folder (it reads ../stress/stress.py and cell_bins.py)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "stress")]
if os.environ.get("KVW"):
    import kvpatch  # noqa: F401
from dataclasses import replace, asdict
import stress
from cell_bins import CELLS_PER_SEED
from fluidpd.core import fluidrole
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import simulate

orig = fluidrole.FluidRolePolicy._commit
def commit(self, now, workers, source, rec, pressure, forecast, demand, shared=False):
    d = orig(self, now, workers, source, rec, pressure, forecast, demand, shared=shared)
    if d is not None:
        print(f"t={now:.1f} {rec} pressure={pressure}")
        if demand is not None:
            print("demand", {k: v for k, v in vars(demand).items() if not k.startswith('_')} if hasattr(demand,'__dict__') else demand)
        if forecast is not None:
            print("forecast", {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(forecast).items()})
            print("saved", forecast.saved, "noise", forecast.noise, "net", forecast.net)
    return d
fluidrole.FluidRolePolicy._commit = commit
seed0, index = int(sys.argv[1]), int(sys.argv[2])
cell = next(c for c in stress.cells(CELLS_PER_SEED[seed0], seed0) if c[0] == index)
profile, slo, _, w = stress.cell_trace(cell)
simulate(w, replace(stress.base_config(cell, profile, slo), mechanisms=MECHANISMS["fluidpd"]))
