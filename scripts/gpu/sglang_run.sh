#!/bin/bash
# GPU command 2 of 2 (carry: [".sglwhl/b"]), right after sglang_stage.sh on the same warm machine:
# installs both bundles into ~/sgl (first on PYTHONPATH, so transformers 5.12.1 / tokenizers
# 0.22.2 shadow the machine's 5.17 without replacing them), then scripts/gpu/sglang_bench.py
# starts WORKERS SGLang 0.5.17 servers (Llama-3.1-8B shape, --load-format dummy) through
# FluidPD's supervisor with our scheduler hook, all on GPU 0, and measures start time, prefill
# and decode speed and the hook's observables. Output: $OUT/sglang_bench.json, server logs,
# and the tvm-ffi JIT cache (tvm-ffi-cache.tgz) to carry next time.
set -euo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -d ~/sglstage ] || { echo "sglang_run.sh: ~/sglstage missing: run sglang_stage.sh first"; exit 2; }
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target ~/sgl \
  ~/sglstage/*.whl .sglwhl/b/*.whl 2>&1 | tail -3
echo "install: $(( $(date +%s) - t0 )) s" | tee "$OUT/install.txt"
export PYTHONPATH=~/sgl:$PWD:$PWD/worker-sidecar PYTHONUNBUFFERED=1
python3 -c 'import sglang, transformers, tokenizers; print(sglang.__version__, transformers.__version__, tokenizers.__version__)' | tee -a "$OUT/install.txt"
# Prefill (piecewise) CUDA graphs cost ~75 s a server to capture; decode graphs stay on.
timeout 520 python3 scripts/gpu/sglang_bench.py --out "$OUT" --workers "${WORKERS:-2}" \
  --mem-fraction "${MEM_FRACTION:-0.42,0.85}" --context-length 16384 \
  --extra "--disable-piecewise-cuda-graph ${EXTRA:-}" --start-timeout 400 || echo "bench rc=$?"
tar czf "$OUT/tvm-ffi-cache.tgz" -C ~ .cache/tvm-ffi 2>/dev/null || true
nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1 || true
echo DONE | tee "$OUT/DONE"
