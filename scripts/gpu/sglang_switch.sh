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
ls ~/sglstage/sglang_kernel-*.whl ~/sglstage/mooncake_transfer_engine_cuda13-*.whl >/dev/null \
  || { echo "sglang_switch.sh: stage .sglwhl/a and .sglwhl/mc first (sglang_stage.sh)"; exit 2; }
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target ~/sgl \
  ~/sglstage/*.whl .sglwhl/b/*.whl 2>&1 | tail -3
mkdir -p ~/sgllibs
for f in ~/sglstage/*.deb; do dpkg -x "$f" ~/sgllibs; done
[ -f ~/sglstage/tvm-ffi-cache.tgz ] && tar xzf ~/sglstage/tvm-ffi-cache.tgz -C ~
cudart=$(python3 -c 'import nvidia.cuda_runtime, os; print(os.path.join(list(nvidia.cuda_runtime.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH=~/sgllibs/usr/lib/x86_64-linux-gnu:~/sgllibs/lib/x86_64-linux-gnu:${cudart}:${LD_LIBRARY_PATH:-}
export PYTHONPATH=~/sgl:$PWD:$PWD/worker-sidecar PYTHONUNBUFFERED=1
echo "install: $(( $(date +%s) - t0 )) s" | tee "$OUT/install.txt"
python3 -c 'import mooncake.engine; print("mooncake", mooncake.engine.__file__)' 2>&1 | tee -a "$OUT/install.txt"
# Decode CUDA graphs are captured at start (every worker starts as the decode superset);
# prefill piecewise graphs stay off as in sglang_pd.sh.
timeout 540 python3 scripts/gpu/sglang_switch.py --out "$OUT" --python "$(command -v python3)" \
  --up-arg=--sglang-arg=--context-length=16384 \
  --up-arg=--sglang-arg=--disable-piecewise-cuda-graph \
  --start-timeout 300 || echo "switch rc=$?"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1 || true
echo DONE | tee "$OUT/DONE"
