#!/bin/sh
# Installs FluidPD (editable, SPEC is `.` or `.[dev]`) into a virtual environment, constrained
# to the images' pinned closures (requirements/*.txt), through a wheelhouse kept in
# $FLUIDPD_CACHE_DIR/wheels (default ~/.cache/fluidpd/wheels).
#
# Why a wheelhouse: pip keeps nothing between runs on this kind of machine (the registry's
# answers reach it uncacheable, so ~/.cache/pip stays empty) and CI's fresh clone has no .venv,
# so every run would download torch and its CUDA libraries again. A wheelhouse is keyed by
# pyproject.toml and the pins; a complete one installs offline. A missing, stale or broken one
# is (re)filled from the registry first: the cache only ever saves time.
#
# usage: install-python-deps.sh PYTHON SPEC
set -eu
PY=$1
SPEC=$2
CONSTRAINTS="-c requirements/operator.txt -c requirements/sidecar-gpu.txt"
key=$(cat pyproject.toml requirements/operator.txt requirements/sidecar-gpu.txt | sha256sum | cut -c1-16)
ROOT="${FLUIDPD_CACHE_DIR:-$HOME/.cache/fluidpd}/wheels"
W="$ROOT/$key"
stamp="$W/.complete-$(printf %s "$SPEC" | tr -c 'a-z0-9' _)"

offline() {
  # shellcheck disable=SC2086
  "$PY" -m pip install --quiet --no-index --find-links "$W" -e "$SPEC" $CONSTRAINTS
}

if [ -f "$stamp" ] && offline; then
  touch "$stamp" "$W"
  exit 0
fi
mkdir -p "$W"
# Wheelhouses of other pins go once unused for a week (each holds gigabytes).
find "$ROOT" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -mtime +7 -exec rm -rf {} + 2>/dev/null || true
# The project's build requirements too, for the offline editable build.
# shellcheck disable=SC2086
"$PY" -m pip download --quiet --dest "$W" "setuptools>=69" wheel "$SPEC" $CONSTRAINTS
offline
touch "$stamp" "$W"
