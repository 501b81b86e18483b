#!/usr/bin/env bash
# `make chaos`: a chaos soak of the sidecar against a local control plane (its own, unless
# CSI_TESTBED_KUBECONFIG points at a running one), then the invariant table. On a control
# plane of its own the soak also restarts kube-apiserver and etcd mid-run
# (--restart-control-plane); on a shared one it does not (CHAOS_RESTART=0 turns it off).
#   CLAIMS=2000 DURATION=15m RATE=3 SEED=1 SIDECAR=ours|upstream|both SCENARIO=issue-486|issue-1469|issue-1469-pv-gone|restart-during-cleanup|time-travel
#   SWEEP=all (or some of provision,restore,clone,delete,cleanup): the crash sweep instead, a
#   kill at every API write and CSI call of those flows (CHAOS_ARGS=--sweep-events: at the
#   event writes too)
#   RESTORES=0.2 CLONES=0.1 (shares of restores and clones among the claims)
#   NODES=3 (a node deployment of three nodes instead: a sidecar and a driver per node);
#   NODE_DEPLOYMENT=1 is the same as NODES=3
#   POLICIES=1 (policy mode: the shipped intent policies installed for the run, our sidecar
#   with --admission-intent, the policies removed mid-run as a fault; upstream runs without)
#   PROFILE=release (our sidecar from an optimized build, as the image ships it, instead of
#   the debug build the tests use; upstream's binary is an optimized Go build either way)
# Extra flags for tools/chaos go in CHAOS_ARGS (e.g. CHAOS_ARGS=--keep-logs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash testbed/build.sh >/dev/null
# The whole workspace, as `make test` builds it: building only some packages unifies
# dependency features differently and would rebuild the dependencies.
cargo build --workspace --bins
# Run copies of the binaries: a soak restarts sidecars and the driver many times, and a
# rebuild of target/debug meanwhile (someone else's `cargo build`) must not change what a
# restarted process runs. CSI_PROVISIONER_BIN / CSI_TEST_DRIVER_BIN, when set, win.
bins=$(mktemp -d /tmp/chaos-bins.XXXXXX)
target=${CARGO_TARGET_DIR:-target}/debug
cp "$target/csi-provisioner" "$target/csi-test-driver" "$target/chaos" "$bins/"
case "${PROFILE:-debug}" in
  debug) ;;
  release)
    cargo build --release -p csi-provisioner --bin csi-provisioner
    cp "${CARGO_TARGET_DIR:-target}/release/csi-provisioner" "$bins/" ;;
  *) echo "PROFILE must be debug or release, not $PROFILE" >&2; exit 2 ;;
esac
export CSI_PROVISIONER_BIN=${CSI_PROVISIONER_BIN:-$bins/csi-provisioner}
export CSI_TEST_DRIVER_BIN=${CSI_TEST_DRIVER_BIN:-$bins/csi-test-driver}
# What --restart-control-plane runs (`testbed/cluster.sh restart $CSI_TESTBED_DIR`).
export CSI_TESTBED_CLUSTER_SH=${CSI_TESTBED_CLUSTER_SH:-$PWD/testbed/cluster.sh}
own_testbed=
cleanup() {
  rm -rf "$bins"
  if [ -n "$own_testbed" ]; then
    # --keep-logs keeps the control plane's logs too (the snapshot-controller's tells why a
    # snapshot or a source claim outlived the teardown).
    case " ${CHAOS_ARGS:-} " in
      *" --keep-logs "*)
        kept=$(mktemp -d /tmp/chaos-control-plane.XXXXXX)
        cp "$CSI_TESTBED_DIR"/*.log "$kept"/ 2>/dev/null || true
        echo "control-plane logs: $kept" ;;
    esac
    bash testbed/cluster.sh down "$CSI_TESTBED_DIR" || true
  fi
}
trap cleanup EXIT
if [ -z "${CSI_TESTBED_KUBECONFIG:-}" ]; then
  export CSI_TESTBED_DIR=$(mktemp -d /tmp/csi-chaos.XXXXXX)
  export CSI_TESTBED_OWNER_PID=$$
  own_testbed=1
  eval "$(bash testbed/cluster.sh up "$CSI_TESTBED_DIR")"
fi
args=(--sidecar "${SIDECAR:-ours}" --seed "${SEED:-1}")
if [ "${POLICIES:-0}" = 1 ]; then args+=(--policies); fi
if [ -n "${SWEEP:-}" ]; then
  args+=(--sweep "$SWEEP")
elif [ -n "${SCENARIO:-}" ]; then
  args+=(--scenario "$SCENARIO")
else
  args+=(--claims "${CLAIMS:-2000}" --duration "${DURATION:-15m}" --rate "${RATE:-3}")
  # Shares of restores and clones among the claims (the runner's defaults otherwise).
  if [ -n "${RESTORES:-}" ]; then args+=(--restores "$RESTORES"); fi
  if [ -n "${CLONES:-}" ]; then args+=(--clones "$CLONES"); fi
  if [ -z "${NODES:-}" ] && [ "${NODE_DEPLOYMENT:-0}" = 1 ]; then NODES=3; fi
  if [ -n "${NODES:-}" ]; then args+=(--nodes "$NODES"); fi
  # Only a control plane this run started may be restarted: others may be using a shared one.
  if [ -n "$own_testbed" ] && [ "${CHAOS_RESTART:-1}" != 0 ]; then
    args+=(--restart-control-plane)
  fi
fi
# shellcheck disable=SC2086
"$bins/chaos" "${args[@]}" ${CHAOS_ARGS:-}
