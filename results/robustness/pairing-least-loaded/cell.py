import functools, sys
import fluidpd.sim.robustness as R
from fluidpd.sim.simulator import SimConfig
R.SimConfig = functools.partial(SimConfig, pairing=sys.argv[1])
from fluidpd.sim.robustness import Cell, cell_timeseries, SIZES
print(cell_timeseries(Cell(sys.argv[2], (sys.argv[3], sys.argv[4]), sys.argv[5], int(sys.argv[6]), float(sys.argv[7])), 0, SIZES['full'], float(sys.argv[8])))
