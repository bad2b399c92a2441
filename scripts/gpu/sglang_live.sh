#!/bin/bash
# GPU command (carry: [".sglwhl/b", ".sglwhl/slice"]) right after sglang_stage.sh twice on the
# same warm machine (.sglwhl/a, then .sglwhl/mc), or right after sglang_overhead.sh (then the
# wheels are installed already). Live 2P2D on GPU 0: four SGLang 0.5.17 servers under FluidPD's
# sidecars (Llama-3.1-8B shape, dummy weights, 65,536-token KV pool each, KV over Mooncake TCP),
# `fluidpd replay` of the Azure-mixed slice (.sglwhl/slice, made here by sglang_slice.py)
# against plain SGLang P/D (sglang_minilb.py) and FluidPD (router + controller), same servers.
# CUDA MPS: if nvidia-cuda-mps-control exists and a CUDA context (with a graph capture) works
# under it within 60 s, the workers run as MPS clients with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
# (MPS_P / MPS_D, default 50 each); otherwise without MPS (time-sliced), and live.json says
# which. About 7 min (three replays). Output (<= 8 files): $OUT/live.json, results.json,
# table.txt, logs.txt, install.txt, mps.txt, profile.yaml, DONE. RUNS (default "static
# fluidtoken fluidpd") picks the runs, WINDOW (default 4) the sidecars' --sglang-prefill-window,
# KV_TOKENS (default 65536) each worker's KV pool and MEM (default 0.8) its --mem-fraction-static
# (sglang_live.py checks that the four servers fit the card before it starts them); BATCHING=1
# gives the sidecars --sglang-prefill-batching; PAIRING (default round-robin) FluidPD's router's
# --pairing.
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/sglang_env.sh
SLICE=${SLICE:-.sglwhl/slice/azure-mixed-slice.csv}
[ -s "$SLICE" ] || { echo "sglang_live.sh: $SLICE missing (python scripts/gpu/sglang_slice.py here, carry .sglwhl/slice)"; exit 2; }
MPS_FLAG=()
mps_started=0
if [ "${MPS:-auto}" != 0 ] && command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/fluidpd-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/fluidpd-mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if timeout 20 nvidia-cuda-mps-control -d; then
    mps_started=1
    if CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 timeout 60 python3 -c '
import torch
x = torch.randn(1024, 1024, device="cuda")
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    y = x @ x
    with torch.cuda.graph(g):
        y = x @ x
g.replay(); torch.cuda.synchronize()
print("mps probe ok", torch.cuda.get_device_name(0), float(y.sum()))
' > "$OUT/mps.txt" 2>&1; then
      MPS_FLAG=(--mps --mps-prefill "${MPS_P:-50}" --mps-decode "${MPS_D:-50}")
    else
      echo "MPS probe failed: running without MPS" >> "$OUT/mps.txt"
      echo quit | timeout 20 nvidia-cuda-mps-control; mps_started=0
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
  else
    echo "nvidia-cuda-mps-control -d failed: running without MPS" > "$OUT/mps.txt"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
else
  echo "no MPS (MPS=${MPS:-auto}, nvidia-cuda-mps-control: $(command -v nvidia-cuda-mps-control || echo absent))" > "$OUT/mps.txt"
fi
cat "$OUT/mps.txt"
# The profile follows the card the run got (the device tool lends H100s and H200s).
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)" in
  *H100*) GPU=h100 ;;
  *) GPU=h200 ;;
esac
EXTRA=()
[ "${BATCHING:-0}" = 1 ] && EXTRA+=(--sidecar-arg=--sglang-prefill-batching)
timeout -k 20 540 python3 scripts/gpu/sglang_live.py --out "$OUT" --python "$(command -v python3)" \
  --slice "$SLICE" --rps "${RPS:-2.5}" --requests "${N:-100}" --ttft-slo "${TTFT_SLO:-2}" \
  --tpot-slo "${TPOT_SLO:-0.05}" --runs ${RUNS:-static fluidtoken fluidpd} \
  --prefill-window "${WINDOW:-4}" --pairing "${PAIRING:-round-robin}" \
  --kv-tokens "${KV_TOKENS:-65536}" --mem "${MEM:-0.8}" \
  --gpu "$GPU" "${MPS_FLAG[@]}" "${EXTRA[@]}" || echo "live rc=$?"
if [ "$mps_started" = 1 ]; then
  [ -d /tmp/fluidpd-mps/log ] && tail -n 20 /tmp/fluidpd-mps/log/control.log >> "$OUT/mps.txt" 2>/dev/null
  echo quit | timeout 20 nvidia-cuda-mps-control
fi
echo DONE | tee "$OUT/DONE"
