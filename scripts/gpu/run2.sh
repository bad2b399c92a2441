#!/bin/bash
# GPU call (final code): transformers reference check, engine benchmarks and equivalence
# (bench.py), `fluidpd profile` of the 8B shape, then the live deployment (live.sh) at the
# given rates with N requests each. Usage: N=1000 bash scripts/gpu/run2.sh RPS [RPS...]
set -x
. scripts/gpu/setup.sh
timeout 100 python3 scripts/gpu/hf_check.py --out $OUT/hf_check.json 2>&1 | tail -30
timeout 150 python3 scripts/gpu/bench.py --out $OUT/bench.json 2>&1 | grep "=="
timeout 120 python3 -m fluidpd.cli.main profile --engine-model llama-3.1-8b --gpu h200 \
  --out $OUT/llama-3.1-8b-h200.yaml --report $OUT/profile-llama-3.1-8b-h200.json 2>&1 | tail -3
NO_SETUP=1 bash scripts/gpu/live.sh "$@"
