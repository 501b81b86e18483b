#!/usr/bin/env bash
# `make demo`: build what the demo needs (cached after the first run), start a
# private local control plane, run examples/demo.rs against it, and tear
# everything down again, whatever happens. Exit status is the demo's.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
target_dir=${CARGO_TARGET_DIR:-target}

say() { printf '== %s\n' "$*"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

# running PID / group_running SID: true while a process (or one of the session) is
# alive; a zombie waiting to be reaped by init is not running any more.
running() { ps -o stat= -p "$1" 2>/dev/null | grep -qv '^Z'; }
group_running() { ps -o stat= -s "$1" 2>/dev/null | grep -qv '^Z'; }

# ticker_start MSG: prints a line every 5 s until ticker_stop, so that a slow step
# is never silent.
ticker_pid=
ticker_start() {
  local msg=$1 t0=$SECONDS
  (
    trap 'kill "$sp" 2>/dev/null; exit 0' TERM
    while :; do
      sleep 5 & sp=$!; wait "$sp"
      printf '   ... %s (%ss)\n' "$msg" "$(( SECONDS - t0 ))"
    done
  ) &
  ticker_pid=$!
}
ticker_stop() {
  if [ -n "$ticker_pid" ]; then
    kill "$ticker_pid" 2>/dev/null || true
    wait "$ticker_pid" 2>/dev/null || true
    ticker_pid=
  fi
}

say "csi-provisioner demo: our sidecar provisioning and deleting volumes on a local control plane"
say "test bed: etcd, kube-apiserver, kube-controller-manager (Go, built once then cached)"
bash testbed/build.sh >/dev/null || die "building the test bed failed (see above)"

say "cargo build (the sidecar, the test driver, the demo program)"
# Only the packages the demo runs: a cold build stays as short as it can be.
cargo build -p csi-provisioner -p csi-test-driver --bins --examples \
  || die "cargo build failed (see above)"

cluster_dir=$(mktemp -d /tmp/csi-demo-cluster.XXXXXX)
demo_pid=
cluster_pids=()
cleanup() {
  local rc=$?
  set +e
  ticker_stop
  # The demo program runs in its own session (setsid below): whatever it started
  # (driver, sidecar) is in that session and process group too.
  if [ -n "$demo_pid" ] && group_running "$demo_pid"; then
    kill -TERM -- "-$demo_pid" 2>/dev/null || true
    for _ in $(seq 1 25); do group_running "$demo_pid" || break; sleep 0.2; done
    kill -KILL -- "-$demo_pid" 2>/dev/null || true
  fi
  for f in "$cluster_dir"/*.pid; do [ -f "$f" ] && cluster_pids+=("$(cat "$f")"); done
  say "stopping the control plane"
  ticker_start "stopping the control plane (kube-apiserver shuts down gracefully)"
  bash testbed/cluster.sh down "$cluster_dir" >/dev/null 2>&1
  ticker_stop
  # A process SIGKILLed by `down` a moment ago may take a little while to die.
  local left=() tries
  for tries in $(seq 1 25); do
    left=()
    for p in "${cluster_pids[@]}"; do running "$p" && left+=("$p"); done
    if [ -n "$demo_pid" ] && group_running "$demo_pid"; then left+=("group $demo_pid"); fi
    [ "${#left[@]}" = 0 ] && break
    sleep 0.2
  done
  if [ "${#left[@]}" -gt 0 ]; then
    printf 'demo: processes still running after clean-up: %s\n' "${left[*]}" >&2
    [ "$rc" = 0 ] && rc=1
  else
    say "control plane stopped; nothing left running"
  fi
  [ "$rc" = 0 ] && say "demo passed in $(( SECONDS - start ))s"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "local control plane in $cluster_dir"
ticker_start "starting the control plane"
# The watchdog of cluster.sh stops the control plane if this script dies without its trap.
# One retry: another control plane starting at the same moment may take a port
# between the check and the bind.
for attempt in 1 2; do
  if env_lines=$(CSI_TESTBED_OWNER_PID=$$ bash testbed/cluster.sh up "$cluster_dir"); then break; fi
  if [ "$attempt" = 2 ]; then ticker_stop; die "the control plane did not start (logs above)"; fi
  say "the control plane did not start; trying once more"
done
ticker_stop
eval "$env_lines"

say "demo"
# setsid: its own session and process group, so the clean-up above can stop it and
# its children by group.
setsid "$target_dir/debug/examples/demo" &
demo_pid=$!
rc=0
wait "$demo_pid" || rc=$?
# The program reaps what it started; anything left in its group is a bug worth failing on.
if group_running "$demo_pid"; then
  printf 'demo: the demo program left processes behind:\n' >&2
  ps -o pid,stat,args -s "$demo_pid" >&2 || true
  [ "$rc" = 0 ] && rc=1
fi
if [ "$rc" != 0 ]; then
  die "FAILED (exit $rc); the sidecar's log is in $target_dir/debug/demo/csi-provisioner.log"
fi
