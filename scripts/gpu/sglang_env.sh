#!/bin/bash
# Sourced by the SGLang GPU commands that run after sglang_stage.sh (bundles .sglwhl/a and
# .sglwhl/mc staged in ~/sglstage by earlier calls on the same warm machine) and that carry
# .sglwhl/b: installs the wheels into ~/sgl once (a later command on the same machine skips it),
# unpacks mooncake's system libraries and the tvm-ffi JIT cache, and sets PYTHONPATH and
# LD_LIBRARY_PATH. Writes $OUT/install.txt.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
ls ~/sglstage/sglang_kernel-*.whl ~/sglstage/mooncake_transfer_engine_cuda13-*.whl >/dev/null || {
  echo "sglang_env.sh: stage .sglwhl/a and .sglwhl/mc first (scripts/gpu/sglang_stage.sh)"; exit 2; }
t0=$(date +%s)
if [ ! -f ~/sgl/.fluidpd-installed ]; then
  [ -d .sglwhl/b ] || { echo "sglang_env.sh: carry .sglwhl/b"; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target ~/sgl \
    ~/sglstage/*.whl .sglwhl/b/*.whl 2>&1 | tail -3
  touch ~/sgl/.fluidpd-installed
fi
mkdir -p ~/sgllibs
# sglang_stage.sh copies the carried folder as it is: the .deb files may sit in debs/.
for f in ~/sglstage/*.deb ~/sglstage/debs/*.deb; do [ -f "$f" ] && dpkg -x "$f" ~/sgllibs; done
[ -f ~/sglstage/tvm-ffi-cache.tgz ] && [ ! -d ~/.cache/tvm-ffi ] && tar xzf ~/sglstage/tvm-ffi-cache.tgz -C ~
cudart=$(python3 -c 'import nvidia.cuda_runtime, os; print(os.path.join(list(nvidia.cuda_runtime.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH=~/sgllibs/usr/lib/x86_64-linux-gnu:~/sgllibs/lib/x86_64-linux-gnu:${cudart}:${LD_LIBRARY_PATH:-}
export PYTHONPATH=~/sgl:$PWD:$PWD/worker-sidecar PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
{
  echo "install: $(( $(date +%s) - t0 )) s"
  python3 -c 'import sglang, mooncake.engine; print("sglang", sglang.__version__, "mooncake", mooncake.engine.__file__)' 2>&1
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>&1
} | tee "$OUT/install.txt" || true  # a report: it never stops the command
