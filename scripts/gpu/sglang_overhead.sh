#!/bin/bash
# GPU command (carry: [".sglwhl/b"]) right after sglang_stage.sh twice on the same warm machine
# (carrying .sglwhl/a, then .sglwhl/mc): FluidPD-on-SGLang with stealing off vs plain SGLang P/D
# on the same two SGLang 0.5.17 servers (1P1D on GPU 0, Llama-3.1-8B shape, dummy weights, KV
# over Mooncake TCP), side by side: decode throughput, TTFT, TPOT and the fluidpd/plain ratios
# (scripts/gpu/sglang_overhead.py). About 3 min (start ~70-90 s with the carried JIT cache).
# Output (<= 8 files): $OUT/overhead.json, $OUT/logs.txt, $OUT/install.txt, $OUT/DONE.
set -uo pipefail
OUT=${OUT:-/tmp/out}
. scripts/gpu/sglang_env.sh
timeout 270 python3 scripts/gpu/sglang_overhead.py --out "$OUT" --python "$(command -v python3)" \
  --levels "${LEVELS:-1,8,32}" --rounds "${ROUNDS:-1}" --prompt "${PROMPT:-1024}" --new "${NEW:-128}" \
  --sidecar-arg=--sglang-arg=--context-length=16384 \
  --sidecar-arg=--sglang-arg=--disable-piecewise-cuda-graph \
  --start-timeout 200 || echo "overhead rc=$?"
echo DONE | tee "$OUT/DONE"
