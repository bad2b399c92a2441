#!/bin/bash
# GPU call for issue #15 (one H200): (1) KV hand-off bandwidth and latency, CUDA IPC between
# two processes vs the shm path, at 1/64/512 MiB; (2) a D->P drain `migrate` of a decode
# worker holding 32 active requests at 2K context with real KV (8B, gpu engine, shm), its drain
# time and its outputs against an unmigrated run. Everything goes under $OUT.
set -x
[ -n "${NO_SETUP:-}" ] || . scripts/gpu/setup.sh
export FLUIDPD_ADMIN_TOKEN=${FLUIDPD_ADMIN_TOKEN:-gpu-run}
mkdir -p $OUT
nvidia-smi -L
timeout 120 python3 scripts/gpu/bench_kv_ipc.py --out $OUT/kv-ipc.json 2>&1 | tail -8
# Three 8B workers on one GPU: each gets a 100K-token KV pool (12.5 GiB) beside its weights.
sed "s/^  capacity_tokens: .*/  capacity_tokens: 100000/" profiles/llama-3.1-8b-h200.yaml \
  > $OUT/kv100k.yaml
timeout 420 python3 scripts/gpu/migrate_drain.py --out $OUT/migrate-drain.json -- \
  --engine gpu --engine-model llama-3.1-8b --device cuda:0 --profile $OUT/kv100k.yaml \
  --kv-transfer shm --kv-arena-mib 4096 --ready-timeout 300 2>&1 | tail -30
# One file for the logs (the machine returns a few files only).
tail -n 60 $OUT/migrate-drain-stack/*.log > $OUT/logs.txt 2>/dev/null
rm -rf $OUT/migrate-drain-stack
