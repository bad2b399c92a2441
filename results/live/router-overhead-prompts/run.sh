#!/bin/sh
# Router overhead with 1K- and 8K-token prompts, before issue 12 and after it, interleaved
# (before, after, before, after, ...) so both see the same machine load.
#
# before: main 89d3e12. The router forwarded only a prompt length; text was counted by a hash
#         tokenizer (one token per word). Run by before.py from a `git archive` of that commit.
# after:  this tree. Both halves carry the prompt ids; text is tokenized by the served model's
#         tokenizer (the embedded default here) on a worker thread for long prompts.
#
# Each point is `fluidpd drill router-overhead`: requests alternately through the router and
# straight to the sidecar pair (the client plays the router), FAST_PROFILE (sub-millisecond
# steps), 2 output tokens, open loop, at rates low enough that the stack does not queue on this
# shared 2-core machine (RATE_1K, RATE_8K req/s; router and direct requests together).
#
# Run from the repository root: sh results/live/router-overhead-prompts/run.sh
# (OUT=DIR writes the JSON files and summary.txt there instead.)
set -eu
HERE=results/live/router-overhead-prompts
ROOT=$(pwd)
OUT=${OUT:-$HERE}
mkdir -p "$OUT"
SNAP=$(mktemp -d)
trap 'rm -rf "$SNAP"' EXIT
git archive 89d3e12 | tar -x -C "$SNAP"
DURATION=${DURATION:-20}
for point in "1024 ${RATE_1K:-20}" "8192 ${RATE_8K:-10}"; do
  set -- $point
  for fmt in ids text; do
    # From inside the snapshot: `python -m` puts the working directory first on sys.path.
    (cd "$SNAP" && PYTHONDONTWRITEBYTECODE=1 \
      PYTHONPATH="$SNAP:$SNAP/worker-sidecar:$SNAP/operator" \
      python3 "$ROOT/$HERE/before.py" "$1" "$fmt" "$2" "$DURATION" "$ROOT/$OUT/before-$1-$fmt.json")
    fluidpd drill router-overhead --rps "$2" --duration "$DURATION" --prompt-len "$1" \
      --prompt-format "$fmt" --out "$OUT/after-$1-$fmt.json"
  done
done
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
here = Path(sys.argv[1])
print(f"{'prompt':>7} {'format':>6} {'code':>6} {'router p50':>11} {'direct p50':>11} "
      f"{'added p50':>10} {'added p99':>10} {'errors':>6}")
for n in (1024, 8192):
    for fmt in ("ids", "text"):
        for code in ("before", "after"):
            d = json.loads((here / f"{code}-{n}-{fmt}.json").read_text())
            print(f"{n:>7} {fmt:>6} {code:>6} {d['router']['p50_ms']:>9.2f}ms "
                  f"{d['direct']['p50_ms']:>9.2f}ms {d['added_p50_ms']:>8.2f}ms "
                  f"{d['added_p99_ms']:>8.2f}ms {d['errors']:>6}")
PY
