#!/bin/bash
# Re-measures the shipped H200 profiles with the current grid, whose suffix points include an
# 8,192-token prefix (sp measured at long context, not extrapolated from 2K). GPU=h100 labels
# an H100's run as profiles of its own. On the device machine, with OUT set:
#   . scripts/gpu/setup.sh; GPU=h200 bash scripts/gpu/reprofile.sh
set -u
GPU=${GPU:-h200}
mkdir -p "$OUT/profile"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/profile/gpu.txt"
python3 -m fluidpd.cli.main profile --engine-model llama-3.1-8b --gpu $GPU \
  --out "$OUT/profile/llama-3.1-8b-$GPU.yaml" --report "$OUT/profile/profile-llama-3.1-8b-$GPU.json" \
  2>&1 | tee "$OUT/profile/llama-3.1-8b.log"
python3 -m fluidpd.cli.main profile --engine-model llama-3.2-1b --gpu $GPU --kv-tokens 135168 \
  --max-running 128 --context-limit 16384 \
  --out "$OUT/profile/llama-3.2-1b-$GPU.yaml" --report "$OUT/profile/profile-llama-3.2-1b-$GPU.json" \
  2>&1 | tee "$OUT/profile/llama-3.2-1b.log"
