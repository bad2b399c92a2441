#!/bin/sh
# Two trees' 30,000-request long-long-poisson replay run at the same time, one per core, so
# that both see the same load from the rest of the host; CPU seconds of each, three rounds.
#   sh side_by_side.sh OLD_TREE NEW_TREE   (each a directory holding a ``fluidpd`` package)
set -e
[ -d "$1/fluidpd" ] && [ -d "$2/fluidpd" ] || { echo "side_by_side.sh: OLD_TREE and NEW_TREE must each hold fluidpd/" >&2; exit 2; }
run='from fluidpd.cli.bench_cmd import bench_replay
from fluidpd.profiles import resolve_profile
p = resolve_profile("llama-3.1-8b", "a100-80gb", None)
print(bench_replay(p, "long-long-poisson", 3.0, "4P4D", "fluidpd", 1, 30000)["cpu_s_min"])'
for i in 1 2 3; do
  a=$(mktemp); b=$(mktemp)
  (cd /tmp && PYTHONPATH="$1" python -c "$run" > "$a") & (cd /tmp && PYTHONPATH="$2" python -c "$run" > "$b") & wait
  echo "round $i: old $(cat "$a") CPU-s, new $(cat "$b") CPU-s"; rm -f "$a" "$b"
done
