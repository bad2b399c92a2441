#!/bin/bash
# GPU command (carry: [".sglwhl/b"]) right after sglang_stage.sh on the same warm machine
# (carrying .sglwhl/a1, .sglwhl/a2 and .sglwhl/mc, one call each), like sglang_split.sh:
# installs the wheels into ~/sgl, then scripts/gpu/sglang_room.py measures FluidToken's TPOT
# room on SGLang: 24 streams through P/D on a decode server that extends 16 stolen 6,000-token
# prompts while they run, with the room and without it (ABAB), Llama-3.1-8B shape, dummy
# weights, KV over SGLang's Mooncake TCP. Both servers start at once with --mem-fraction 0.8
# and a 120,000-token KV cap (sglang_stack.py says why: with 0.25 / 0.6 the prefill server's
# start failed once on an H100, its share read after the decode server's weights). About
# 3 min. Output: $OUT/sglang_room.json, sglang_room.out, the two server logs, install.txt, DONE.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. scripts/gpu/sglang_env.sh
# page size 1 is what the suffix extend needs (fluidtoken_hook.py).
timeout 540 python3 scripts/gpu/sglang_room.py --out "$OUT" --python "$(command -v python3)" \
  --context-length 16384 --sglang-arg=--disable-piecewise-cuda-graph --sglang-arg=--page-size=1 \
  --start-timeout 300 --request-timeout 120 --max-total-tokens 120000 \
  "$@" 2>&1 | tee "$OUT/sglang_room.out"
echo "room rc=${PIPESTATUS[0]}" | tee -a "$OUT/install.txt"
echo DONE | tee "$OUT/DONE"
