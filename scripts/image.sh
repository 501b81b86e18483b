#!/usr/bin/env bash
# `make image`: the sidecar's container image for each architecture, built as
# upstream builds its own: static binaries compiled on the host, copied into a
# base image by the Dockerfile at the root, then one multi-arch manifest list.
# tests/image.rs runs this same script.
#
#   IMAGE   the manifest list to build (default csi-provisioner:dev); each
#           architecture's image is also tagged IMAGE-ARCH
#   ARCHES  architectures, upstream's names (default: amd64 arm64; `all`:
#           upstream's five, amd64 arm64 arm ppc64le s390x; see below)
#   BASE    base image (default: the Dockerfile's, upstream's
#           gcr.io/distroless/static:latest, when it is in local storage;
#           otherwise scratch, which needs no registry: see below)
#   ENGINE  podman (default) or docker
#   NIGHTLY the toolchain for arm, ppc64le and s390x (default nightly; see below)
#
# `scripts/image.sh --packages` only installs the Debian packages below.
# `scripts/image.sh --binaries-only` stops after the static binaries and the
# SBOMs, and prints one line per architecture: `ARCH PATH` (`make test` builds
# them before the tests, so that tests/image.rs does not compile release
# builds while the other tests run).
#
# Architectures: amd64 is compiled with musl-gcc, the others with zig as the
# cross C compiler and linker (cargo-zigbuild; zig from PyPI's `ziglang`).
# Upstream also ships arm, ppc64le and s390x. rustup serves no standard
# library for their musl targets on the project's machines:
#   rustup target add armv7-unknown-linux-musleabihf   (so too
#   powerpc64le-unknown-linux-musl, arm-unknown-linux-musleabihf)
#     error: component download failed for rust-std-armv7-unknown-linux-musleabihf:
#     ... http request returned an unsuccessful status code: 404
#   rustup target add s390x-unknown-linux-musl   (tier 3: none is prebuilt)
#     error: toolchain 'stable-x86_64-unknown-linux-gnu' has no prebuilt
#     artifacts available for target 's390x-unknown-linux-musl'
# so for those the standard library is compiled from source with the rest
# (NIGHTLY, default `nightly`, with its rust-src: -Zbuild-std is unstable),
# linked against zig's own musl. They are not in the default ARCHES: each is
# one more release build of everything, std included.
# s390x builds since the profiler is rpprof (Cargo.toml says why): pprof-rs'
# nix 0.26 did not compile for it,
#   error[E0428]: the name `fs_type_t` is defined multiple times
#     --> nix-0.26.4/src/sys/statfs.rs:68:1
#
# Everything the build needs is installed here if missing, because CI starts
# from a clean clone: the rust targets, musl-tools, llvm (llvm-objcopy), podman
# and qemu-user-static (Debian), and zig, cargo-zigbuild and cargo-cyclonedx
# into a tools directory kept across runs (TOOLS, default
# ~/.cache/csi-provisioner-tools). The
# release builds go to a target directory kept across runs as well
# (IMAGE_TARGET_DIR, default ~/.cache/csi-provisioner-image/target), so a
# fresh clone on the same machine only recompiles this crate.
set -euo pipefail
# A failed build inside `binary[...]=$(build ...)` must stop the script too.
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-csi-provisioner:dev}
ENGINE=${ENGINE:-podman}
ARCHES=${ARCHES:-amd64 arm64}
if [ "$ARCHES" = all ]; then ARCHES="amd64 arm64 arm ppc64le s390x"; fi
NIGHTLY=${NIGHTLY:-nightly}
TOOLS=${TOOLS:-$HOME/.cache/csi-provisioner-tools}
ZIG_VERSION=0.15.2
ZIGBUILD_VERSION=0.24.1
CYCLONEDX_VERSION=0.5.9
export CARGO_TARGET_DIR=${IMAGE_TARGET_DIR:-$HOME/.cache/csi-provisioner-image/target}
default_base=$(sed -n 's/^ARG BASE=//p' Dockerfile)
out=target/image

say() { echo "image.sh: $*" >&2; }

rust_target() {
	case $1 in
		amd64) echo x86_64-unknown-linux-musl ;;
		arm64) echo aarch64-unknown-linux-musl ;;
		arm) echo armv7-unknown-linux-musleabihf ;;
		ppc64le) echo powerpc64le-unknown-linux-musl ;;
		s390x) echo s390x-unknown-linux-musl ;;
		*) say "unknown architecture $1 (amd64, arm64, arm, ppc64le, s390x)"; exit 2 ;;
	esac
}

# Whether an architecture's standard library is compiled here (see above).
from_source() {
	case $1 in
		arm | ppc64le | s390x) return 0 ;;
		*) return 1 ;;
	esac
}

# A Debian package, when its command is missing (as root, as CI runs).
debian() {
	local command=$1 package=$2
	command -v "$command" >/dev/null && return
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		say "installing $package"
		# Waiting for dpkg's lock: the tests run this script twice at once.
		local apt=(apt-get -o DPkg::Lock::Timeout=600)
		"${apt[@]}" install -y -qq "$package" >&2 || { "${apt[@]}" update -qq >&2 && "${apt[@]}" install -y -qq "$package" >&2; }
	else
		say "$command is missing: install $package (Debian/Ubuntu)"
		return 1
	fi
}

# A cargo tool at a pinned version, built once into $TOOLS.
cargo_tool() {
	local crate=$1 version=$2
	local bin="$TOOLS/bin/$crate"
	# cargo-zigbuild answers `--version`, cargo-cyclonedx only `cyclonedx --version`.
	if ! { "$bin" --version || "$bin" "${crate#cargo-}" --version; } 2>/dev/null | grep -qx "[a-z-]* $version"; then
		say "installing $crate $version into $TOOLS"
		env -u CARGO_TARGET_DIR cargo install --locked --quiet --root "$TOOLS" "$crate@$version" >&2
	fi
}

# 1. Debian's packages. `--packages` stops after them: `make test` has them
# installed while it compiles other things (they are downloads, not work for
# the CPU).
debian musl-gcc musl-tools
# tests/image.rs runs each foreign binary under user-mode emulation (the
# package has every architecture's emulator).
if [ "$ARCHES" != amd64 ]; then
	debian qemu-aarch64-static qemu-user-static
	debian llvm-objcopy llvm
fi
# The engine too, although --binaries-only does not use it: `make test` runs
# that first, and tests/image.rs then builds the image with the engine there.
# Where it cannot be installed (not root, no apt-get, no such package) only
# the image is left out: --binaries-only goes on, and the test says why it
# skips; a build of the image stops here.
if ! debian "$ENGINE" "$ENGINE"; then
	[[ ${1:-} == --binaries-only || ${1:-} == --packages ]] || exit 1
	say "$ENGINE could not be installed here: tests/image.rs will not check the image itself"
fi
if [ "${1:-}" = --packages ]; then exit 0; fi

# 2. The toolchain.
installed_targets=$(rustup target list --installed 2>/dev/null || true)
for arch in $ARCHES; do
	target=$(rust_target "$arch")
	if from_source "$arch"; then
		if ! rustup component list --installed --toolchain "$NIGHTLY" 2>/dev/null | grep -q '^rust-src'; then
			say "installing the $NIGHTLY toolchain's rust-src (the standard library of $target is built from it)"
			rustup toolchain install "$NIGHTLY" --profile minimal --component rust-src >&2
		fi
	elif ! grep -qx "$target" <<<"$installed_targets"; then
		command -v rustup >/dev/null || { say "the $target target is missing and rustup is not installed"; exit 1; }
		say "adding the rust target $target"
		rustup target add "$target" >&2 || { say "no standard library for $target: leave $arch out of ARCHES"; exit 1; }
	fi
done
zig_dir="$TOOLS/ziglang-$ZIG_VERSION/ziglang"
if [ "$ARCHES" != amd64 ]; then
	if [ ! -x "$zig_dir/zig" ]; then
		say "installing zig $ZIG_VERSION (PyPI ziglang) into $TOOLS"
		python3 -m pip install --quiet --disable-pip-version-check --target "$TOOLS/ziglang-$ZIG_VERSION" "ziglang==$ZIG_VERSION" >&2
	fi
	cargo_tool cargo-zigbuild "$ZIGBUILD_VERSION"
fi
cargo_tool cargo-cyclonedx "$CYCLONEDX_VERSION"

# 3. The static binaries, each staged as target/image/ARCH/csi-provisioner
# (what the image gets). The cross builds link through scripts/zig-link.sh,
# copied to a path that stays the same across clones: cargo rebuilds every
# crate when a target's linker path changes.
link="$TOOLS/bin/zig-link"
if [ "$ARCHES" != amd64 ] && ! cmp -s scripts/zig-link.sh "$link"; then
	mkdir -p "$TOOLS/bin"
	install -m 0755 scripts/zig-link.sh "$link"
fi
build() {
	local arch=$1 target env_target built staged
	target=$(rust_target "$arch")
	env_target=${target//-/_}
	built="$CARGO_TARGET_DIR/$target/release/csi-provisioner"
	staged="$out/$arch/csi-provisioner"
	mkdir -p "$out/$arch"
	if [ "$arch" = amd64 ]; then
		CC_x86_64_unknown_linux_musl=musl-gcc \
			cargo build --release --locked --target "$target" -p csi-provisioner --bin csi-provisioner >&2
		install -m 0755 "$built" "$staged.$$"
	else
		local from_source=()
		if from_source "$arch"; then
			# The standard library from source; its C start-up files from zig's
			# musl, since rustup's self-contained ones come with the rust-std
			# component this target does not have.
			# cargo-zigbuild runs $CARGO when set, as it is under `cargo test`:
			# that is stable's cargo, which refuses -Z.
			from_source=(-u CARGO RUSTUP_TOOLCHAIN="$NIGHTLY" "RUSTFLAGS=-C link-self-contained=no")
		fi
		env "${from_source[@]}" "CARGO_TARGET_${env_target^^}_LINKER=$link" ZIG_LINK_TARGET="$env_target" \
			PATH="$zig_dir:$PATH" "$TOOLS/bin/cargo-zigbuild" zigbuild \
			${from_source:+-Zbuild-std=std,panic_abort} \
			--release --locked --target "$target" -p csi-provisioner --bin csi-provisioner >&2
		# The profile's `strip = "debuginfo"`, which zig-link.sh kept from zig.
		# llvm-objcopy reads every architecture; `zig objcopy --strip-debug`
		# answers `error: unimplemented` on this binary, and Debian's objcopy
		# knows only x86.
		llvm-objcopy --strip-debug "$built" "$staged.$$"
		chmod 0755 "$staged.$$"
	fi
	# A rename: a run of this script at the same time (the tests) may be running the last one.
	mv "$staged.$$" "$staged"
	echo "$PWD/$staged"
}

# A dynamically linked binary would not start in a base without a libc: its
# program headers must have no PT_INTERP (type 3), the loader request. Reads
# either byte order (s390x is big-endian) and either class (arm is 32-bit).
is_static() {
	local f=$1 class endian phoff phentsize phnum i type
	[ "$(od -An -tx1 -N4 "$f" | tr -d ' ')" = 7f454c46 ] || return 1
	class=$(od -An -tu1 -j4 -N1 "$f" | tr -d ' ')
	endian=$(od -An -tu1 -j5 -N1 "$f" | tr -d ' ')
	word() { # offset size
		local bytes
		bytes=$(od -An -tx1 -j"$1" -N"$2" "$f" | tr -d ' \n')
		[ "$endian" = 1 ] && bytes=$(echo "$bytes" | fold -w2 | tac | tr -d '\n')
		echo $((16#$bytes))
	}
	if [ "$class" = 1 ]; then
		phoff=$(word 28 4) phentsize=$(word 42 2) phnum=$(word 44 2)
	else
		phoff=$(word 32 8) phentsize=$(word 54 2) phnum=$(word 56 2)
	fi
	for ((i = 0; i < phnum; i++)); do
		type=$(word $((phoff + i * phentsize)) 4)
		[ "$type" != 3 ] || return 1
	done
}

mkdir -p "$out"
declare -A binary
for arch in $ARCHES; do
	binary[$arch]=$(build "$arch")
	is_static "${binary[$arch]}" || { say "${binary[$arch]} is not a static executable"; exit 1; }
done

# The SBOM: CycloneDX 1.5 from Cargo.lock, one per architecture: the sidecar's
# own dependencies for that target (normal ones, not build scripts' nor the
# other members'; Windows- or macOS-only crates left out), beside the binaries
# as target/image/sbom-ARCH.cdx.json and in that architecture's image.
# cargo-cyclonedx writes one file beside each member's Cargo.toml: the name is
# this run's own, so two runs at once (the tests) do not take each other's.
declare -A sbom
for arch in $ARCHES; do
	sbom[$arch]="$out/sbom-$arch.cdx.json"
	name="csi-provisioner.sbom.$$.cdx"
	"$TOOLS/bin/cargo-cyclonedx" cyclonedx --manifest-path Cargo.toml --format json --spec-version 1.5 \
		--no-build-deps --target "$(rust_target "$arch")" --override-filename "$name" --quiet >&2
	mv "$name.json" "${sbom[$arch]}"
	find . -name "$name.json" -not -path "./target/*" -delete
	say "SBOM: ${sbom[$arch]}"
done

if [ "${1:-}" = --binaries-only ]; then
	for arch in $ARCHES; do echo "$arch ${binary[$arch]}"; done
	exit 0
fi
version=$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)

# 4. The images, one per architecture, and the manifest list naming them.
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
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then revision="$revision-dirty"; fi
source_url=$(git remote get-url origin 2>/dev/null || true)
# The name local storage gives an image: a short name goes under localhost/.
qualified() {
	local first=${1%%/*}
	if [[ $1 == */* && ($first == *.* || $first == *:* || $first == localhost) ]]; then
		echo "$1"
	else
		echo "localhost/$1"
	fi
}
engine_flags=()
if [ "$ENGINE" = podman ]; then
	# chroot isolation builds where a container cannot run (no cgroups needed);
	# no intermediate images: there is nothing worth caching in three steps.
	# Nothing is run inside: no emulation is needed for a foreign architecture.
	engine_flags+=(--isolation=chroot --layers=false)
fi
# docker makes manifest lists only of pushed images: with it, the per-architecture
# images are built and tagged, and `docker manifest create` is yours after a push.
lists=$([ "$ENGINE" = podman ] && echo yes || echo no)
if [ "$lists" = yes ]; then
	podman manifest rm "$IMAGE" >/dev/null 2>&1 || podman rmi "$IMAGE" >/dev/null 2>&1 || true
	podman manifest create "$IMAGE" >/dev/null
fi
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
for arch in $ARCHES; do
	# The build context holds nothing but the binary and the SBOM.
	rm -rf "${context:?}"/*
	install -m 0755 "${binary[$arch]}" "$context/csi-provisioner"
	install -m 0644 "${sbom[$arch]}" "$context/sbom.cdx.json"
	"$ENGINE" build "${engine_flags[@]}" --platform "linux/$arch" \
		--build-arg "BASE=$base" \
		--build-arg "VERSION=$version" \
		--build-arg "REVISION=$revision" \
		--build-arg "SOURCE=$source_url" \
		-f Dockerfile -t "$IMAGE-$arch" "$context" >&2
	if [ "$lists" = yes ]; then
		podman manifest add "$IMAGE" "containers-storage:$(qualified "$IMAGE-$arch")" >/dev/null
	fi
done
say "built $IMAGE (csi-provisioner $version for $ARCHES, FROM $base)"
echo "$IMAGE"
