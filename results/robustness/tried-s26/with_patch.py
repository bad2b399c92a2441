"""Runs the fluidpd CLI, or a stress draw, with one of this folder's patches imported:

    PYTHONPATH=<tree> python with_patch.py obspatch sim --suite robustness --suite-size full \
        --jobs 2 --quiet --seed 0 --out DIR
    PYTHONPATH=<tree> python with_patch.py kvpatch --stress 150 20 seed20.jsonl

(the patches replace methods of the simulator and the core; worker processes inherit them)."""

import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "stress")]

importlib.import_module(sys.argv[1])
if sys.argv[2] == "--stress":
    import stress

    sys.argv = ["stress.py", *sys.argv[3:]]
    stress.main()
else:
    from fluidpd.cli.main import main

    sys.exit(main(sys.argv[2:]))
