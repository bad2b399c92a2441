"""One robustness-matrix cell (seed 0, or SEED) with a patch: OBS=1 obspatch.py, KVW=1 kvpatch.py

    PYTHONPATH=<tree> python mcell.py "WORKLOAD MODEL GPU SLO WORKERS FRACTION" ..."""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if os.environ.get("OBS"):
    import obspatch
if os.environ.get("KVW"):
    import kvpatch
from fluidpd.sim.robustness import Cell, run_cell, SIZES
for arg in sys.argv[1:]:
    wl, m, g, slo, n, f = arg.split()
    r = run_cell(Cell(wl, (m, g), slo, int(n), float(f)), int(os.environ.get("SEED", "0")), SIZES["full"])
    print(arg, "static %.1f fluidpd %.1f oracle %.1f sw %d" % (100*r["static"], 100*r["fluidpd"], 100*r["oracle"], r["switches"]),
          "")
