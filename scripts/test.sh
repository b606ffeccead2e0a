#!/usr/bin/env bash
# The second command: builds troupe if build/ does not exist yet (installing
# what is missing, as scripts/setup.sh does, without running the demo), then
# runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -f build/build.ninja ]; then
  bash scripts/setup.sh --build-only
else
  cmake --build build -j"$(nproc)"   # bring an existing build up to date
fi
# One test per core (the tests that time the failure detector expect the CPU
# they run on); the longest start first (their COST: a fresh build has no timings).
ctest --test-dir build --output-on-failure -j2 --timeout 600
