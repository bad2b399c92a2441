#!/bin/bash
# A staging GPU command (carry: [".sglwhl/a1"], [".sglwhl/a2"] or [".sglwhl/mc"]): keeps the carried bundle
# (A: sglang-kernel, flashinfer, xgrammar, ~52 MiB; mc: mooncake for CUDA 13, its system
# libraries, the tvm-ffi cache) on the machine outside the checkout, for the run command
# (sglang_run.sh, sglang_pd.sh) started right after while the machine is still warm.
# Bundles: bash scripts/gpu/sglang_bundles.sh here.
set -euo pipefail
mkdir -p ~/sglstage "${OUT:-/tmp/out}"
for d in .sglwhl/*/; do cp -r "$d". ~/sglstage/; done
ls -la ~/sglstage | tee "${OUT:-/tmp/out}/stage.txt"
python3 -c 'import sys, torch; print(sys.version, torch.__version__, torch.cuda.get_device_name(0))' \
  | tee -a "${OUT:-/tmp/out}/stage.txt"
echo DONE | tee "${OUT:-/tmp/out}/DONE-stage"
