#!/usr/bin/env bash
# `make image`: the sidecar's container image, built as upstream builds its
# own: a static binary compiled on the host, copied into a base image by the
# Dockerfile at the root. tests/image.rs runs this same script.
#
#   IMAGE   tag to build (default csi-provisioner:dev)
#   BASE    base image (default: the Dockerfile's, upstream's
#           gcr.io/distroless/static:latest, when it is in local storage;
#           otherwise scratch, which needs no registry: see below)
#   ENGINE  podman (default) or docker
#
# `scripts/image.sh --binary-only` stops after the static binary and prints its
# path (`make test` builds it before the tests, so that tests/image.rs does not
# compile a release build while the other tests run).
#
# Everything the build needs is installed here if missing (the rust target,
# and musl-gcc for ring's C code), because CI starts from a clean machine.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-csi-provisioner:dev}
ENGINE=${ENGINE:-podman}
arch=$(uname -m)
target="$arch-unknown-linux-musl"
default_base=$(sed -n 's/^ARG BASE=//p' Dockerfile)

say() { echo "image.sh: $*" >&2; }

# 1. The toolchain: the musl target, and a C compiler for it.
installed_targets=$(rustup target list --installed 2>/dev/null || true)
if ! grep -qx "$target" <<<"$installed_targets"; then
	command -v rustup >/dev/null || { say "the $target target is missing and rustup is not installed"; exit 1; }
	say "adding the rust target $target"
	rustup target add "$target" >&2
fi
if ! command -v musl-gcc >/dev/null; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		say "installing musl-tools (musl-gcc, for ring's C code)"
		apt-get install -y -qq musl-tools >&2 || { apt-get update -qq >&2 && apt-get install -y -qq musl-tools >&2; }
	else
		say "musl-gcc is missing: install musl-tools (Debian/Ubuntu) or musl-gcc"
		exit 1
	fi
fi

# 2. The static binary, in the workspace's target directory (cargo's lock
# makes a concurrent build wait rather than collide).
export "CC_${target//-/_}=musl-gcc"
cargo build --release --locked --target "$target" -p csi-provisioner --bin csi-provisioner >&2
binary="${CARGO_TARGET_DIR:-target}/$target/release/csi-provisioner"

# A dynamically linked binary would not start in a base without a libc: its
# program headers must have no PT_INTERP (type 3), the loader request.
is_static() {
	local f=$1 phoff phentsize phnum i type
	[ "$(od -An -tx1 -N4 "$f" | tr -d ' ')" = 7f454c46 ] || return 1
	phoff=$(od -An -tu8 -j32 -N8 "$f" | tr -d ' ')
	phentsize=$(od -An -tu2 -j54 -N2 "$f" | tr -d ' ')
	phnum=$(od -An -tu2 -j56 -N2 "$f" | tr -d ' ')
	for ((i = 0; i < phnum; i++)); do
		type=$(od -An -tu4 -j$((phoff + i * phentsize)) -N4 "$f" | tr -d ' ')
		[ "$type" != 3 ] || return 1
	done
}
is_static "$binary" || { say "$binary is not a static executable"; exit 1; }
if [ "${1:-}" = --binary-only ]; then
	echo "$binary"
	exit 0
fi
version=$("$binary" --version | awk '{print $NF}')

# 3. The image. The build context holds nothing but the binary.
base=${BASE:-}
if [ -z "$base" ]; then
	if "$ENGINE" image exists "$default_base" 2>/dev/null; then
		base=$default_base
	else
		# No registry is reachable from the project's machines. Without a libc
		# or a shell the binary needs nothing from a base; what distroless adds
		# (CA certificates, /etc/passwd, tzdata) the sidecar does not use.
		say "$default_base is not in local storage; building FROM scratch (pull it, or set BASE=, for upstream's base)"
		base=scratch
	fi
fi
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
install -m 0755 "$binary" "$context/csi-provisioner"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then revision="$revision-dirty"; fi
source_url=$(git remote get-url origin 2>/dev/null || true)
engine_flags=()
if [ "$ENGINE" = podman ]; then
	# chroot isolation builds where a container cannot run (no cgroups needed);
	# no intermediate images: there is nothing worth caching in three steps.
	engine_flags+=(--isolation=chroot --layers=false)
fi
"$ENGINE" build "${engine_flags[@]}" \
	--build-arg "BASE=$base" \
	--build-arg "VERSION=$version" \
	--build-arg "REVISION=$revision" \
	--build-arg "SOURCE=$source_url" \
	-f Dockerfile -t "$IMAGE" "$context" >&2
say "built $IMAGE (csi-provisioner $version, FROM $base)"
echo "$IMAGE"
