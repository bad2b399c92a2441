import functools, sys
import fluidpd.sim.robustness as R
from fluidpd.sim.simulator import SimConfig
R.SimConfig = functools.partial(SimConfig, pairing=sys.argv[1])
from fluidpd.cli.main import main
sys.exit(main(["sim", "--suite", "robustness", "--suite-size", "full", "--jobs", "2", "--quiet", "--seed", "0", "--out", sys.argv[2]]))
