#!/usr/bin/env bash
# `make test`: lint (fmt, clippy), build the test bed (cached), start one local control plane for
# the whole run, run every test of the workspace against it, tear it down.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# First, so that formatting or a clippy warning fails the run before the long part (`make lint`).
echo "== lint: cargo fmt --check, cargo clippy -D warnings, cargo deny check licenses bans"
make --no-print-directory lint
echo "== test bed (Go: etcd, kube-apiserver, kube-controller-manager, upstream CSI tools)"
bash testbed/build.sh >/dev/null
echo "== cargo build"
# A clean build of every test binary takes about 10 GB; say so before a linker dies of it.
free_kb=$(df -Pk . | awk 'NR==2 {print $4}')
if [ "${free_kb:-0}" -lt $((12 * 1024 * 1024)) ]; then
  echo "warning: $((free_kb / 1024 / 1024)) GB free here; a clean build needs about 12 GB" >&2
fi
# CI builds once from a clean clone: incremental state (GBs) would never be reused.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi
cargo build --workspace --bins --tests
# The image's static binaries (release builds, one per architecture, in a target
# directory kept across runs) and its SBOM, for tests/image.rs: built now rather
# than inside that test, beside the others.
echo "== cargo build (static binaries for the image, each architecture; SBOM)"
bash scripts/image.sh --binaries-only >/dev/null
export CSI_TESTBED_DIR=$(mktemp -d /tmp/csi-testbed.XXXXXX)
export CSI_TESTBED_OWNER_PID=$$
cleanup() { bash testbed/cluster.sh down "$CSI_TESTBED_DIR" || true; }
trap cleanup EXIT
echo "== control plane"
eval "$(bash testbed/cluster.sh up "$CSI_TESTBED_DIR")"
echo "== cargo test"
cargo test --workspace --no-fail-fast -- --test-threads="${TEST_THREADS:-4}"
echo "== all tests passed in $(( $(date +%s) - start ))s"
