#!/bin/bash
# GPU command 3 of 3 (carry: [".sglwhl/b"]), right after sglang_stage.sh twice on the same warm
# machine (carrying .sglwhl/a, then .sglwhl/mc), as for sglang_pd.sh: installs the wheels into
# ~/sgl, unpacks the system libraries mooncake links and the tvm-ffi JIT cache, then
# scripts/gpu/sglang_switch.py runs `fluidpd up --engine sglang --pd 2P1D` on GPU 0 (three
# SGLang 0.5.17 servers, Llama-3.1-8B shape, dummy weights, KV pool capped at 100k tokens each)
# and switches roles in place under load: w1 P->D, w2 D->P, w2 P->D, w1 D->P. Checks pid
# unchanged, no restart, weights loaded once, 0 requests lost, greedy text equal to the
# pre-switch reference; times each switch. Output: $OUT/sglang_switch.json (written after each
# phase), $OUT/run/ (fluidpd and SGLang logs), $OUT/DONE.
set -euo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# The wheels into ~/sgl (once per warm machine), mooncake's libraries, PYTHONPATH.
. scripts/gpu/sglang_env.sh
# Decode CUDA graphs are captured at start (every worker starts as the decode superset);
# prefill piecewise graphs stay off as in sglang_pd.sh.
timeout 540 python3 scripts/gpu/sglang_switch.py --out "$OUT" --python "$(command -v python3)" \
  --up-arg=--sglang-arg=--context-length=16384 \
  --up-arg=--sglang-arg=--disable-piecewise-cuda-graph \
  --start-timeout 300 || echo "switch rc=$?"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1 || true
echo DONE | tee "$OUT/DONE"
