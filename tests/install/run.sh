#!/usr/bin/env bash
# install_find_package: installs the build into a temporary prefix, builds
# tests/install against it with find_package(troupe), and runs the result.
#   run.sh <build dir> <source dir>
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/troupe-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix"
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
cmake -S "$src/tests/install" -B "$tmp/build" "${generator[@]}" \
      -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$tmp/build"
# The library lands in lib/ or lib/<multiarch>/ depending on GNUInstallDirs.
libdirs=$(find "$tmp/prefix" -name 'libtroupe.so*' -printf '%h\n' | sort -u | paste -sd:)
LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmp/build/install_main"
