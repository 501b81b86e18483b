#!/usr/bin/env bash
# Builds the test bed's Go programs (control plane, upstream CSI tools, the
# independent mock CSI driver) into a cache directory keyed by the hash of
# go.mod, go.sum and our own Go sources. A warm run only checks that the
# binaries exist. The last line printed is the absolute path of the binaries.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

key=$(cat go.mod go.sum $(find cmd stub -type f | sort) | sha256sum | cut -c1-16)
cache=${CSI_TESTBED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner-testbed}
bin="$cache/bin-$key"

# name => Go package
progs=(
  "etcd=go.etcd.io/etcd/server/v3"
  "kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager"
  "csi-provisioner-upstream=github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
  "csi-sanity=github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity"
  "csi-mock-driver=./cmd/csi-mock-driver"
)

complete=1
for p in "${progs[@]}"; do [ -x "$bin/${p%%=*}" ] || complete=0; done
if [ "$complete" = 1 ]; then
  echo "testbed: cached binaries for key $key" >&2
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "testbed: Go is required (go 1.26+) to build the control plane" >&2; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
start=$(date +%s)
tmp="$bin.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
echo "testbed: downloading Go modules" >&2
go mod download >&2
# The upstream apiserver reports this version instead of v0.0.0-master.
ver=k8s.io/component-base/version
ldflags="-s -w -X $ver.gitVersion=v1.36.3 -X $ver.gitMajor=1 -X $ver.gitMinor=36"
for p in "${progs[@]}"; do
  name=${p%%=*}; pkg=${p#*=}
  t0=$(date +%s)
  echo "testbed: building $name ($pkg) ..." >&2
  go build -trimpath -ldflags "$ldflags" -o "$tmp/$name" "$pkg" >&2
  echo "testbed: built $name in $(( $(date +%s) - t0 ))s" >&2
done
mkdir -p "$cache"
rm -rf "$bin"; mv "$tmp" "$bin"
trap - EXIT
# Keep only the newest few keys so the cache does not grow without bound.
ls -1dt "$cache"/bin-* 2>/dev/null | tail -n +4 | xargs -r rm -rf
echo "testbed: cold build took $(( $(date +%s) - start ))s" >&2
echo "$bin"
