#!/usr/bin/env bash
# Local Kubernetes control plane for tests: etcd, kube-apiserver and
# kube-controller-manager (PV binder, PV/PVC protection, namespace controllers)
# on free loopback ports, all state in one directory; the VolumeSnapshot and
# ReferenceGrant CRDs installed and the snapshot-controller running (the
# per-driver csi-snapshotter sidecar is started by the tests that need it).
#
#   testbed/cluster.sh up [DIR]     start; prints `export ...` lines to eval
#   testbed/cluster.sh down [DIR]   stop exactly what `up` started, remove DIR
#   testbed/cluster.sh restart [DIR]  stop etcd and kube-apiserver of a running test bed
#                                   and start them again with the same arguments, ports
#                                   and data (a control-plane restart, for chaos runs);
#                                   kube-controller-manager stays up and reconnects
#   testbed/cluster.sh env [DIR]    print the `export ...` lines again
#
# DIR defaults to $CSI_TESTBED_DIR or /tmp/csi-testbed. With
# CSI_TESTBED_OWNER_PID set, a watchdog tears the cluster down when that
# process dies (so a killed test run leaves nothing behind).
#
# Settings for large clusters (the benchmark's scale profile sets them; see
# docs/benchmarks.md, "Scale"):
#   CSI_TESTBED_PV_SYNC_PERIOD   kube-controller-manager's --pvclaimbinder-sync-period
#                                (default 2s: the tests' claims bind at once; every period
#                                the binder walks every PV and claim it caches)
#   CSI_TESTBED_ETCD_QUOTA_BYTES etcd's --quota-backend-bytes (default: etcd's, 2 GiB)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}
dir=${2:-${CSI_TESTBED_DIR:-/tmp/csi-testbed}}

log() { echo "testbed: $*" >&2; }

free_port() {
  local p
  for _ in $(seq 1 100); do
    # Below Linux's ephemeral range (32768-60999 by default): a port that `ss -tln`
    # shows free may still be the local port of an outgoing connection, and then
    # the bind fails ("address already in use").
    p=$(( 20000 + RANDOM % 12000 ))
    if ! ss -Htln "sport = :$p" | grep -q . && ! grep -qx "$p" "$dir/ports" 2>/dev/null; then
      echo "$p" >>"$dir/ports"
      echo "$p"; return 0
    fi
  done
  log "no free port found"; return 1
}

# start NAME CMD...: run CMD in its own session, log to DIR/NAME.log, record its pid,
# and its command line in DIR/NAME.cmd (NUL-separated) for `restart`.
start() {
  local name=$1; shift
  printf '%s\0' "$@" >"$dir/$name.cmd"
  setsid "$@" >>"$dir/$name.log" 2>&1 </dev/null &
  last_pid=$!
  echo "$last_pid" >"$dir/$name.pid"
}

# alive PID: the process exists and is not a zombie.
alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# stop_one NAME GRACE: SIGTERM the process group of DIR/NAME.pid, SIGKILL after GRACE
# seconds, and wait until it is gone.
stop_one() {
  local name=$1 grace=$2 p
  p=$(cat "$dir/$name.pid")
  kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true
  local deadline=$(( $(date +%s) + grace ))
  while alive "$p" && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
  if alive "$p"; then
    log "$name (pid $p) still running after ${grace}s; SIGKILL"
    kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null || true
    deadline=$(( $(date +%s) + 10 ))
    while alive "$p"; do
      [ "$(date +%s)" -lt "$deadline" ] || { log "$name (pid $p) does not die"; return 1; }
      sleep 0.1
    done
  fi
}

# arg_of NAME FLAG: the value of --FLAG=... in DIR/NAME.cmd.
arg_of() {
  local a
  while IFS= read -r -d '' a; do
    case "$a" in "--$2="*) echo "${a#--"$2"=}"; return 0 ;; esac
  done <"$dir/$1.cmd"
  return 1
}

# restart_one NAME: start DIR/NAME.cmd again.
restart_one() {
  local cmdline=()
  mapfile -d '' -t cmdline <"$dir/$1.cmd"
  start "$1" "${cmdline[@]}"
}

wait_for() { # wait_for WHAT SECONDS CMD...
  local what=$1 secs=$2; shift 2
  local deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    # Fail fast when the process last started has already exited.
    if [ -n "${last_pid:-}" ] && ! kill -0 "$last_pid" 2>/dev/null; then
      log "the process started last exited while waiting for $what; last log lines:"
      tail -n 20 "$dir"/*.log >&2 || true
      return 1
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log "timed out after ${secs}s waiting for $what; last log lines:"
      tail -n 20 "$dir"/*.log >&2 || true
      return 1
    fi
    sleep 0.3
  done
}

print_env() {
  echo "export CSI_TESTBED_DIR=$dir"
  echo "export CSI_TESTBED_BIN=$(cat "$dir/bin")"
  echo "export CSI_TESTBED_KUBECONFIG=$dir/kubeconfig"
  echo "export CSI_TESTBED_PROVISIONER_KUBECONFIG=$dir/kubeconfig-provisioner"
  echo "export CSI_TESTBED_UPSTREAM_RBAC_KUBECONFIG=$dir/kubeconfig-upstream-rbac"
}

stop_all() {
  [ -d "$dir" ] || return 0
  local pids=()
  for f in "$dir"/watchdog.pid "$dir"/snapshot-controller.pid "$dir"/kube-controller-manager.pid "$dir"/kube-apiserver.pid "$dir"/etcd.pid; do
    [ -f "$f" ] && pids+=("$(cat "$f")")
  done
  for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true; done
  # Test state is thrown away: a short grace period, then SIGKILL (a graceful
  # kube-apiserver shutdown alone takes ~10 s).
  for _ in $(seq 1 10); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.2
  done
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}

case "$cmd" in
up)
  if [ -f "$dir/kubeconfig" ] && [ -f "$dir/kube-apiserver.pid" ] && kill -0 "$(cat "$dir/kube-apiserver.pid")" 2>/dev/null; then
    log "already running in $dir"; print_env; exit 0
  fi
  stop_all
  mkdir -p "$dir/pki" "$dir/etcd"
  bin=$("$here/build.sh" | tail -n 1)
  echo "$bin" >"$dir/bin"
  t0=$(date +%s)
  trap 'log "start failed; cleaning up"; stop_all' ERR

  ep=$(free_port); ap=$(free_port)
  log "starting etcd on 127.0.0.1:$ep"
  start etcd "$bin/etcd" --name=default --data-dir="$dir/etcd" \
    --listen-client-urls="http://127.0.0.1:$ep" --advertise-client-urls="http://127.0.0.1:$ep" \
    --listen-peer-urls=http://127.0.0.1:0 --unsafe-no-fsync --log-level=warn \
    ${CSI_TESTBED_ETCD_QUOTA_BYTES:+--quota-backend-bytes="$CSI_TESTBED_ETCD_QUOTA_BYTES"}
  wait_for etcd 60 curl -fsS "http://127.0.0.1:$ep/health"

  openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
  admin_token=$(openssl rand -hex 16)
  prov_token=$(openssl rand -hex 16)
  upstream_token=$(openssl rand -hex 16)
  {
    printf '%s,admin,admin,system:masters\n' "$admin_token"
    # A non-admin identity: the end-to-end tests run the sidecar as this user,
    # bound only to deploy/kubernetes/rbac.yaml's ClusterRole.
    printf '%s,csi-provisioner,csi-provisioner\n' "$prov_token"
    # Another, for the tests that run our sidecar under the RBAC upstream ships
    # (its deploy/kubernetes/rbac.yaml, bound to this user only).
    printf '%s,csi-provisioner-upstream-rbac,csi-provisioner-upstream-rbac\n' "$upstream_token"
  } >"$dir/tokens.csv"
  chmod 600 "$dir/tokens.csv"

  log "starting kube-apiserver on 127.0.0.1:$ap"
  start kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ep" \
    --bind-address=127.0.0.1 --secure-port="$ap" --advertise-address=127.0.0.1 \
    --endpoint-reconciler-type=none --cert-dir="$dir/pki" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$dir/sa.key" --service-account-signing-key-file="$dir/sa.key" \
    --token-auth-file="$dir/tokens.csv" --authorization-mode=RBAC \
    --disable-admission-plugins=ServiceAccount --allow-privileged=true \
    --max-requests-inflight=1000 --max-mutating-requests-inflight=500 \
    --feature-gates=CrossNamespaceVolumeDataSource=true \
    --v=1
  wait_for "kube-apiserver /readyz" 180 curl -fsS -k -H "Authorization: Bearer $admin_token" "https://127.0.0.1:$ap/readyz"
  wait_for "namespace default" 60 curl -fsS -k -H "Authorization: Bearer $admin_token" "https://127.0.0.1:$ap/api/v1/namespaces/default"

  for who in admin provisioner upstream-rbac; do
    case $who in
      admin) tok=$admin_token; f=kubeconfig ;;
      provisioner) tok=$prov_token; f=kubeconfig-provisioner ;;
      upstream-rbac) tok=$upstream_token; f=kubeconfig-upstream-rbac ;;
    esac
    cat >"$dir/$f" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: testbed
  cluster:
    server: https://127.0.0.1:$ap
    certificate-authority: $dir/pki/apiserver.crt
users:
- name: $who
  user:
    token: $tok
contexts:
- name: testbed
  context: {cluster: testbed, user: $who, namespace: default}
current-context: testbed
EOF
    chmod 600 "$dir/$f"
  done

  log "starting kube-controller-manager"
  start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig="$dir/kubeconfig" \
    --controllers=persistentvolume-binder-controller,persistentvolume-protection-controller,persistentvolumeclaim-protection-controller,namespace-controller \
    --leader-elect=false --use-service-account-credentials=false --secure-port=0 \
    --pvclaimbinder-sync-period="${CSI_TESTBED_PV_SYNC_PERIOD:-2s}" --kube-api-qps=500 --kube-api-burst=1000 \
    --feature-gates=CrossNamespaceVolumeDataSource=true --v=2
  sleep 1
  kill -0 "$(cat "$dir/kube-controller-manager.pid")" || { log "kube-controller-manager exited"; tail -20 "$dir/kube-controller-manager.log" >&2; false; }

  # CRDs: the apiserver takes YAML request bodies, so no kubectl is needed.
  api="https://127.0.0.1:$ap"
  for f in "$bin"/crds/*.yaml; do
    curl -fsS -k -H "Authorization: Bearer $admin_token" -H "Content-Type: application/yaml" \
      -X POST --data-binary @"$f" "$api/apis/apiextensions.k8s.io/v1/customresourcedefinitions" >/dev/null \
      || { log "installing CRD $(basename "$f") failed"; false; }
  done
  for res in snapshot.storage.k8s.io/v1/volumesnapshots snapshot.storage.k8s.io/v1/volumesnapshotcontents \
             snapshot.storage.k8s.io/v1/volumesnapshotclasses groupsnapshot.storage.k8s.io/v1/volumegroupsnapshots \
             groupsnapshot.storage.k8s.io/v1/volumegroupsnapshotcontents groupsnapshot.storage.k8s.io/v1/volumegroupsnapshotclasses \
             gateway.networking.k8s.io/v1beta1/referencegrants; do
    wait_for "CRD $res served" 60 curl -fsS -k -H "Authorization: Bearer $admin_token" "$api/apis/$res"
  done
  log "starting snapshot-controller"
  # --retry-interval-max: a snapshot whose deletion waits for a Pending restore is retried
  # with a backoff that doubles per failure (1 s to 5 min by default), not when the claim
  # goes; with 30 s a test that deletes the claims sees the snapshot go within ~30 s,
  # rather than up to 5 minutes later.
  # --resync-period: a VolumeSnapshot deleted within a second of its creation, while the
  # controller's informers relist after a kube-apiserver restart, can keep its
  # volumesnapshot-bound-protection finalizer until the next resync: its content's deletion
  # never reaches the controller (the relist no longer shows the content), and that event is
  # what would have sent the snapshot round again. 15 min by default; 1 min here, so that a
  # chaos teardown sees it go.
  start snapshot-controller "$bin/snapshot-controller" \
    --kubeconfig="$dir/kubeconfig" --kube-api-qps=200 --kube-api-burst=400 --v=2 \
    --retry-interval-max=30s --resync-period=1m
  sleep 1
  kill -0 "$(cat "$dir/snapshot-controller.pid")" || { log "snapshot-controller exited"; tail -20 "$dir/snapshot-controller.log" >&2; false; }

  if [ -n "${CSI_TESTBED_OWNER_PID:-}" ]; then
    setsid bash -c 'while kill -0 "$1" 2>/dev/null && [ -d "$2" ]; do sleep 2; done; rm -f "$2/watchdog.pid"; exec "$3" down "$2" >/dev/null 2>&1' \
      watchdog "$CSI_TESTBED_OWNER_PID" "$dir" "$here/cluster.sh" >/dev/null 2>&1 </dev/null &
    echo "$!" >"$dir/watchdog.pid"
  fi
  trap - ERR
  log "control plane up in $(( $(date +%s) - t0 ))s (state in $dir)"
  print_env
  ;;
down)
  stop_all
  log "stopped and removed $dir"
  ;;
restart)
  # Same binaries, arguments, ports, certificates, tokens and etcd data directory: clients
  # keep their kubeconfigs and every object survives; only connections and watches break.
  for n in etcd kube-apiserver; do
    if [ ! -f "$dir/$n.cmd" ] || [ ! -f "$dir/$n.pid" ]; then
      log "no $dir/$n.cmd or $n.pid: not a test bed started by this script's \`up\` (restart needs both)"
      exit 1
    fi
  done
  alive "$(cat "$dir/kube-apiserver.pid")" || { log "kube-apiserver is not running in $dir"; exit 1; }
  t0=$(date +%s)
  grace=${CSI_TESTBED_STOP_GRACE:-5}
  log "stopping kube-apiserver and etcd (grace ${grace}s)"
  stop_one kube-apiserver "$grace"
  stop_one etcd "$grace"
  etcd_url=$(arg_of etcd listen-client-urls)
  ap=$(arg_of kube-apiserver secure-port)
  admin_token=$(head -n 1 "$dir/tokens.csv" | cut -d, -f1)
  log "starting etcd again on $etcd_url"
  restart_one etcd
  wait_for etcd 60 curl -fsS "$etcd_url/health"
  log "starting kube-apiserver again on 127.0.0.1:$ap"
  restart_one kube-apiserver
  wait_for "kube-apiserver /readyz" 180 curl -fsS -k -H "Authorization: Bearer $admin_token" "https://127.0.0.1:$ap/readyz"
  for n in kube-controller-manager snapshot-controller; do
    p=$(cat "$dir/$n.pid" 2>/dev/null || true)
    if [ -n "$p" ] && ! alive "$p" && [ -f "$dir/$n.cmd" ]; then
      log "$n exited meanwhile; starting it again"
      restart_one "$n"
    fi
  done
  log "control plane restarted in $(( $(date +%s) - t0 ))s (state in $dir)"
  ;;
env)
  print_env
  ;;
*)
  echo "usage: $0 up|down|restart|env [DIR]" >&2; exit 2 ;;
esac
