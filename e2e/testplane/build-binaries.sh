#!/bin/sh
# Builds the real binaries the tests run, from the Go module proxy only, into one cached bin dir:
# - kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and etcd in ONE `go build`
#   of one wrapper module (k8s.io/kubernetes, every staging module pinned at the matching
#   v0.X.Y), so the five share every compiled package; etcd is the version k8s.io/kubernetes
#   itself requires (its integration tests embed that etcd server), so nothing in the Kubernetes
#   build list moves;
# - helm (its own module: it builds against a newer client-go);
# - prometheus and promtool (tests/monitoring scrapes a live stack with them), one `go install`,
#   with the service-discovery plugins left out (`remove_all_sd`: only file/http/static remain).
# Cached under $FLUIDPD_CACHE_DIR (default ~/.cache/fluidpd) and rebuilt only when missing, so
# a warm run only checks files; prints the bin directory on its last line. Nothing is installed
# system-wide and nothing is started. FLUIDPD_TESTPLANE_NEED (names, default all) limits the
# check and the build to what a caller needs. Each binary appears in the bin dir by a rename,
# complete, so a test may use one while the others still build (e2e/harness/binaries.py).
set -eu
K8S_VERSION=${K8S_VERSION:-1.36.3}
HELM_VERSION=${HELM_VERSION:-3.22.0}
PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-3.16.0}
CACHE=${FLUIDPD_CACHE_DIR:-$HOME/.cache/fluidpd}
ROOT="$CACHE/testplane/k8s-$K8S_VERSION-helm-$HELM_VERSION-prometheus-$PROMETHEUS_VERSION"
BIN="$ROOT/bin"
SRC="$ROOT/src"
mkdir -p "$BIN" "$SRC"
ALL="kube-apiserver kube-controller-manager kube-scheduler kubectl etcd helm prometheus promtool"
NEED=${FLUIDPD_TESTPLANE_NEED:-$ALL}
log() { echo "build-binaries: $*" >&2; }
# Whether any of the names is needed and not built yet.
missing() {
  for name in "$@"; do
    case " $NEED " in *" $name "*) [ -x "$BIN/$name" ] || return 0 ;; esac
  done
  return 1
}
# FLUIDPD_TESTPLANE_CHECK=1: only say whether what is needed is built (exit 1 if not); no lock.
# The bin directory is printed either way (its parent holds the build's lock file).
if [ -n "${FLUIDPD_TESTPLANE_CHECK:-}" ]; then
  echo "$BIN"
  # shellcheck disable=SC2086
  if missing $ALL; then exit 1; fi
  exit 0
fi
# One build at a time per cache (two test sessions starting cold would race otherwise).
if [ -z "${FLUIDPD_TESTPLANE_LOCKED:-}" ] && command -v flock >/dev/null 2>&1; then
  FLUIDPD_TESTPLANE_LOCKED=1 exec flock "$ROOT/.build.lock" sh "$0" "$@"
fi
# No DWARF from the compiler: the links strip it anyway (-s -w), and not writing it takes 13 %
# less CPU (etcd's server, cold: 96 -> 83 CPU-s); the binaries are the same code.
export GOFLAGS="-mod=mod -trimpath -buildvcs=false -gcflags=all=-dwarf=false"
export CGO_ENABLED=0
minor=$(echo "$K8S_VERSION" | cut -d. -f2)
staging_version="v0.$minor.$(echo "$K8S_VERSION" | cut -d. -f3)"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION \
-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"

if missing kube-apiserver kube-controller-manager kube-scheduler kubectl etcd; then
  log "kube-apiserver, kube-controller-manager, kube-scheduler, kubectl v$K8S_VERSION and etcd"
  mkdir -p "$SRC/kubernetes"
  cd "$SRC/kubernetes"
  gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  goversion=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")
  etcd_version=$(sed -n 's#^\s*go\.etcd\.io/etcd/server/v3 \(v[0-9.]*\).*#\1#p' "$gomod")
  {
    echo "module local/fluidpd-k8s-binaries"
    echo
    echo "go $goversion"
    echo
    echo "require ("
    echo "	k8s.io/kubernetes v$K8S_VERSION"
    echo "	go.etcd.io/etcd/server/v3 $etcd_version"
    echo ")"
    echo
    echo "replace ("
    # Every staging module the kubernetes module requires at v0.0.0, pinned to its release.
    grep -E '^\s+k8s\.io/[a-z0-9-]+ v0\.0\.0\s*$' "$gomod" | awk -v v="$staging_version" '{print "\t" $1 " => " $1 " " v}' | sort -u
    echo ")"
  } > go.mod
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  go mod tidy >&2
  out="$SRC/kubernetes/out"
  mkdir -p "$out"
  go build -ldflags "$ldflags" -o "$out/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl \
    go.etcd.io/etcd/server/v3
  # go names a major-version suffix's binary after the element before it: .../server/v3 -> server
  mv "$out/server" "$out/etcd"
  mv "$out/kube-apiserver" "$out/kube-controller-manager" "$out/kube-scheduler" \
    "$out/kubectl" "$out/etcd" "$BIN/"
fi

# go install writes into GOBIN in place: it installs into a staging dir, then a rename publishes.
STAGE="$ROOT/stage"
publish() {
  for name in "$@"; do mv "$STAGE/$name" "$BIN/$name"; done
}

if missing helm; then
  log "helm v$HELM_VERSION"
  rm -rf "$STAGE" && mkdir -p "$STAGE"
  GOBIN="$STAGE" go install \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
  publish helm
fi

if missing prometheus promtool; then
  # Prometheus 3.M.P is the Go module version v0.3MM.P (M zero-padded to two digits).
  prom_minor=$(echo "$PROMETHEUS_VERSION" | cut -d. -f2)
  prom_module="v0.$((300 + prom_minor)).$(echo "$PROMETHEUS_VERSION" | cut -d. -f3)"
  log "prometheus and promtool v$PROMETHEUS_VERSION ($prom_module)"
  v=github.com/prometheus/common/version
  rm -rf "$STAGE" && mkdir -p "$STAGE"
  GOBIN="$STAGE" go install -tags remove_all_sd \
    -ldflags "-s -w -X $v.Version=$PROMETHEUS_VERSION -X $v.Branch=release -X $v.BuildUser=fluidpd" \
    "github.com/prometheus/prometheus/cmd/prometheus@$prom_module" \
    "github.com/prometheus/prometheus/cmd/promtool@$prom_module"
  publish prometheus promtool
fi

echo "$BIN"
