#!/bin/sh
# The linker scripts/image.sh gives cargo for a target cross-built with zig:
# cargo-zigbuild's own `zig cc` wrapper (which it leaves in CC_<target> for
# build scripts), less `--strip-debug`. The release profile's
# `strip = "debuginfo"` makes rustc pass that flag, and zig takes it for
# strip-all (ziglang/zig#23823): the binary would lose the symbol table that
# `--enable-pprof` names functions from. scripts/image.sh strips the debug
# sections afterwards instead (`llvm-objcopy --strip-debug`).
#
#   ZIG_LINK_TARGET  the rust target with `_` for `-` (aarch64_unknown_linux_musl)
set -eu
eval "cc=\${CC_$ZIG_LINK_TARGET:?CC_$ZIG_LINK_TARGET is not set: run under cargo-zigbuild}"
for arg; do
	shift
	case $arg in
		-Wl,--strip-debug | -Wl,-S | --strip-debug) ;;
		*) set -- "$@" "$arg" ;;
	esac
done
exec "$cc" "$@"
