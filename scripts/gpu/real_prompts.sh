#!/bin/bash
# Issue 12 on the lent H200, one call (about 6 of its 10 minutes): real prompts through a live
# 2P2D stack of the gpu engine against transformers, then the engine bench before/after.
#   1. model:     the Llama-3.1-8B shape (vocab 128,256, the test tokenizer padded with reserved
#                 tokens), seeded weights written as a bf16 safetensors model directory by
#                 fluidpd.modeldir.synthetic.write_model on the GPU (generated here, not carried)
#   2. reference: transformers generate(do_sample=False), 32 new tokens, 4 prompts as chat and
#                 as completions, fp32 on the GPU (real_prompts.py says why fp32)
#   3. live:      fluidpd up --engine gpu --model-dir DIR --pd 2P2D --force-steal 0.5 (every
#                 prompt split: prefix on a prefill worker, suffix extend on a decode worker),
#                 four fp32 workers on the one GPU, shm hand-off; the 8 requests concurrently,
#                 greedy, ignore_eos, logprobs with return_tokens_as_token_ids; token ids
#                 compared (chat's also from each token's bytes), text, logprobs, usage; a
#                 seeded request twice. If the fp32 stack does not come up (memory), the
#                 step is redone in bf16 (and says so).
#   4. bench:     scripts/gpu/step_bench.py (8B shape, bf16, seeded weights: decode batch 32 at
#                 1K context, prefill 4K) for this tree and for OLD_TREE, alternating, twice each
# $OUT/real_prompts.json (every step's record, rewritten after each step, so a kill keeps what
# was done), $OUT/summary.txt, $OUT/logs.txt, $OUT/profile.yaml. Exit 0 when every comparison
# holds. SKIP_LIVE=1 / SKIP_BENCH=1 leave a part out; BENCH_ROUNDS (2), BETA (0.5).
#
# Usage (repository root on the GPU machine, OUT set, `.whl` carried as for the other scripts):
#   mkdir -p .oldtree && git archive <pre-change commit> worker-sidecar | tar -x -C .oldtree
#   OLD_TREE=.oldtree bash scripts/gpu/real_prompts.sh          # carry [".whl", ".oldtree"]
# Dry run on a CPU machine (tiny shape, the same steps; about 3 minutes on two cores):
#   OUT=/tmp/rp OLD_TREE=/tmp/oldtree PYTHON=.venv/bin/python bash scripts/gpu/real_prompts.sh --tiny
# (TINY_VOCAB=128256: the tiny shape with the 8B's padded tokenizer, the router's slow path.)
set -u
TINY=${1:-}
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
WORK=${WORK:-/tmp/real-prompts}
rm -rf "$WORK" && mkdir -p "$WORK"
PY=${PYTHON:-python3}
HERE=scripts/gpu/real_prompts.py
LOG=$OUT/logs.txt
: > "$LOG"
T0=$(date +%s)
if [ "$TINY" = "--tiny" ]; then
  export PYTHONPATH=$PWD:$PWD/worker-sidecar${PYTHONPATH:+:$PYTHONPATH}
  export OMP_NUM_THREADS=1
  DEVICE=cpu MODEL_DIR=$WORK/model ARENA=64 BENCH="--tiny" MODEL_ARGS="--tiny"
  [ -n "${TINY_VOCAB:-}" ] && MODEL_ARGS="--tiny --vocab $TINY_VOCAB"  # the 8B's 128256
else
  [ -n "${NO_SETUP:-}" ] || . scripts/gpu/setup.sh
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee -a "$LOG"
  DEVICE=cuda MODEL_DIR=${MODEL_DIR:-/tmp/fluidpd-llama-3.1-8b} ARENA=512 BENCH=""
  MODEL_ARGS="--device cuda"
fi
NEW=32
BETA=${BETA:-0.5}
PORT=${PORT:-8000}
step() { echo "== $1 (+$(( $(date +%s) - T0 )) s)" | tee -a "$LOG"; }
summary() { $PY $HERE summary --work "$WORK" --out "$OUT/real_prompts.json" > "$OUT/summary.txt" 2>&1; }
gpu_idle() {  # the workers' memory must be back before the next step
  [ "$DEVICE" = cpu ] && return 0
  for _ in $(seq 60); do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
    [ "${used:-0}" -lt 4000 ] && return 0
    sleep 1
  done
  echo "GPU memory still in use: ${used} MiB" | tee -a "$LOG"
}

reference() {  # $1: dtype
  timeout 240 $PY $HERE reference --model-dir "$MODEL_DIR" --device $DEVICE --dtype "$1" \
    --new $NEW --json "$WORK/reference.json" 2>&1 | grep -v -i "warn\|loading weights" | tail -5 >> "$LOG"
  gpu_idle
}

live() {  # $1: dtype; returns 1 if the stack did not come up
  local run=$WORK/up-$1 up
  local cmd="$PY -m fluidpd.cli.main up --engine gpu --model-dir $MODEL_DIR --device $DEVICE \
    --dtype $1 --profile $WORK/profile.yaml --kv-transfer shm --kv-arena-mib $ARENA \
    --pd 2P2D --policy fluidtoken --force-steal $BETA --port $PORT --run-dir $run --ready-timeout 300"
  echo "$cmd" | tr -s ' ' | tee -a "$LOG"
  $cmd > "$WORK/up-$1.log" 2>&1 &
  up=$!
  for _ in $(seq 300); do
    [ -s "$run/endpoint" ] && break
    kill -0 $up 2>/dev/null || break
    sleep 1
  done
  local came_up=0
  if [ -s "$run/endpoint" ]; then
    came_up=1
    step "stack up ($1)"
    timeout 180 $PY $HERE check --endpoint "http://127.0.0.1:$PORT" --model-dir "$MODEL_DIR" \
      --ref "$WORK/reference.json" --json "$WORK/check.json" 2>&1 | tail -3 | tee -a "$LOG"
    for p in $(seq $((PORT + 101)) $((PORT + 104))); do
      curl -s -m 5 "http://127.0.0.1:$p/pressure" >> "$LOG"; echo >> "$LOG"
    done
  else
    echo "the $1 stack did not come up" | tee -a "$LOG"
  fi
  kill -TERM $up 2>/dev/null; wait $up 2>/dev/null
  { echo "===== up-$1.log"; tail -n 20 "$WORK/up-$1.log"
    for f in "$run"/*.log; do echo "===== $f"; tail -n 30 "$f"; done; } >> "$LOG" 2>/dev/null
  grep -l Traceback "$run"/*.log 2>/dev/null | sed 's/^/TRACEBACK IN /' | tee -a "$LOG"
  gpu_idle
  [ $came_up = 1 ]
}

if [ -z "${SKIP_LIVE:-}" ]; then
  step model
  rm -rf "$MODEL_DIR"
  timeout 300 $PY $HERE model --out "$MODEL_DIR" $MODEL_ARGS --json "$WORK/model.json" 2>&1 | tail -5 >> "$LOG"
  ls -la "$MODEL_DIR" >> "$LOG" 2>&1
  gpu_idle
  summary
  step reference
  reference float32
  summary
  step live
  $PY $HERE profile --base results/gpu/live-8b-shared/llama-3.1-8b-h200-shared4.yaml \
    --out "$WORK/profile.yaml" --kv-tokens 4096 --context-limit 512 --max-running 16 \
    --json "$WORK/profile.json" >> "$LOG" 2>&1
  cp "$WORK/profile.yaml" "$OUT/profile.yaml"
  if ! live float32 && [ "$DEVICE" = cuda ]; then
    step "fallback: bf16 reference and stack"
    reference bfloat16
    live bfloat16
  fi
  summary
fi

if [ -z "${SKIP_BENCH:-}" ]; then
  step bench
  OLD=${OLD_TREE:-}
  [ -n "$OLD" ] && [ -d "$OLD/worker-sidecar" ] && OLD=$OLD/worker-sidecar
  for round in $(seq ${BENCH_ROUNDS:-2}); do
    timeout 120 $PY scripts/gpu/step_bench.py --label new $BENCH --out "$WORK/bench-$round-new.json" \
      >> "$LOG" 2>&1 || echo "bench new $round failed" | tee -a "$LOG"
    if [ -n "$OLD" ] && [ -d "$OLD/fluidpd_sidecar" ]; then
      PYTHONPATH=$OLD:$PYTHONPATH timeout 120 $PY scripts/gpu/step_bench.py --label old $BENCH \
        --out "$WORK/bench-$round-old.json" >> "$LOG" 2>&1 || echo "bench old $round failed" | tee -a "$LOG"
    else
      echo "no OLD_TREE with fluidpd_sidecar/ (or worker-sidecar/fluidpd_sidecar/): no old bench" | tee -a "$LOG"
    fi
    summary
  done
fi

step done
$PY $HERE summary --work "$WORK" --out "$OUT/real_prompts.json" | tee "$OUT/summary.txt"
status=${PIPESTATUS[0]}
ls -la "$OUT"
exit $status
