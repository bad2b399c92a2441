#!/bin/bash
# Run here (not on the GPU machine) before a GPU call: fetches what the GPU machine lacks into
# two git-ignored folders that the call carries (`carry: [".whl", ".gpudata"]`, ~50 MB):
# .whl/ the serving stack's wheels for its Python 3.12 and mooncake's non-CUDA build;
# .gpudata/ mooncake's system libraries (.deb, unpacked there by setup.sh) and the Azure traces.
set -eu
cd "$(dirname "$0")/../.."
# The common git dir: in a worktree .git is a file, and a fresh clone may have no info/.
EXCLUDE=$(git rev-parse --git-common-dir)/info/exclude
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx '/.whl/' "$EXCLUDE" 2>/dev/null || printf '/.whl/\n/.gpudata/\n' >> "$EXCLUDE"
mkdir -p .whl .gpudata/debs .gpudata/traces
P="--only-binary=:all: --no-deps --python-version 3.12 --implementation cp"
P="$P --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64"
P="$P --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
python3 -m pip download -q $P -d .whl pydantic==2.13.4 pydantic_core==2.46.4 annotated-types \
  typing-inspection==0.4.2 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 httptools==0.9.0 \
  "orjson>=3.10,<4" typing_extensions==4.16.0 "opentelemetry-api>=1.44.0" \
  mooncake-transfer-engine-non-cuda==0.3.13.post1
(cd .gpudata/debs && apt-get download libibverbs1 libnuma1 libnl-3-200 libnl-route-3-200)
cp -r "${FLUIDPD_TRACES_DIR:-../shared/data/traces}/azure_llm_2023" .gpudata/traces/
du -sh .whl .gpudata
