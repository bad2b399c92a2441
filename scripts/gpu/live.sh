#!/bin/bash
# GPU call: a live mini deployment on the one H200 and `fluidpd replay` of an Azure-mixed
# slice against the static split and FluidPD. Four worker sidecars (2P2D) of the
# Llama-3.2-1B shape share the GPU (separate processes, time-sliced), each with its own KV
# pool of 135168 tokens; KV hand-off through the shm transport (pinned host memory); router
# and (FluidPD) controller as in `fluidpd up`. SLOs are scaled to the 1B model on an H200:
# TTFT 0.25 s, TPOT 25 ms. D->P drains wait (the gpu engine does not migrate KV). The traces travel in .gpudata/traces (the machine has no network).
# Usage (repository root, OUT set): bash scripts/gpu/live.sh RPS [RPS...]
set -x
[ -n "${NO_SETUP:-}" ] || . scripts/gpu/setup.sh
export FLUIDPD_TRACES_DIR=${FLUIDPD_TRACES_DIR:-$PWD/.gpudata/traces}
MODEL=${MODEL:-llama-3.2-1b}
ENGINE="--engine gpu --engine-model $MODEL --device ${DEVICE:-cuda} --dtype ${DTYPE:-bfloat16}"
SLO="--ttft-slo 0.25 --tpot-slo 0.025"
N=${N:-2000}
PROFILE=${PROFILE:-profiles/llama-3.2-1b-h200.yaml}
if [ -n "${REPROFILE:-}" ]; then
  timeout 180 python3 -m fluidpd.cli.main profile --engine-model llama-3.2-1b --gpu h200 \
    --kv-tokens 135168 --max-running 128 --context-limit 16384 --max-mre 1 \
    --out $OUT/llama-3.2-1b-h200.yaml --report $OUT/profile-llama-3.2-1b-h200.json 2>&1 | tail -3
  [ -s $OUT/llama-3.2-1b-h200.yaml ] && PROFILE=$OUT/llama-3.2-1b-h200.yaml
fi
# One token for up and replay: the router's /admin/stats (role switches in the results) takes it.
export FLUIDPD_ADMIN_TOKEN=${FLUIDPD_ADMIN_TOKEN:-gpu-run}
df -h /dev/shm | tail -1
for RPS in "$@"; do
  for POLICY in static fluidpd; do
    RUN=/tmp/up-$POLICY-$RPS
    python3 -m fluidpd.cli.main up $ENGINE --profile $PROFILE \
      --kv-transfer shm --kv-arena-mib ${ARENA_MIB:-5120} --pd 2P2D --policy $POLICY --port 8000 \
      --run-dir $RUN --ready-timeout 150 --drain-mode wait $SLO > $RUN.log 2>&1 &
    UP=$!
    for i in $(seq 150); do [ -s $RUN/endpoint ] && break; sleep 1; done
    cat $RUN.log
    timeout 200 python3 -m fluidpd.cli.main replay --endpoint http://127.0.0.1:8000 \
      --workload azure-mixed --rps $RPS --num-requests $N --seed 0 --context-limit 16384 $SLO \
      --label $POLICY --model-name $MODEL --gpu h200 --pd 2P2D --out $OUT/live \
      --quiet --no-plots 2>&1 | tail -4
    for p in 8101 8102 8103 8104; do curl -s -m 2 http://127.0.0.1:$p/pressure; echo; done > $RUN/pressure.txt
    kill -TERM $UP; wait $UP
    grep -h -i -E "error|exception|switch" $RUN/*.log | sort | uniq -c | sort -rn | head -20
    # One file for all logs: the machine returns at most 8 files.
    echo "===== $POLICY $RPS req/s" >> $OUT/logs.txt
    tail -n 100 $RUN/w*.log $RUN/controller.log 2>/dev/null >> $OUT/logs.txt
    cat $RUN/pressure.txt >> $OUT/logs.txt
  done
done
rm -rf $OUT/live/timeseries $OUT/live/summary.txt
ls -la $OUT $OUT/live
