#!/usr/bin/env bash
# `make test`: lint (fmt, clippy), build the test bed (cached), start one local control plane for
# the whole run, run every test of the workspace against it, tear it down. Ends with each phase's
# wall time, and each test binary's, so a slow run shows where it went (also when it fails).
set -euo pipefail
cd "$(dirname "$0")/.."

# Phase timing: `phase NAME` ends the running phase and starts NAME; the summary is printed on
# exit, however the run ends. Times in milliseconds, from bash's EPOCHREALTIME.
now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((t / 1000)); }
start_ms=$(now_ms)
phase_names=() phase_ms=() current='' current_ms=0 testbed=
binary_times=$(mktemp)
end_phase() {
  if [ -n "$current" ]; then
    phase_names+=("$current") phase_ms+=($(($(now_ms) - current_ms)))
    current=''
  fi
}
phase() {
  end_phase
  current=$1 current_ms=$(now_ms)
  echo "== $1${2:+: $2}"
}
human() { # milliseconds → 4m05s / 12.3s
  local ms=$1
  if [ "$ms" -ge 60000 ]; then
    printf '%dm%02ds' $((ms / 60000)) $((ms % 60000 / 1000))
  else
    printf '%d.%ds' $((ms / 1000)) $((ms % 1000 / 100))
  fi
}
summary() {
  local status=$? failed_phase=${current:-}
  end_phase
  if [ -n "$testbed" ]; then
    phase teardown
    bash testbed/cluster.sh down "$testbed" || true
    end_phase
  fi
  echo "== time per phase (wall)"
  local i
  for i in "${!phase_names[@]}"; do
    printf '  %-34s %9s%s\n' "${phase_names[$i]}" "$(human "${phase_ms[$i]}")" \
      "$([ "${phase_names[$i]}" = "$failed_phase" ] && [ "$status" != 0 ] && echo '  (failed here)')"
    # The test binaries, longest first: those of 10 s or more by name, the rest together.
    if [ "${phase_names[$i]}" = "cargo test" ] && [ -s "$binary_times" ]; then
      sort -k1,1nr "$binary_times" | awk -v limit=10000 '
        function human(ms) {
          return ms >= 60000 ? sprintf("%dm%02ds", ms / 60000, (ms % 60000) / 1000) \
                             : sprintf("%.1fs", ms / 1000)
        }
        $1 >= limit { name = $0; sub(/^[0-9]+ /, "", name); printf "    %-32s %9s\n", name, human($1); next }
        { rest += $1; n++ }
        END { if (n) printf "    %-32s %9s\n", n " binaries under 10 s", human(rest) }'
    fi
  done
  printf '  %-34s %9s\n' total "$(human $(($(now_ms) - start_ms)))"
  # The tests' own count, summed over the binaries, last (ignored ones are skipped).
  if [ -s "$binary_times.counts" ]; then
    read -r passed failed ignored <"$binary_times.counts"
    echo "tests: $passed passed, $failed failed, $ignored skipped"
  fi
  rm -f "$binary_times" "$binary_times.counts"
}
trap summary EXIT

# Reads `cargo test`'s output (passed through unchanged) and writes `MS NAME` per test binary
# to $binary_times: cargo runs the binaries one after the other, each announced by a `Running`
# (or `Doc-tests`) line, so a binary's time is the time to the next announcement. Also adds up
# the `test result:` lines into $binary_times.counts.
time_binaries() {
  local line name='' began=0 t passed=0 failed=0 ignored=0
  while IFS= read -r line; do
    t=$(now_ms)
    if [[ $line =~ ^[[:space:]]+(Running|Doc-tests)\ ([^ ]+)(\ ([^ ]+))? ]]; then
      [ -z "$name" ] || echo "$((t - began)) $name" >>"$binary_times"
      case ${BASH_REMATCH[1]}:${BASH_REMATCH[2]} in
        # `Running unittests src/lib.rs (target/debug/deps/CRATE-HASH)`: the crate names it.
        Running:unittests) name=${line##*/deps/} name="unittests ${name%-*}" ;;
        Running:*) name=${BASH_REMATCH[2]} ;;
        *) name="doctests ${BASH_REMATCH[2]}" ;;
      esac
      began=$t
    fi
    if [[ $line =~ ^test\ result:\ [A-Za-z]+\.\ ([0-9]+)\ passed\;\ ([0-9]+)\ failed\;\ ([0-9]+)\ ignored ]]; then
      passed=$((passed + BASH_REMATCH[1])) failed=$((failed + BASH_REMATCH[2]))
      ignored=$((ignored + BASH_REMATCH[3]))
    fi
    printf '%s\n' "$line"
  done
  [ -z "$name" ] || echo "$(($(now_ms) - began)) $name" >>"$binary_times"
  echo "$passed $failed $ignored" >"$binary_times.counts"
}

# The image's Debian packages (podman, qemu-user-static, musl-tools, llvm), installed meanwhile
# where they are missing: downloads, about a minute on a fresh machine, that need no CPU.
packages_log=$(mktemp)
bash scripts/image.sh --packages >"$packages_log" 2>&1 &
packages=$!

# First, so that formatting or a clippy warning fails the run before the long part (`make lint`).
phase lint "cargo fmt --check, cargo clippy -D warnings, cargo deny check licenses bans"
make --no-print-directory lint
phase "test bed" "Go: etcd, kube-apiserver, kube-controller-manager, upstream CSI tools"
bash testbed/build.sh >/dev/null
phase "cargo build"
# A clean build of every test binary takes about 10 GB; say so before a linker dies of it.
free_kb=$(df -Pk . | awk 'NR==2 {print $4}')
if [ "${free_kb:-0}" -lt $((12 * 1024 * 1024)) ]; then
  echo "warning: $((free_kb / 1024 / 1024)) GB free here; a clean build needs about 12 GB" >&2
fi
# CI builds once from a clean clone: incremental state (GBs) would never be reused.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi
cargo build --workspace --bins --tests
# The image's static binaries (release builds, one per architecture, in a target directory kept
# across runs) and its SBOM, for tests/image.rs: built now rather than inside that test, beside
# the others. The script also installs the image's tools (podman, qemu, zig...) when missing.
phase "image binaries" "static release builds for ${ARCHES:-amd64 arm64}, SBOMs, the image's tools"
# Whatever failed there is tried again, and reported, by the script below.
wait "$packages" || { echo "scripts/image.sh --packages failed:"; cat "$packages_log"; } >&2
rm -f "$packages_log"
bash scripts/image.sh --binaries-only >/dev/null
phase "control plane"
# Torn down by the summary at exit, whatever happened.
testbed=$(mktemp -d /tmp/csi-testbed.XXXXXX)
export CSI_TESTBED_DIR=$testbed
export CSI_TESTBED_OWNER_PID=$$
eval "$(bash testbed/cluster.sh up "$CSI_TESTBED_DIR")"
phase "cargo test"
cargo test --workspace --no-fail-fast -- --test-threads="${TEST_THREADS:-4}" 2>&1 | time_binaries
end_phase
echo "== all tests passed in $(human $(($(now_ms) - start_ms)))"
