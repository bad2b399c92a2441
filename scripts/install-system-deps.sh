#!/bin/sh
# Debian packages the test suite needs beyond Python: the shared libraries that
# mooncake-transfer-engine (the TCP KV transport) links against. Libraries only: nothing here
# installs, enables or starts a service (Prometheus for tests/monitoring is built from the Go
# module proxy by e2e/testplane/build-binaries.sh and run by the test itself). Installs only
# what is missing; needs root (or sudo) when something is missing.
set -eu
missing=""
for pkg in libibverbs1 libnuma1; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
done
[ -z "$missing" ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-system-deps: need the Debian packages:$missing (no apt-get here)" >&2
  exit 1
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
