#!/bin/bash
# The GPU-machine commands (one H200, repository root, .whl and .gpudata carried; see
# results/gpu/README.md) that wrote this folder on 2026-12-01, after commit 8a8de6f (hand-offs
# wait for arena room). Four 8B workers (2P2D) share cuda:0, each with a 98,304-token KV pool.
# 1) static and FluidPD (the paper's thresholds), with the simulator and compare steps:
export WORKERS=4 PROFILE=results/gpu/live-8b-shared/llama-3.1-8b-h200-shared4.yaml \
  WORKLOADS=azure-mixed RATES="12 16" N_MIXED=300 RUN_TIMEOUT=105 REPLAY_ARGS="--timeout 20" \
  ARENA_MIB=4096
bash scripts/gpu/paper_scale.sh > $OUT/run-log.txt 2>&1
# 2) ablations (a new machine, same exports): FluidToken alone; FluidPD with DPI_adm^high = 1.0
. scripts/gpu/setup.sh; export NO_SETUP=1 NO_SIM=1
POLICIES=fluidtoken bash scripts/gpu/paper_scale.sh
POLICIES=fluidpd UP_ARGS="--dpi-adm-high 1.0" LABEL_SUFFIX=-adm1 bash scripts/gpu/paper_scale.sh
# 3) FluidPD again (the controller now logs the pressure behind each switch: switches.txt):
POLICIES=fluidpd LABEL_SUFFIX=-rerun bash scripts/gpu/paper_scale.sh
# The live/results.json of the three calls are merged into results.json here.
