#!/bin/sh
# Makes (once) the separate virtual environment SGLang runs in, and prints its python.
#
# SGLang 0.5.17 pins its own libraries (openai 2.6.1, ...), so it never goes into FluidPD's
# environment: it gets a venv of its own, by default $FLUIDPD_CACHE_DIR/sglang-venv
# (~/.cache/fluidpd/sglang-venv), override with FLUIDPD_SGLANG_VENV. torch (about 3 GB with its
# CUDA libraries) is shared, not installed again: a path entry appends the site-packages of the
# python that has FluidPD's torch (TORCH_PYTHON, default: python3 on PATH, i.e. FluidPD's venv)
# after the venv's own, so SGLang's pins shadow FluidPD's and the rest (torch, numpy,
# transformers 5.12.1, tokenizers 0.22.2: the same pins) comes from there.
#
# Only what the CPU server imports is installed (scripts/sglang/requirements-cpu.txt, with
# --no-deps), from a wheelhouse in the cache; the first run downloads about 30 MB (seconds here)
# and installs in about half a minute, later runs check a stamp and an import and return at once.
#
# usage: sh scripts/sglang/mkvenv.sh        (prints the venv's python on stdout)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
REQ="$here/requirements-cpu.txt"
CACHE="${FLUIDPD_CACHE_DIR:-$HOME/.cache/fluidpd}"
VENV="${FLUIDPD_SGLANG_VENV:-$CACHE/sglang-venv}"
TORCH_PYTHON="${TORCH_PYTHON:-python3}"
key=$(cat "$REQ" "$0" | sha256sum | cut -c1-16)
stamp="$VENV/.complete-$key"
PY="$VENV/bin/python"
check() { "$PY" -c 'import sglang.srt.managers.scheduler' >/dev/null 2>&1; }

if [ -f "$stamp" ] && check; then
  echo "$PY"
  exit 0
fi
# Both pytest workers (and other checkouts) may ask at once on a fresh machine: one builds, the
# others wait for it and then take the fast path (without the lock one's rm -rf below removed
# the venv the other was installing into).
mkdir -p "$CACHE"
exec 9>"$CACHE/sglang-venv.lock"
flock 9
if [ -f "$stamp" ] && check; then
  echo "$PY"
  exit 0
fi
shared=$("$TORCH_PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))') || {
  echo "mkvenv.sh: $TORCH_PYTHON has no torch to share (set TORCH_PYTHON)" >&2; exit 1; }
rm -rf "$VENV"
python3 -m venv "$VENV"
SP=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$shared" > "$SP/zz_fluidpd_shared.pth"
W="$CACHE/sglang-wheels/$key"
mkdir -p "$W"
"$PY" -m pip install --quiet --no-deps --no-index --find-links "$W" -r "$REQ" 2>/dev/null || {
  "$PY" -m pip download --quiet --no-deps --dest "$W" -r "$REQ" >&2
  "$PY" -m pip install --quiet --no-deps --no-index --find-links "$W" -r "$REQ" >&2
}
check || { "$PY" -c 'import sglang.srt.managers.scheduler' >&2; exit 1; }
touch "$stamp"
echo "$PY"
