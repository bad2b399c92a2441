#!/bin/bash
# Issue #15 part 3 on one H200: the sidecar's `--kv-transfer cuda-ipc` transport, measured.
# Two calls (each well under 540 s; repository root, OUT set, .whl carried as for the other
# scripts/gpu runs: `bash scripts/gpu/prepare.sh` here first, carry [".whl", ".gpudata"]):
#   bash scripts/gpu/kv_ipc_live.sh 1   # (a) hand-off bandwidth/latency at 1/64/512 MiB, cuda-ipc
#                                       #     vs shm, and a SIGKILLed peer's GPU memory coming back;
#                                       # (b) D->P drain `migrate` of a decode worker holding 32
#                                       #     active 2K-context requests (8B, gpu engine, cuda-ipc):
#                                       #     drain time, outputs vs an unmigrated run
#   bash scripts/gpu/kv_ipc_live.sh 2   # (c) results/gpu/live-8b-shared's 2P2D comparison again,
#                                       #     static vs FluidPD, with cuda-ipc and drain migrate
# Everything goes under $OUT (JSON written as each part ends: a call cut short keeps its parts).
set -x
[ -n "${NO_SETUP:-}" ] || . scripts/gpu/setup.sh
export FLUIDPD_ADMIN_TOKEN=${FLUIDPD_ADMIN_TOKEN:-gpu-run}
mkdir -p $OUT
nvidia-smi -L
git log -1 --format='%H %s' > $OUT/commit.txt 2>/dev/null || true
if [ "${1:-1}" = 1 ]; then
  # (a) ~1 min: two processes per transport, the transport classes the sidecars run.
  timeout 150 python3 scripts/gpu/kv_ipc_live.py bench --out $OUT/kv-ipc-live.json 2>&1 | tail -12
  # (b) Three 8B workers (1P2D) on the GPU. The target w2 must have KV room for w1's 32 requests
  # beside its own 32 (64 x (2048 + 512) = 164K tokens), or the drain waits for w2's requests to
  # finish instead of measuring the hand-off (what bounded the 5.6 s shm drains of
  # results/gpu/kv-ipc-migrate-2026-12-02, whose target had 100K tokens for 64 x 2.5K): a
  # 170K-token pool each (21 GiB), 3 GiB GPU arenas (a 16K-token request is 2 GiB of KV).
  # 512 output tokens, not 256: with 256 (2026-12-02, 05:10) w1 peaked at 21 active, its
  # requests ending faster than the one prefill worker (~165 ms a 2K prompt) fed it.
  sed "s/^  capacity_tokens: .*/  capacity_tokens: 170000/" profiles/llama-3.1-8b-h200.yaml \
    > $OUT/kv170k.yaml
  timeout ${DRAIN_TIMEOUT:-400} python3 scripts/gpu/migrate_drain.py --max-tokens 512 \
    --out $OUT/migrate-drain-cuda-ipc.json ${DRAIN_ARGS:-} -- \
    --engine gpu --engine-model llama-3.1-8b --device cuda:0 --profile $OUT/kv170k.yaml \
    --kv-transfer cuda-ipc --kv-arena-mib 3072 --ready-timeout 300 --log-level info 2>&1 | tail -40
  grep -h "migrated to\|switch .* done\|cuda-ipc\|Error\|error" $OUT/migrate-drain-stack/*.log \
    | tail -n 120 > $OUT/drain-logs.txt 2>/dev/null
  tail -n 30 $OUT/migrate-drain-stack/*.log >> $OUT/drain-logs.txt 2>/dev/null
  rm -rf $OUT/migrate-drain-stack
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv >> $OUT/drain-logs.txt
else
  # (c) The 2P2D shape of results/gpu/live-8b-shared (four 8B workers on the GPU, its profile,
  # azure-mixed, 300 requests), one rate by default (16 req/s, where FluidPD fell furthest
  # behind static with shm and drain wait), with cuda-ipc and drain migrate. GPU arenas of
  # 4 GiB, as the shm runs' host arenas: with 3 GiB (2026-12-02, 05:15) static fell from 96.3 %
  # to 42.3 % (TTFT 475 -> 3216 ms, TPOT 24.7 -> 10.4 ms), most likely reservations waiting
  # for arena room (FIFO: one long prompt holds up those behind it), see
  # results/gpu/kv-ipc-live-2026-12-02/README.md.
  export WORKERS=4 PROFILE=results/gpu/live-8b-shared/llama-3.1-8b-h200-shared4.yaml \
    WORKLOADS=azure-mixed RATES="${RATES:-16}" N_MIXED=300 RUN_TIMEOUT=${RUN_TIMEOUT:-105} \
    REPLAY_ARGS="--timeout 20" ARENA_MIB=${ARENA_MIB:-4096} NO_SIM=1 NO_SETUP=1 \
    UP_ARGS="--kv-transfer cuda-ipc --drain-mode migrate" LABEL_SUFFIX=-cuda-ipc
  bash scripts/gpu/paper_scale.sh > $OUT/run-log.txt 2>&1
  tail -n 30 $OUT/run-log.txt
  python3 scripts/gpu/kv_ipc_compare.py $OUT/live/results.json $OUT/compare-cuda-ipc.txt
fi
ls -la $OUT
