#!/usr/bin/env bash
# Long fuzzing runs of what peers and strangers send to a rank (ctest runs
# each for a fixed small budget):
#
#   scripts/fuzz_frames.sh [--minutes M | --seconds S] [--build DIR] [--libfuzzer] [--seed X]
#
#  1. the seeded mutation loops of the frame decoder and of the handshake and
#     store wire decoders (fuzz/), M minutes each; the seed (from the clock
#     unless --seed) is printed, and the same seed replays the same inputs;
#  2. a token-holding peer sending mutated frames to two ranks of a
#     three-process world (test_peer_frames), for about M minutes;
#  3. with --libfuzzer: the same decoders as libFuzzer targets built with
#     clang (AddressSanitizer, UndefinedBehaviorSanitizer) into
#     DIR/fuzz-libfuzzer, M minutes each; findings land there (crash-*).
#     Needs clang and libFuzzer (Debian: apt-get install -y clang
#     libclang-rt-14-dev); skipped with a note otherwise.
# DIR (default build/) must hold a build of troupe.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=10
build=build
libfuzzer=0
seed=$(date +%s)
seconds=""
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --libfuzzer) libfuzzer=1; shift ;;
    --seed) seed="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "fuzz_frames.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$seconds" ] || seconds=$((minutes * 60))

cmake --build "$build" --target fuzz_frames_mutate fuzz_handshakes_mutate test_peer_frames

echo "== mutation loops, ${seconds} s each, seed ${seed}"
for target in frames handshakes; do
  "$build/fuzz/fuzz_${target}_mutate" --seconds "$seconds" --seed "$seed"
done

echo "== a token-holding peer sending mutated frames, about ${seconds} s"
# About 10 rounds a second on 2 cores.
TROUPE_FUZZ_ROUNDS=$((seconds * 10)) "$build/tests/test_peer_frames" -tc='*mutated frames*'

if [ "$libfuzzer" = 1 ]; then
  if ! command -v clang++ > /dev/null; then
    echo "== libFuzzer: skipped (no clang++; apt-get install -y clang libclang-rt-14-dev)"
    exit 0
  fi
  out="$build/fuzz-libfuzzer"
  mkdir -p "$out"
  lib="$(cd "$build" && pwd)"
  for target in frames handshakes; do
    case "$target" in
      frames) sources="transport/frame.cpp" ;;
      handshakes) sources="transport/handshake.cpp store/store_wire.cpp" ;;
    esac
    # The decoders compiled in, instrumented; the rest of troupe from the build.
    if ! clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -I. -Iinclude \
         "fuzz/${target}_target.cpp" $sources -L"$lib" -ltroupe -Wl,-rpath,"$lib" \
         -o "$out/fuzz_${target}"; then
      echo "== libFuzzer: skipped (clang++ cannot build with -fsanitize=fuzzer;" \
           "apt-get install -y libclang-rt-14-dev)"
      exit 0
    fi
    corpus="$out/corpus-${target}"
    mkdir -p "$corpus"
    "$build/fuzz/fuzz_${target}_mutate" --write-seeds "$corpus"
    echo "== libFuzzer ${target}, ${seconds} s"
    (cd "$out" && "./fuzz_${target}" -max_total_time="$seconds" -rss_limit_mb=2048 \
       -max_len=65536 -print_final_stats=1 "corpus-${target}")
  done
fi
