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
ls ~/sglstage/sglang_kernel-*.whl ~/sglstage/mooncake_transfer_engine_cuda13-*.whl >/dev/null \
  || { echo "sglang_pd.sh: stage .sglwhl/a and .sglwhl/mc first (sglang_stage.sh)"; exit 2; }
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
timeout 500 python3 scripts/gpu/sglang_pd.py --out "$OUT" --python "$(command -v python3)" \
  --sidecar-arg=--sglang-arg=--context-length=16384 \
  --sidecar-arg=--sglang-arg=--disable-piecewise-cuda-graph \
  --plain-arg=--context-length=16384 --plain-arg=--disable-piecewise-cuda-graph \
  --start-timeout 240 || echo "pd rc=$?"
echo DONE | tee "$OUT/DONE"
