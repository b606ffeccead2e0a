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
# Two tests per core: most of the suite's tests spend much of their time
# waiting (on timeouts they test, on processes starting), so the cores stay
# busy only with more than one each. The timed failure tests keep margins for
# a loaded machine (the detector runs off the application's threads). The
# longest start first (their COST: a fresh build has no timings).
ctest --test-dir build --output-on-failure -j"$((2 * $(nproc)))" --timeout 600
