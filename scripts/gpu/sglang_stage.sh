#!/bin/bash
# GPU command 1 of 2 (carry: [".sglwhl/a"]): keeps bundle A (sglang-kernel, flashinfer,
# xgrammar; ~52 MiB) on the machine outside the checkout, for command 2 (sglang_run.sh) started
# right after while the machine is still warm. Bundles: bash scripts/gpu/sglang_bundles.sh here.
set -euo pipefail
mkdir -p ~/sglstage "${OUT:-/tmp/out}"
cp .sglwhl/a/*.whl ~/sglstage/
ls -la ~/sglstage | tee "${OUT:-/tmp/out}/stage.txt"
python3 -c 'import sys, torch; print(sys.version, torch.__version__, torch.cuda.get_device_name(0))' \
  | tee -a "${OUT:-/tmp/out}/stage.txt"
echo DONE | tee "${OUT:-/tmp/out}/DONE-stage"
