#!/bin/sh
# Regenerates every simulator result under results/sim (run from the repository root:
# `make results`). Each output directory also records its exact command in command.txt.
set -eu

# Paper setting (§V): Llama-3.1-8B on A100-80GB, 8 workers starting 4P4D, TTFT 2 s / TPOT 100 ms,
# both Azure workloads, a sweep of rates, every policy.
fluidpd sim --model llama-3.1-8b --gpu a100-80gb --workload azure-mixed,azure-staged \
  --rps 10,15,20,25,30,35,40 --pd 4P4D --ttft-slo 2.0 --tpot-slo 0.1 --policy all --seed 0 \
  --timeseries-rps 35 --series-json plotted --quiet --out results/sim/llama-3.1-8b-a100-4p4d

# Paper's autoscaling comparison (§V-B, Fig. 9c): start 3P3D; FluidPD stays on 6 GPUs, the
# Dynamo-like autoscaler may grow to 8 (5 s detection + 200 s provisioning).
fluidpd sim --model llama-3.1-8b --gpu a100-80gb --workload azure-mixed,azure-staged \
  --rps 10,15,20,25 --pd 3P3D --policy static,fluidpd,autoscale --autoscale-max-workers 8 \
  --seed 0 --timeseries-rps 20 --series-json plotted --quiet --out results/sim/llama-3.1-8b-a100-3p3d-autoscale

# The other two models of the paper, with its per-model TTFT targets.
fluidpd sim --model qwen3-14b --gpu a100-80gb --workload azure-mixed,azure-staged \
  --rps 5,10,15,20,25 --pd 4P4D --ttft-slo 3.0 --tpot-slo 0.1 --policy all --seed 0 \
  --timeseries-rps 15 --series-json plotted --quiet --out results/sim/qwen3-14b-a100-4p4d
fluidpd sim --model qwen3-30b-a3b --gpu a100-80gb --workload azure-mixed,azure-staged \
  --rps 5,10,15,20,25 --pd 4P4D --ttft-slo 1.0 --tpot-slo 0.1 --policy all --seed 0 \
  --timeseries-rps 15 --series-json plotted --quiet --out results/sim/qwen3-30b-a3b-a100-4p4d

# Paper-faithful FluidRole settings for comparison: drain mode "wait", no reversal cooldown.
fluidpd sim --workload azure-mixed,azure-staged --rps 10,15,20,25,30,35,40 \
  --policy fluidrole,fluidpd --drain-mode wait --reversal-cooldown 0 --seed 0 \
  --timeseries-rps 35 --series-json plotted --quiet --out results/sim/llama-3.1-8b-a100-4p4d-paper-drain

# Online recalibration: the engine runs 1.3x and 2x slower than its profile says; offline
# predictors versus recalibrated ones (results.json's predictor_mre shows the prediction error).
for drift in 1.3 2.0; do
  fluidpd sim --workload azure-mixed,azure-staged --rps 10,15,20,25 --policy static,fluidpd \
    --drift $drift --seed 0 --timeseries-rps 15 --series-json plotted --quiet --out results/sim/drift-$drift-offline
  fluidpd sim --workload azure-mixed,azure-staged --rps 10,15,20,25 --policy static,fluidpd \
    --drift $drift --adaptive --seed 0 --timeseries-rps 15 --series-json plotted --quiet \
    --out results/sim/drift-$drift-adaptive
done

# FluidToken with eq. 17's even split of a decode worker's budget among the prefill workers
# (the paper's; the default advertises the whole budget, every commit counted against it).
fluidpd sim --workload azure-mixed,azure-staged --rps 10,15,20,25,30,35,40 --pd 4P4D \
  --policy fluidtoken,fluidpd --token-split-budget --seed 0 --timeseries-rps 40 \
  --series-json plotted --quiet --out results/sim/llama-3.1-8b-a100-4p4d-split-budget

# Control-iteration latency and whole-replay speed.
fluidpd bench --out results/bench
