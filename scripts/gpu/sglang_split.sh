#!/bin/bash
# GPU command 3 of 3 (carry: [".sglwhl/b"]), right after sglang_stage.sh twice on the same warm
# machine (carrying .sglwhl/a, then .sglwhl/mc), exactly like sglang_pd.sh: installs the wheels
# into ~/sgl, unpacks the system libraries mooncake links and the tvm-ffi JIT cache, then
# scripts/gpu/sglang_split.py checks FluidToken's split on SGLang: for beta in {0, 0.1, 0.5,
# 0.9, 1} and prompts of 37/300/1000 tokens, prefix on a prefill server + suffix extend on a
# decode server (separate SGLang processes on GPU 0, Llama-3.1-8B shape, --load-format dummy,
# KV over SGLang's Mooncake TCP) against a plain SGLang server, 32 greedy tokens each.
# Output: $OUT/sglang_split.json (written after every step), server logs beside it.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# The wheels into ~/sgl (once per warm machine), mooncake's libraries, PYTHONPATH.
. scripts/gpu/sglang_env.sh
# page size 1 is what the suffix extend needs (fluidtoken_hook.py); the decode server runs the
# non-overlap loop (sglang_split.py adds --disable-overlap-schedule to it).
timeout 330 python3 scripts/gpu/sglang_split.py --out "$OUT" --python "$(command -v python3)" \
  --context-length 16384 --sglang-arg=--disable-piecewise-cuda-graph --sglang-arg=--page-size=1 \
  --lengths 37,300,1000 --new 32 --start-timeout 240 --request-timeout 120 \
  2>&1 | tee "$OUT/sglang_split.out"
echo "split rc=${PIPESTATUS[0]}" | tee -a "$OUT/install.txt"
echo DONE | tee "$OUT/DONE"
