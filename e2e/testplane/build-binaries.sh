#!/bin/sh
# Builds the real Kubernetes control-plane binaries the e2e tests run, from the Go module
# proxy only: kube-apiserver, kube-controller-manager and kube-scheduler (k8s.io/kubernetes in a
# wrapper module that pins every staging module at the matching v0.X.Y), kubectl (a tiny main
# over k8s.io/kubectl), etcd (go.etcd.io/etcd/server/v3 through a wrapper module) and helm.
# The binaries are cached under $FLUIDPD_CACHE_DIR (default ~/.cache/fluidpd) and rebuilt only
# when missing; prints the bin directory on its last line.
set -eu
K8S_VERSION=${K8S_VERSION:-1.36.3}
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
HELM_VERSION=${HELM_VERSION:-3.22.0}
CACHE=${FLUIDPD_CACHE_DIR:-$HOME/.cache/fluidpd}
ROOT="$CACHE/testplane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-helm-$HELM_VERSION"
BIN="$ROOT/bin"
SRC="$ROOT/src"
mkdir -p "$BIN" "$SRC"
# One build at a time per cache (two test sessions starting cold would race otherwise).
if [ -z "${FLUIDPD_TESTPLANE_LOCKED:-}" ] && command -v flock >/dev/null 2>&1; then
  FLUIDPD_TESTPLANE_LOCKED=1 exec flock "$ROOT/.build.lock" sh "$0" "$@"
fi
export GOFLAGS=-mod=mod
export CGO_ENABLED=0
minor=$(echo "$K8S_VERSION" | cut -d. -f2)
staging_version="v0.$minor.$(echo "$K8S_VERSION" | cut -d. -f3)"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION \
-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"

log() { echo "build-binaries: $*" >&2; }

if [ ! -x "$BIN/kube-apiserver" ] || [ ! -x "$BIN/kube-controller-manager" ] || [ ! -x "$BIN/kube-scheduler" ]; then
  log "kube-apiserver, kube-controller-manager, kube-scheduler v$K8S_VERSION"
  mkdir -p "$SRC/kubernetes"
  cd "$SRC/kubernetes"
  gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  goversion=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")
  {
    echo "module local/fluidpd-k8s-binaries"
    echo
    echo "go $goversion"
    echo
    echo "require k8s.io/kubernetes v$K8S_VERSION"
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
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  go mod tidy >&2
  go build -trimpath -ldflags "$ldflags" -o "$BIN/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler
fi

if [ ! -x "$BIN/kubectl" ]; then
  log "kubectl $staging_version"
  mkdir -p "$SRC/kubectl"
  cd "$SRC/kubectl"
  cat > go.mod <<GO
module local/fluidpd-kubectl

go 1.26.0

require k8s.io/kubectl $staging_version
GO
  cat > main.go <<'GO'
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
GO
  go mod tidy >&2
  go build -trimpath -ldflags "$ldflags" -o "$BIN/kubectl" .
fi

if [ ! -x "$BIN/etcd" ]; then
  log "etcd v$ETCD_VERSION"
  mkdir -p "$SRC/etcd"
  cd "$SRC/etcd"
  cat > go.mod <<GO
module local/fluidpd-etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 v$ETCD_VERSION
GO
  cat > tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
  go mod tidy >&2
  go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3
fi

if [ ! -x "$BIN/helm" ]; then
  log "helm v$HELM_VERSION"
  GOBIN="$BIN" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
fi

echo "$BIN"
