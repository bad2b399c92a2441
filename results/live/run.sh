#!/bin/sh
# Live-stack results (run from the repository root). Each command records itself in its JSON.
set -eu

# Live vs simulator on the same slice: 2,000 requests of azure-mixed at 20 req/s, 4P4D,
# static and FluidPD; the same profile, SLOs, seed and 5 % step-time noise in both.
fluidpd evaluate --workload azure-mixed --rps 20 --num-requests 2000 --pd 4P4D \
  --policies static,fluidpd --seed 0 --out results/live/azure-mixed-2000-20rps

# Long-context slice (issue #14): 240 requests of long-chat-poisson at 4 req/s, 4P4D (the
# live controller runs the paper rule: the router exports no demand forecast yet).
fluidpd evaluate --workload long-chat-poisson --rps 4 --num-requests 240 --pd 4P4D \
  --policies static,fluidpd --seed 0 --out results/live/long-chat-poisson-240-4rps

# 20 in-place role switches in both directions under load (wait and migrate drains).
fluidpd drill switches --pd 3P3D --switches 20 --rps 8 --out results/live/switch-drill.json

# SIGKILL of the busiest decode worker under load (FluidPD policy: the controller runs).
fluidpd drill kill --pd 3P3D --rps 8 --out results/live/kill-drill.json

# Router overhead against calling the sidecar pair directly, side by side, 200 req/s.
fluidpd drill router-overhead --rps 200 --duration 30 --out results/live/router-overhead.json
