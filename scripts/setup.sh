#!/usr/bin/env bash
# The first command on a fresh Debian 12 machine: installs what is missing,
# configures and builds troupe in build/, then runs the main job
# (build/apps/troupe-demo: verifies every collective and times them).
#
#   bash scripts/setup.sh              install + build + run the demo
#   bash scripts/setup.sh --build-only install + build (used by scripts/test.sh)
#
# Extra arguments after --  go to troupe-demo (e.g. -- --ranks 2 --quick).
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

# 1. Packages: only touch apt when something is missing.
# The benchmark's peers and plots (bench/run_bench.sh): Gloo, OpenMPI, gnuplot.
# The PyTorch bridge (pytorch/): LibTorch, PyTorch for /usr/bin/python3, pybind11.
packages=(libcaf-dev doctest-dev libdlpack-dev libeigen3-dev cmake ninja-build g++
          libgloo-dev libopenmpi-dev openmpi-bin gnuplot-nox
          libtorch-dev python3-torch python3-dev pybind11-dev)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg -s "$p" >/dev/null 2>&1; then missing+=("$p"); fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update
  "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "setup.sh: packages present (${packages[*]})"
fi

# 2. Configure and build.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$(nproc)"

# 3. The main job.
if [ "$build_only" -eq 0 ]; then
  build/apps/troupe-demo "${demo_args[@]}"
fi
