#!/bin/sh
# Installs FluidPD (editable, SPEC is `.` or `.[dev]`) into a virtual environment, constrained
# to the images' pinned closures (requirements/*.txt), through a wheelhouse kept in
# $FLUIDPD_CACHE_DIR/wheels (default ~/.cache/fluidpd/wheels).
#
# Why a wheelhouse: pip keeps nothing between runs on this kind of machine (the registry's
# answers reach it uncacheable, so ~/.cache/pip stays empty) and CI's fresh clone has no .venv,
# so every run would download torch and its CUDA libraries again. A wheelhouse is keyed by
# the project's dependency tables and the pins; a complete one installs offline. A missing,
# stale or broken one is (re)filled from the registry first: the cache only ever saves time.
#
# Why uv installs from it: pip unpacks the 5.4 GB of wheels into every fresh .venv (75 s here);
# uv (pinned, kept beside the wheelhouse, outside the venv so the venv holds exactly the
# project's closure) unpacks each wheel once into its cache ($FLUIDPD_CACHE_DIR/uv) and links
# the files into the venv, then compiles the bytecode as pip does (25 s). The bytecode matters:
# without it every process compiles what it imports, and those that may not write it (SGLang's
# spawned workers run with -B) compile torch again each time (a whole warm run took 26 min
# instead of 16). Should uv fail, pip installs.
#
# usage: install-python-deps.sh PYTHON SPEC
#        install-python-deps.sh --uv   (prints the uv it installs with and uv's cache directory,
#                                       one a line; nothing before the first install)
set -eu
UV_VERSION=0.9.30
CACHE="${FLUIDPD_CACHE_DIR:-$HOME/.cache/fluidpd}"
UV="$CACHE/uv-$UV_VERSION/bin/uv"
if [ "${1:-}" = --uv ]; then
  if [ -x "$UV" ]; then printf '%s\n%s\n' "$UV" "$CACHE/uv"; fi
  exit 0
fi
PY=$1
SPEC=$2
CONSTRAINTS="-c requirements/operator.txt -c requirements/sidecar-gpu.txt"
# What decides the closure: the dependency tables of pyproject.toml (not its tool settings, whose
# edits would otherwise send every run back to the registry) and the pins.
deps=$("$PY" -c 'import json, tomllib
d = tomllib.load(open("pyproject.toml", "rb")); p = d["project"]
print(json.dumps([d.get("build-system"), p.get("requires-python"), p.get("dependencies"),
                  p.get("optional-dependencies")], sort_keys=True))')
key=$(printf '%s\n%s\n' "$deps" "$UV_VERSION" | cat - requirements/operator.txt requirements/sidecar-gpu.txt | sha256sum | cut -c1-16)
ROOT="$CACHE/wheels"
W="$ROOT/$key"
stamp="$W/.complete-$(printf %s "$SPEC" | tr -c 'a-z0-9' _)"

with_pip() {
  # shellcheck disable=SC2086
  "$PY" -m pip install --quiet --no-index --find-links "$W" -e "$SPEC" $CONSTRAINTS
}

with_uv() {
  if [ ! -x "$UV" ]; then
    "$PY" -m pip install --quiet --no-index --find-links "$W" --target "$CACHE/uv-$UV_VERSION.$$" \
      "uv==$UV_VERSION" || return 1
    rm -rf "$CACHE/uv-$UV_VERSION"
    mv "$CACHE/uv-$UV_VERSION.$$" "$CACHE/uv-$UV_VERSION"
  fi
  # shellcheck disable=SC2086
  UV_CACHE_DIR="$CACHE/uv" "$UV" pip install --quiet --compile-bytecode --python "$PY" --no-index --find-links "$W" \
    -e "$SPEC" $CONSTRAINTS
}

offline() {
  with_uv || with_pip
}

if [ -f "$stamp" ] && offline; then
  touch "$stamp" "$W"
  exit 0
fi
mkdir -p "$W"
# Wheelhouses of other pins go once unused for a week (each holds gigabytes).
find "$ROOT" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -mtime +7 -exec rm -rf {} + 2>/dev/null || true
# The project's build requirements too, for the offline editable build; and uv.
# shellcheck disable=SC2086
"$PY" -m pip download --quiet --dest "$W" "setuptools>=69" wheel "uv==$UV_VERSION" "$SPEC" $CONSTRAINTS
offline
touch "$stamp" "$W"
