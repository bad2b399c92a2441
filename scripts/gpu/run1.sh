#!/bin/bash
# GPU call 1 (one H200, under 10 minutes): smoke check, engine benchmarks and split-prefill
# equivalence (scripts/gpu/bench.py), then `fluidpd profile` of the 8B shape and of the 1B
# shape used by the shared-GPU live deployment. Run from the repository root on the GPU
# machine with OUT set; every step writes its file under $OUT as it goes and a failed step
# does not stop the others. The results are copied into results/gpu/ (see its README).
set -x
. scripts/gpu/setup.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, triton, fluidpd_sidecar.gpu.engine as e, pydantic; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" || exit 1
python3 -c "import mooncake.engine; print('mooncake ok')" || echo "mooncake import failed"
# Smoke: tiny shape on the GPU, two processes, shm hand-off (seconds).
timeout 120 python3 -m fluidpd_sidecar.gpu.equivalence --shape tiny-llama --device cuda --dtype bfloat16 --prompt-len 64 > $OUT/smoke.json || echo "smoke failed"
timeout 240 python3 scripts/gpu/bench.py --out $OUT/bench.json 2>&1 | tail -40
timeout 150 python3 -m fluidpd.cli.main profile --engine-model llama-3.1-8b --gpu h200 \
  --out $OUT/llama-3.1-8b-h200.yaml --report $OUT/profile-llama-3.1-8b-h200.json 2>&1 | tail -5
# The live deployment runs 4 workers of the 1B shape on the one GPU: each gets 131072 KV tokens.
timeout 100 python3 -m fluidpd.cli.main profile --engine-model llama-3.2-1b --gpu h200 \
  --kv-tokens 135168 --max-running 128 --context-limit 16384 \
  --out $OUT/llama-3.2-1b-h200.yaml --report $OUT/profile-llama-3.2-1b-h200.json 2>&1 | tail -5
ls -la $OUT
