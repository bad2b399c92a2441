#!/bin/bash
# Sourced at the start of every GPU-machine command: installs the carried wheels (the serving
# stack's pure-Python deps the machine lacks, and mooncake's non-CUDA build) into /tmp/site,
# unpacks mooncake's system libraries, and puts the checkout on PYTHONPATH. The machine has
# torch 2.11 + CUDA 13 + Triton already; nothing can be downloaded there.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || echo "setup: wheel install failed"
export PYTHONPATH=/tmp/site:$PWD:$PWD/worker-sidecar
mkdir -p /tmp/mclibs
for f in .gpudata/debs/*.deb; do [ -f "$f" ] && dpkg -x "$f" /tmp/mclibs; done
export LD_LIBRARY_PATH=/tmp/mclibs/usr/lib/x86_64-linux-gnu:/tmp/mclibs/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
fluidpd() { python3 -m fluidpd.cli.main "$@"; }
