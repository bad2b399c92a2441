#!/bin/bash
# Why the live 2P2D stack with --kv-transfer cuda-ipc showed a ~7x larger client TTFT than the
# shm runs of results/gpu/live-8b-shared (results/gpu/ipc-live-diag-2026-12-03/README.md).
# One device call, repository root = the shipped tree, OUT set:
#   RUNS="before:cuda-ipc:static before:shm:static after:cuda-ipc:static after:shm:static" \
#     bash scripts/gpu/ipc_diag.sh
# Each run is results/gpu/live-8b-shared's shape (four 8B workers time-slicing the one GPU, 2P2D,
# its profile, 4 GiB arenas, the first 300 azure-mixed requests at RPS req/s, TTFT 2 s / TPOT
# 100 ms), with cuda-ipc + drain migrate or shm + drain wait as in the earlier runs. TREE "after"
# is this tree; "before" runs the fluidpd/ and worker-sidecar/ packages shipped in .before/
# (another commit). Per run: 4 sequential probe requests before the replay (each decodes alone),
# every sidecar's GET /pressure each 0.5 s, two py-spy dumps of each sidecar during the replay,
# the router's and sidecars' /metrics after it, the decode traces of every request
# (FLUIDPD_DEBUG_LOGGERS=fluidpd.trace), and scripts/gpu/ipc_diag.py's summary; each run is packed
# into $OUT/<tree>-<policy>-<transport>.tgz as it ends, so a call cut short keeps what finished
# ($OUT: those, commands.txt and compare.txt: at most 7 files with four runs).
# A run starts only while LIMIT seconds (default 450) have not passed since the call began.
T0=$(date +%s)
set -x
[ -n "${NO_SETUP:-}" ] || . scripts/gpu/setup.sh
export FLUIDPD_ADMIN_TOKEN=${FLUIDPD_ADMIN_TOKEN:-gpu-run}
export FLUIDPD_TRACES_DIR=${FLUIDPD_TRACES_DIR:-$PWD/.gpudata/traces}
export FLUIDPD_DEBUG_LOGGERS=fluidpd.trace
# `python -m` would put the working directory (this tree) first on sys.path, before the
# "before" packages of PYTHONPATH: only PYTHONPATH, in every process the stack starts.
export PYTHONSAFEPATH=1
PROFILE=${PROFILE:-results/gpu/live-8b-shared/llama-3.1-8b-h200-shared4.yaml}
RPS=${RPS:-16}
N=${N:-300}
ENGINE=${ENGINE:-"--engine-model llama-3.1-8b --device cuda:0"}
ARENA_MIB=${ARENA_MIB:-4096}
DIAG=${DIAG:-/tmp/diag}
PORT=${PORT:-8000}
PORTS=$((PORT + 101)),$((PORT + 102)),$((PORT + 103)),$((PORT + 104))
PYSPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
mkdir -p $OUT $DIAG
nvidia-smi -L || true
{ echo "tree: $(cat TREE 2>/dev/null)"; nvidia-smi -L; } >> $OUT/commands.txt 2>&1
SIDECARS="w0 w1 w2 w3"

gpu_free() {
  command -v nvidia-smi > /dev/null || return
  for i in $(seq 30); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && return
    sleep 1
  done
}

run_one() {
  local TREE=$1 T=$2 POLICY=$3
  local NAME=$TREE-$POLICY-$T RUN=$DIAG/$TREE-$POLICY-$T DRAIN=wait PP
  [ $T = cuda-ipc ] && DRAIN=migrate
  if [ $TREE = before ]; then
    PP=/tmp/site:$PWD/.before:$PWD/.before/worker-sidecar
  else
    PP=/tmp/site:$PWD:$PWD/worker-sidecar
  fi
  local UP="up --engine gpu $ENGINE --profile $PROFILE \
--kv-transfer $T --kv-arena-mib $ARENA_MIB --pd 2P2D --policy $POLICY --port $PORT --run-dir $RUN \
--ready-timeout 300 --drain-mode $DRAIN --ttft-slo 2.0 --tpot-slo 0.1 --log-level info"
  echo "[$NAME] PYTHONPATH=$PP fluidpd $UP" >> $OUT/commands.txt
  local t_up=$(date +%s)
  PYTHONPATH=$PP python3 -m fluidpd.cli.main $UP > $RUN.log 2>&1 &
  local PID=$!
  for i in $(seq 150); do
    [ -s $RUN/endpoint ] && break
    kill -0 $PID 2>/dev/null || break
    sleep 1
  done
  if [ ! -s $RUN/endpoint ]; then
    echo "[$NAME] the stack did not come up" | tee -a $OUT/commands.txt
    kill -TERM $PID; wait $PID
    tar czf $OUT/$NAME.tgz -C $DIAG $NAME $NAME.log
    gpu_free
    return
  fi
  echo "[$NAME] up after $(( $(date +%s) - t_up )) s" | tee -a $OUT/commands.txt
  [ -s $DIAG/nvidia-smi.txt ] || { nvidia-smi > $DIAG/nvidia-smi.txt 2>&1; cp $DIAG/nvidia-smi.txt $RUN/; }
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv > $RUN/gpu-memory.txt 2>&1
  PYTHONPATH=$PP timeout 60 python3 scripts/gpu/ipc_diag.py probe --endpoint http://127.0.0.1:$PORT \
    --out $RUN/probe.json
  python3 scripts/gpu/ipc_diag.py poll --ports $PORTS --out $RUN/poll.jsonl &
  local POLL=$!
  (
    set +x
    for k in 1 2; do
      sleep $([ $k = 1 ] && echo 20 || echo 12)
      for w in $SIDECARS; do
        echo "===== $w dump $k $(date +%T.%N)"
        timeout 10 $PYSPY dump --nonblocking --pid $(cat $RUN/$w.pid) 2>&1 | head -150
      done
    done > $RUN/pyspy.txt 2>&1
  ) &
  local SPY=$!
  local REPLAY="replay --endpoint http://127.0.0.1:$PORT --workload azure-mixed --rps $RPS \
--num-requests $N --seed 0 --ttft-slo 2.0 --tpot-slo 0.1 --label $NAME --model-name llama-3.1-8b \
--gpu h200 --pd 2P2D --out $RUN/replay --quiet --no-plots --timeout 20"
  echo "[$NAME] fluidpd $REPLAY" >> $OUT/commands.txt
  PYTHONPATH=$PP timeout 110 python3 -m fluidpd.cli.main $REPLAY 2>&1 | tail -4
  python3 scripts/gpu/ipc_diag.py fetch $RUN --router $PORT --ports $PORTS
  kill $POLL $SPY 2>/dev/null
  wait $SPY 2>/dev/null
  kill -TERM $PID; wait $PID
  rm -rf $RUN/replay/timeseries $RUN/*.pid $RUN/admin-token* $RUN/token*
  python3 scripts/gpu/ipc_diag.py summarize $RUN > /dev/null
  grep -h -i -E "error|exception|traceback" $RUN/*.log | sort | uniq -c | sort -rn | head -10
  tar czf $OUT/$NAME.tgz -C $DIAG $NAME $NAME.log
  echo "[$NAME] done at +$(( $(date +%s) - T0 )) s" | tee -a $OUT/commands.txt
  gpu_free
}

for SPEC in ${RUNS:-before:cuda-ipc:static before:shm:static}; do
  if [ $(( $(date +%s) - T0 )) -gt ${LIMIT:-450} ]; then
    echo "[$SPEC] skipped: +$(( $(date +%s) - T0 )) s" | tee -a $OUT/commands.txt
    continue
  fi
  IFS=: read TREE T POLICY <<< "$SPEC"
  run_one $TREE $T $POLICY
done
set +x
python3 scripts/gpu/ipc_diag.py compare $DIAG/*/ | tee $OUT/compare.txt
ls -la $OUT
