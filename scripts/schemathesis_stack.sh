#!/bin/sh
# usage: sh scripts/schemathesis_stack.sh [OUT_DIR] [MAX_EXAMPLES]
# Starts a 1P1D sim-engine stack (`fluidpd up`, fast synthetic profile, 256-token context),
# runs schemathesis (every check; acceptance with tests/serve/schemathesis_hooks.py's
# cross-field rules) against the router's and the decode sidecar's OpenAPI, with the admin
# token and without it, writes each run's text and JSON report (with its exact command) under OUT_DIR, puts the decode
# worker back in service and checks that the stack serves a completion, then stops the stack.
# Run from the repository root with the project's Python first on PATH.
set -u
out=${1:-results/schemathesis}
n=${2:-50}
port=${PORT:-18400}
mkdir -p "$out"
tmp=$(mktemp -d)
python - "$tmp/profile.yaml" <<'PY'
import sys
from fluidpd.cli.drill_cmd import FAST_PROFILE
open(sys.argv[1], "w").write(FAST_PROFILE.replace("context_limit: 32768", "context_limit: 256"))
PY
token=fuzz-token
FLUIDPD_ADMIN_TOKEN=$token fluidpd up --pd 1P1D --policy static --profile "$tmp/profile.yaml" \
  --noise 0 --port "$port" --base-port $((port + 1)) --run-dir "$tmp/run" --ready-timeout 400 \
  > "$tmp/up.out" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null' EXIT
router=http://127.0.0.1:$port
decode=http://127.0.0.1:$((port + 2))
for _ in $(seq 1 90); do
  curl -sf "$router/healthz" >/dev/null && curl -sf "$decode/readyz" >/dev/null && break
  sleep 5
done
sleep 2
export SCHEMATHESIS_HOOKS=tests/serve/schemathesis_hooks.py
status=0
for target in router decode; do
  url=$router; [ "$target" = decode ] && url=$decode
  for auth in token no-token; do
    name=$target-$auth
    set -- --checks all --exclude-checks positive_data_acceptance --max-examples "$n" \
      --request-timeout 20 --max-response-time 30 --seed 1 --no-color --continue-on-failure \
      --report json --report-json-path "$out/$name.json"
    [ "$auth" = token ] && set -- "$@" -H "Authorization: Bearer $token"
    python -c 'import sys; from schemathesis.cli import schemathesis; sys.argv[0] = "st"; schemathesis()' \
      --config-file tests/serve/schemathesis.toml run "$url/openapi.json" "$@" > "$out/$name.txt" 2>&1
    rc=$?
    echo "$name: exit $rc; $(tail -n 1 "$out/$name.txt")"
    [ $rc -eq 0 ] || status=1
  done
done
# The fuzzer may have retired or switched the decode worker: put it back, then serve.
auth="Authorization: Bearer $token"
curl -s -X DELETE -H "$auth" "$decode/retire" >/dev/null
for _ in $(seq 1 120); do
  role=$(curl -s "$decode/role")
  case $role in
    *'"role":"decode","state":"active"'*) break ;;
    *'"state":"active"'*) curl -s -X POST -H "$auth" -H 'content-type: application/json' \
        -d '{"role":"decode"}' "$decode/role" >/dev/null ;;
  esac
  sleep 1
done
curl -s -X POST -H "$auth" "$router/admin/poll" >/dev/null
curl -s "$router/v1/completions" -H 'content-type: application/json' \
  -d '{"model":"serving-path","prompt":"hello","max_tokens":4}' > "$out/after.json"
echo "after the fuzzing: $(cat "$out/after.json")"
grep -q '"completion_tokens":4' "$out/after.json" || status=1
exit $status
