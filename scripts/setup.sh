#!/usr/bin/env bash
# The first command on a fresh Debian 12 machine: installs what is missing,
# builds troupe in build/ and runs the main job (build/apps/troupe-demo:
# verifies every collective and times them) as soon as it is built, then
# builds the rest (tests, benchmarks, the PyTorch bridge).
#
#   bash scripts/setup.sh              install + build + run the demo + build the rest
#   bash scripts/setup.sh --build-only install + build everything (used by scripts/test.sh)
#
# Extra arguments after --  go to troupe-demo (e.g. -- --ranks 2 --quick).
#
# Order, for the demo's table to come early: the packages the library needs
# first, then the library, troupe-run and the demo; the demo runs while
# nothing else competes for the CPUs; then the other packages (the
# benchmark's peers, the PyTorch bridge's) install while the tests build,
# and a second configure picks them up.
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=0
demo_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build-only) build_only=1 ;;
    --) shift; demo_args=("$@"); break ;;
    *) echo "setup.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done

# What the library, the demo and the tests need.
core=(libcaf-dev doctest-dev libdlpack-dev libeigen3-dev cmake ninja-build g++)
# The benchmark's peers and plots (bench/run_bench.sh): Gloo, OpenMPI,
# gnuplot; the PyTorch bridge (pytorch/): LibTorch, PyTorch for
# /usr/bin/python3, pybind11.
rest=(libgloo-dev libopenmpi-dev openmpi-bin gnuplot-nox
      libtorch-dev python3-torch python3-dev pybind11-dev)

missing() {
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done
}

# Installs the missing packages of "$@" (only touches apt when one is missing).
install() {
  local need
  need=$(missing "$@")
  if [ -z "$need" ]; then
    echo "setup.sh: packages present ($*)"
    return 0
  fi
  echo "setup.sh: installing" $need
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  if [ ! -f /tmp/troupe-apt-updated ]; then
    "${sudo[@]}" apt-get update && touch /tmp/troupe-apt-updated
  fi
  # shellcheck disable=SC2086
  "${sudo[@]}" apt-get install -y --no-install-recommends $need
}

configure() {
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
}

jobs=$(nproc)
start=$(date +%s)

# 1. The main job: the library, the launcher and the demo.
install "${core[@]}"
configure
cmake --build build -j"$jobs" --target troupe-demo troupe-run
if [ "$build_only" -eq 0 ]; then
  echo "setup.sh: the demo starts $(( $(date +%s) - start )) s after setup began"
  build/apps/troupe-demo "${demo_args[@]}"
fi

# 2. The rest: the other packages install while everything the first
# configuration knows builds; then a second configuration finds them.
if [ -n "$(missing "${rest[@]}")" ]; then
  install "${rest[@]}" > build/setup-apt.log 2>&1 &
  apt_pid=$!
  cmake --build build -j"$jobs"
  if ! wait "$apt_pid"; then
    cat build/setup-apt.log >&2
    echo "setup.sh: installing ${rest[*]} failed" >&2
    exit 1
  fi
  configure
fi
cmake --build build -j"$jobs"
echo "setup.sh: set up in $(( $(date +%s) - start )) s"
