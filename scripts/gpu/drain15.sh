#!/bin/bash
# Issue #15 on one H200 after the pull migration (the target reads a migrated request's KV in the
# source's staging slot; exports and loads batched). Two calls, each under 5 min (repository
# root, OUT set, carry [".whl", ".gpudata"] from `bash scripts/gpu/prepare.sh`):
#   bash scripts/gpu/drain15.sh drain   # D->P drain `migrate` of decode worker w1 holding 32 active
#                                       # 2K-context requests (8B shape, 1P2D, 512 outputs each),
#                                       # over cuda-ipc, then over shm: drain time, the sidecar's
#                                       # phases (GET /role last_drain) and every output against
#                                       # an unmigrated run of the same stack
#   bash scripts/gpu/drain15.sh live    # results/gpu/live-8b-shared's 2P2D comparison, static vs
#                                       # FluidPD, --kv-transfer cuda-ipc --drain-mode migrate,
#                                       # 4 GiB GPU arenas (scripts/gpu/kv_ipc_live.sh 2)
# JSON is written as each part ends, so a call cut short keeps what it finished.
# The CPU dry run of `drain` (tiny engine, shm only):
#   NO_SETUP=1 TRANSPORTS=shm OUT=/tmp/d15 ENGINE="--engine-model tiny-llama --device cpu \
#     --dtype float32" PROFILE=results/drills/tiny-gpu-profile.yaml SHM_MIB=16 \
#     SIZE="--active 8 --prompt-len 512 --max-tokens 128 --model serving-path" \
#     bash scripts/gpu/drain15.sh drain
set -x
[ -n "${NO_SETUP:-}" ] || . scripts/gpu/setup.sh
export FLUIDPD_ADMIN_TOKEN=${FLUIDPD_ADMIN_TOKEN:-gpu-run}
mkdir -p $OUT
nvidia-smi -L 2>/dev/null
git log -1 --format='%H %s' > $OUT/commit.txt 2>/dev/null || true
if [ "${1:-drain}" = drain ]; then
  # w2 must hold w1's 32 requests beside its own 32 (64 x (2048 + 512) = 164K tokens): 170K-token
  # pools (21 GiB each, three workers on the GPU). Arenas: cuda-ipc 3 GiB of GPU memory (w1 stages
  # its 32 x 270 MiB in about three rounds; the target needs none now), shm 4 GiB of host memory.
  if [ -z "${PROFILE:-}" ]; then
    sed "s/^  capacity_tokens: .*/  capacity_tokens: 170000/" profiles/llama-3.1-8b-h200.yaml \
      > $OUT/kv170k.yaml
    PROFILE=$OUT/kv170k.yaml
  fi
  ENGINE=${ENGINE:-"--engine-model llama-3.1-8b --device cuda:0"}
  SIZE=${SIZE:-"--active 32 --prompt-len 2048 --max-tokens 512"}
  for T in ${TRANSPORTS:-cuda-ipc shm}; do
    MIB=${SHM_MIB:-4096}
    [ $T = cuda-ipc ] && MIB=${IPC_MIB:-3072}
    timeout ${DRAIN_TIMEOUT:-140} python3 scripts/gpu/migrate_drain.py $SIZE --no-control \
      --out $OUT/migrate-drain-$T.json -- --engine gpu $ENGINE --profile $PROFILE \
      --kv-transfer $T --kv-arena-mib $MIB --ready-timeout 300 --log-level info 2>&1 | tail -45
    {
      echo "===== $T"
      grep -h "drain migrate\|switch .* done\|Error\|error" $OUT/migrate-drain-stack/*.log | tail -40
      echo "refused adoptions: $(grep -c "migration of .* refused" $OUT/migrate-drain-stack/w1.log)"
      grep -h "migration of .* refused" $OUT/migrate-drain-stack/w1.log | head -3
      grep -h "migrated to" $OUT/migrate-drain-stack/w1.log | head -3
      grep -h "migrated to" $OUT/migrate-drain-stack/w1.log | tail -3
    } >> $OUT/drain-logs.txt 2>/dev/null
    rm -rf $OUT/migrate-drain-stack
    # GPU memory is returned a moment after the processes exit.
    for i in $(seq 20); do
      [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && break
      sleep 1
    done
  done
  python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
for f in sorted(Path(sys.argv[1]).glob("migrate-drain-*.json")):
    d = json.loads(f.read_text())
    sw, ph = d.get("switch", {}), d.get("switch", {}).get("phases") or {}
    eq = d.get("migrated_vs_reference", {})
    print(f"{f.stem}: active {sw.get('active_at_switch')}, drain {sw.get('drain_s')} s, last taken "
          f"over {ph.get('last_activated_s')} s, moved {ph.get('moved')}, rounds {ph.get('rounds')}, "
          f"refused {ph.get('refused')}, equal {eq.get('equal')}/{eq.get('of')}, "
          f"errors {eq.get('n_errors')}, progress {d.get('progress')}")
EOF
else
  NO_SETUP=1 bash scripts/gpu/kv_ipc_live.sh 2
fi
ls -la $OUT
