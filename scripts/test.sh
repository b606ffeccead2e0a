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
# Three at a time on two cores: many tests wait (on peers, timeouts, forked
# processes starting) as much as they compute.
ctest --test-dir build --output-on-failure -j3 --timeout 600
