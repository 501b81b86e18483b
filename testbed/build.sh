#!/usr/bin/env bash
# Builds the test bed's Go programs into a cache directory. Two sets, each keyed
# by the hash of its own Go module (go.mod, go.sum, our own Go sources), so that
# changing one never rebuilds the other:
#   control plane  etcd, kube-apiserver, kube-controller-manager, csi-sanity, our
#                  independent mock CSI driver (module ./, cache bin-KEY)
#   upstream       the upstream csi-provisioner release we compare with (v6.4.0) and
#                  the RBAC file it ships, deploy/kubernetes/rbac.yaml, as
#                  upstream-rbac.yaml (module ./upstream, cache upstream-KEY)
#   snapshots      snapshot-controller and csi-snapshotter from external-snapshotter,
#                  and the CRDs the launcher installs: VolumeSnapshot* and
#                  VolumeGroupSnapshot* (the snapshot-controller waits for both), from
#                  the snapshotter's client module, and ReferenceGrant, from gateway-api
#                  (module ./snapshot and the CRD list below, cache snapshot-KEY)
# A warm run only checks that the files exist. The last line printed is the
# absolute path of a directory holding every binary and crds/ (links into both sets).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

cache=${CSI_TESTBED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner-testbed}
export CGO_ENABLED=0 GOFLAGS=-mod=readonly

# The CRDs are read from these module versions (the gateway-api module is not a build
# dependency: only its CRD is used).
snapshotter_client=github.com/kubernetes-csi/external-snapshotter/client/v8@v8.7.0
gateway_api=sigs.k8s.io/gateway-api@v1.6.3
crds=(
  "$snapshotter_client:config/crd/groupsnapshot.storage.k8s.io_volumegroupsnapshotclasses.yaml"
  "$snapshotter_client:config/crd/groupsnapshot.storage.k8s.io_volumegroupsnapshotcontents.yaml"
  "$snapshotter_client:config/crd/groupsnapshot.storage.k8s.io_volumegroupsnapshots.yaml"
  "$snapshotter_client:config/crd/snapshot.storage.k8s.io_volumesnapshotclasses.yaml"
  "$snapshotter_client:config/crd/snapshot.storage.k8s.io_volumesnapshotcontents.yaml"
  "$snapshotter_client:config/crd/snapshot.storage.k8s.io_volumesnapshots.yaml"
  "$gateway_api:config/crd/standard/gateway.networking.k8s.io_referencegrants.yaml"
)

# build_set DIR LDFLAGS EXTRA NAME=PACKAGE...: builds every program into DIR
# (atomically: a half-built set is never taken for a cached one), from the Go module in
# the current directory; with EXTRA=crds copies the CRDs into DIR/crds, with
# EXTRA=rbac the upstream provisioner's RBAC file into DIR/upstream-rbac.yaml. Returns
# at once when everything is already there.
build_set() {
  local dir=$1 ldflags=$2 with_crds=$3; shift 3
  local complete=1 p
  for p in "$@"; do [ -x "$dir/${p%%=*}" ] || complete=0; done
  [ "$with_crds" = crds ] && [ ! -d "$dir/crds" ] && complete=0
  [ "$with_crds" = rbac ] && [ ! -f "$dir/upstream-rbac.yaml" ] && complete=0
  if [ "$complete" = 1 ]; then
    echo "testbed: cached binaries in $dir" >&2
    return 0
  fi
  command -v go >/dev/null || { echo "testbed: Go is required (go 1.26+) to build the test bed" >&2; exit 1; }
  local start tmp t0 name pkg
  start=$(date +%s)
  tmp="$dir.tmp.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  echo "testbed: downloading Go modules for $(basename "$dir")" >&2
  go mod download >&2
  for p in "$@"; do
    name=${p%%=*}; pkg=${p#*=}
    t0=$(date +%s)
    echo "testbed: building $name ($pkg) ..." >&2
    go build -trimpath -ldflags "$ldflags" -o "$tmp/$name" "$pkg" >&2
    echo "testbed: built $name in $(( $(date +%s) - t0 ))s" >&2
  done
  if [ "$with_crds" = rbac ]; then
    src=$(go mod download -json "$upstream_provisioner" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    install -m 0644 "$src/deploy/kubernetes/rbac.yaml" "$tmp/upstream-rbac.yaml"
  fi
  if [ "$with_crds" = crds ]; then
    mkdir "$tmp/crds"
    local c mod file src
    for c in "${crds[@]}"; do
      mod=${c%%:*}; file=${c#*:}
      src=$(go mod download -json "$mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
      [ -f "$src/$file" ] || { echo "testbed: $file not found in $mod" >&2; exit 1; }
      install -m 0644 "$src/$file" "$tmp/crds/"
    done
  fi
  mkdir -p "$cache"
  rm -rf "$dir"; mv "$tmp" "$dir"
  trap - EXIT
  echo "testbed: cold build of $(basename "$dir") took $(( $(date +%s) - start ))s" >&2
}

key=$(cat go.mod go.sum $(find cmd stub -type f | sort) | sha256sum | cut -c1-16)
# The upstream apiserver reports this version instead of v0.0.0-master.
ver=k8s.io/component-base/version
build_set "$cache/bin-$key" "-s -w -X $ver.gitVersion=v1.36.3 -X $ver.gitMajor=1 -X $ver.gitMinor=36" none \
  "etcd=go.etcd.io/etcd/server/v3" \
  "kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver" \
  "kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager" \
  "csi-sanity=github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity" \
  "csi-mock-driver=./cmd/csi-mock-driver"

cd "$here/upstream"
# The release's version string, as its image reports it (`--version`).
upstream_provisioner=github.com/kubernetes-csi/external-provisioner/v6@v6.4.0
up_key=$(cat go.mod go.sum | sha256sum | cut -c1-16)
build_set "$cache/upstream-$up_key" "-s -w -X main.version=${upstream_provisioner##*@}" rbac \
  "csi-provisioner-upstream=github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"

cd "$here/snapshot"
snap_key=$( (cat go.mod go.sum; printf '%s\n' "${crds[@]}") | sha256sum | cut -c1-16)
build_set "$cache/snapshot-$snap_key" "-s -w" crds \
  "snapshot-controller=github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller" \
  "csi-snapshotter=github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter"

# One directory for the consumers: links to both sets.
all="$cache/testbed-$key-$up_key-$snap_key"
if [ ! -d "$all" ]; then
  tmp="$all.tmp.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  for f in "$cache/bin-$key"/* "$cache/upstream-$up_key"/* "$cache/snapshot-$snap_key"/*; do ln -s "$f" "$tmp/"; done
  mv "$tmp" "$all"
fi
# Keep only the newest few keys (the ones in use now count as newest) of each kind so the cache does not grow without bound.
touch "$cache/bin-$key" "$cache/upstream-$up_key" "$cache/snapshot-$snap_key" "$all"
for kind in bin upstream snapshot testbed; do
  ls -1dt "$cache/$kind"-* 2>/dev/null | grep -v '\.tmp\.' | tail -n +4 | xargs -r rm -rf
done
echo "$all"
