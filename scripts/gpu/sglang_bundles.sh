#!/bin/bash
# Run HERE (network), not on the GPU machine: downloads SGLang 0.5.17 and what its server imports
# for the H200's Python 3.12, trims the big wheels and writes two bundles that fit the 64 MiB
# carry limit of one command each (the note shared/notes/sglang-on-h200.md says why these):
#   .sglwhl/a  sglang-kernel 0.4.5 without flash_ops.abi3.so (FA3, 342 MB; we run
#              --attention-backend triton) and without its sm100/ build; flashinfer-python
#              (pure Python); xgrammar 0.2.1 without its static library        (~52 MiB)
#   .sglwhl/b  sglang 0.5.17 without its optional Rust _core libraries, the small wheels its
#              server imports (transformers 5.12.1 and tokenizers 0.22.2 shadow the machine's
#              5.17), and what FluidPD's sidecar needs beside them               (~41 MiB)
#   .sglwhl/mc mooncake-transfer-engine-cuda13 (SGLang's KV transfer on CUDA 13) with only its
#              transfer engine (store, EP, process-group, master and client binaries removed),
#              the system libraries it links that the machine may lack (libibverbs, mlx5,
#              libnuma as .deb, unpacked there), msgpack, and the tvm-ffi JIT cache of the
#              last H200 run when results/ has it                                (< 23 MiB)
# Repacking a wheel = unzip, delete files, drop their RECORD lines, zip again.
# usage: bash scripts/gpu/sglang_bundles.sh          (idempotent; prints the bundle sizes)
set -euo pipefail
cd "$(dirname "$0")/../.."
A=.sglwhl/a B=.sglwhl/b D=.sglwhl/download
mkdir -p "$A" "$B" "$D"
P=(--only-binary=:all: --no-deps --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 --platform any)
pip download -q "${P[@]}" -d "$D" sglang==0.5.17 sglang-kernel==0.4.5 flashinfer-python==0.6.15.post1 \
  xgrammar==0.2.1
# The CPU closure (what the scheduler, HTTP server and model runner import) minus what the H200
# has (torch, torchvision), then what FluidPD's sidecar needs that the machine lacks (the
# machine has numpy, aiohttp, PyYAML, jinja2, prometheus-client, huggingface-hub).
grep -v -E '^(#|sglang==|xgrammar==|torchvision==)' scripts/sglang/requirements-cpu.txt | sed '/^$/d' > "$D/small.txt"
cat >> "$D/small.txt" <<'PINS'
transformers==5.12.1
tokenizers==0.22.2
pydantic==2.13.4
pydantic-core==2.46.4
annotated-types==0.7.0
typing-inspection==0.4.2
typing-extensions==4.16.0
fastapi==0.165.0
starlette==1.10.0
uvicorn==0.54.0
httptools==0.9.0
orjson==3.11.4
zipp==3.23.0
httpx==0.28.1
httpcore==1.0.9
anyio==4.11.0
h11==0.16.0
idna==3.11
certifi==2025.10.5
PINS
pip download -q "${P[@]}" -d "$D/small" -r "$D/small.txt"

repack() {  # repack SRC DEST GLOB...: the wheel without the files matching the globs
  local src=$1 dest=$2; shift 2
  local t; t=$(mktemp -d)
  (cd "$t" && unzip -q "$OLDPWD/$src")
  for g in "$@"; do (cd "$t" && rm -rf $g); done
  local rec; rec=$(ls -d "$t"/*.dist-info)/RECORD
  (cd "$t" && find . -type f ! -path "*/RECORD" | sed 's|^\./||' | sort > "$t/.keep")
  grep -F -f <(sed 's/$/,/' "$t/.keep") "$rec" > "$rec.new" || true
  echo "$(basename "$(dirname "$rec")")/RECORD,," >> "$rec.new"
  mv "$rec.new" "$rec"; rm -f "$t/.keep"
  rm -f "$dest/$(basename "$src")"
  (cd "$t" && zip -q -r -X "$OLDPWD/$dest/$(basename "$src")" .)
  rm -rf "$t"
}
repack "$(ls $D/sglang_kernel-0.4.5-*.whl)" "$A" "sgl_kernel/flash_ops*.so" "sgl_kernel/sm100"
repack "$(ls $D/xgrammar-0.2.1-*.whl)" "$A" "xgrammar/lib/libxgrammar.a"
cp "$(ls $D/flashinfer_python-0.6.15.post1-*.whl)" "$A/"
repack "$(ls $D/sglang-0.5.17-*.whl)" "$B" "sglang/srt/*/_core*.so"
cp "$D"/small/*.whl "$B/"
MC=.sglwhl/mc
mkdir -p "$MC/debs"
pip download -q "${P[@]}" -d "$D" mooncake-transfer-engine-cuda13==0.3.14 msgpack==1.1.2
repack "$(ls $D/mooncake_transfer_engine_cuda13-0.3.14-*.whl)" "$MC" "mooncake/_store*.so" \
  "mooncake/_ep*.so" "mooncake/mooncake_client" "mooncake/mooncake_master" \
  "mooncake/libmooncake_pg*.so" "mooncake/libmooncake_ep*.so" "mooncake/*_jit"
cp "$(ls $D/msgpack-1.1.2-*.whl)" "$MC/"
(cd "$MC/debs" && apt-get download libibverbs1 ibverbs-providers libnuma1 libnl-3-200 \
  libnl-route-3-200 >/dev/null 2>&1) || echo "sglang_bundles.sh: apt-get download failed"
tvm=results/sglang/h200-2026-12-02/tvm-ffi-cache.tgz
[ -f "$tvm" ] && cp "$tvm" "$MC/"
# With the tracked tree at about 15 MB, A no longer fits one call beside it: the same wheels as
# two folders (hard links), staged in two calls (sglang_stage.sh copies any carried .sglwhl/*/).
rm -rf .sglwhl/a1 .sglwhl/a2 && mkdir -p .sglwhl/a1 .sglwhl/a2
ln -f "$A"/sglang_kernel-*.whl .sglwhl/a1/
for f in "$A"/*.whl; do case $f in */sglang_kernel-*) ;; *) ln -f "$f" .sglwhl/a2/ ;; esac; done
du -sh "$MC"
du -sh "$A" .sglwhl/a1 .sglwhl/a2 "$B"
ls -la "$A"
