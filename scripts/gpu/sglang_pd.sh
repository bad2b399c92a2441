#!/bin/bash
# GPU command 3 of 3 (carry: [".sglwhl/b"]), right after sglang_stage.sh twice on the same warm
# machine (carrying .sglwhl/a, then .sglwhl/mc): installs the wheels into ~/sgl, unpacks the
# system libraries mooncake links (libibverbs, mlx5, libnuma) and the tvm-ffi JIT cache, then
# scripts/gpu/sglang_pd.py runs 1P1D through FluidPD's sidecars (--engine sglang, SGLang's own
# P/D with KV over Mooncake TCP) and router on GPU 0 (Llama-3.1-8B shape, dummy weights), and
# the same prompts on a plain SGLang server. Output: $OUT/sglang_pd.json, logs beside it.
set -euo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# The wheels into ~/sgl (once per warm machine), mooncake's libraries, PYTHONPATH.
. scripts/gpu/sglang_env.sh
timeout 500 python3 scripts/gpu/sglang_pd.py --out "$OUT" --python "$(command -v python3)" \
  --sidecar-arg=--sglang-arg=--context-length=16384 \
  --sidecar-arg=--sglang-arg=--disable-piecewise-cuda-graph \
  --plain-arg=--context-length=16384 --plain-arg=--disable-piecewise-cuda-graph \
  --start-timeout 240 || echo "pd rc=$?"
echo DONE | tee "$OUT/DONE"
