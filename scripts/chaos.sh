#!/usr/bin/env bash
# `make chaos`: a chaos soak of the sidecar against a local control plane (its own, unless
# CSI_TESTBED_KUBECONFIG points at a running one), then the invariant table.
#   CLAIMS=2000 DURATION=15m RATE=3 SEED=1 SIDECAR=ours|upstream|both SCENARIO=issue-486|issue-1469
# Extra flags for tools/chaos go in CHAOS_ARGS (e.g. CHAOS_ARGS=--keep-logs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash testbed/build.sh >/dev/null
cargo build -p csi-provisioner -p csi-test-driver -p chaos --bins
if [ -z "${CSI_TESTBED_KUBECONFIG:-}" ]; then
  export CSI_TESTBED_DIR=$(mktemp -d /tmp/csi-chaos.XXXXXX)
  export CSI_TESTBED_OWNER_PID=$$
  cleanup() { bash testbed/cluster.sh down "$CSI_TESTBED_DIR" || true; }
  trap cleanup EXIT
  eval "$(bash testbed/cluster.sh up "$CSI_TESTBED_DIR")"
fi
args=(--sidecar "${SIDECAR:-ours}" --seed "${SEED:-1}")
if [ -n "${SCENARIO:-}" ]; then
  args+=(--scenario "$SCENARIO")
else
  args+=(--claims "${CLAIMS:-2000}" --duration "${DURATION:-15m}" --rate "${RATE:-3}")
fi
# shellcheck disable=SC2086
target/debug/chaos "${args[@]}" ${CHAOS_ARGS:-}
