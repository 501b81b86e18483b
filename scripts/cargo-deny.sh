#!/usr/bin/env bash
# Runs cargo-deny at the version pinned here, installing it on first use (from crates.io,
# `cargo install --locked`) into a cache directory keyed by that version, so `make lint`
# on a clean checkout builds it once and every later run starts at once.
#   bash scripts/cargo-deny.sh --offline check licenses bans
# CSI_TOOLS_CACHE overrides the cache's parent directory (default ~/.cache/csi-provisioner-tools).
set -euo pipefail
version=0.20.2
cache="${CSI_TOOLS_CACHE:-$HOME/.cache/csi-provisioner-tools}"
root="$cache/cargo-deny-$version"
bin="$root/bin/cargo-deny"
if [ ! -x "$bin" ]; then
  echo "== installing cargo-deny $version into $root (once)" >&2
  # Into a scratch root first: an interrupted build never leaves a half-installed tool behind.
  mkdir -p "$cache"
  scratch=$(mktemp -d "$cache/.install-XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  cargo install --locked --quiet --version "$version" --root "$scratch" cargo-deny >&2
  rm -rf "$root"
  mv "$scratch" "$root"
  trap - EXIT
fi
cd "$(dirname "$0")/.."
exec "$bin" deny "$@"
