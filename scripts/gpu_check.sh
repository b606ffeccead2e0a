#!/usr/bin/env bash
# The GPU checks, run from a build that already exists (nothing is configured
# or compiled here): for a machine with a GPU that holds a copy of a build but
# not what it takes to make one.
#
#   bash scripts/gpu_check.sh [--build-dir DIR] [--logs DIR] [--jobs N]
#                             [--no-bench] [--quick-bench] [--timeout S]
#
#   1 tests     the gpu-labelled tests as ctest runs them: test_gpu_kernels,
#               test_gpu_device, test_gpu_nccl, and the collective suites on
#               cuda:0 (TROUPE_TEST_DEVICE=cuda) in one process and across 2
#               processes (troupe-run -n 2), N at a time (default 4).
#   2 sanitize  compute-sanitizer memcheck and racecheck on test_gpu_kernels
#               and test_gpu_device, beside the tests (any report fails; the
#               test cases that make a CUDA call fail on purpose left out).
#   3 sass      cuobjdump -sass of libtroupe: the loads of the float32
#               reduction kernel, by width (128-bit loads expected).
#   4 bench     bench/gpu_bench alone on the GPU once the rest is done (with
#               bench/torch_nccl_bench.py first where PyTorch sees a GPU).
#
# Each check prints one line (passed / FAILED / skipped, seconds, exit
# status) and writes its whole output to the logs folder (default
# gpu_check_logs/); the benchmark's tables come last. Every check runs under a
# time limit (--timeout S, default 240). Exits 0 when every check passed or
# skipped, else 1. The build's libraries (libtroupe, CAF, the CUDA runtime,
# NCCL) must be found by the loader (LD_LIBRARY_PATH where they were moved).
set -uo pipefail
cd "$(dirname "$0")/.."

build=build
logs=gpu_check_logs
jobs=4
bench=1
quick=()
limit=240
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$2"; shift ;;
    --logs) logs="$2"; shift ;;
    --jobs) jobs="$2"; shift ;;
    --no-bench) bench=0 ;;
    --quick-bench) quick=(--quick) ;;
    --timeout) limit="$2"; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$logs"
results="$logs/results.txt"
: >"$results"

# check NAME CMD...: runs CMD under the time limit, output to $logs/NAME.log,
# one result line to $results (77 = skipped, as ctest reads it).
check() {
  local name="$1"; shift
  local start=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  local verdict=passed
  if [ $rc -eq 77 ]; then verdict=skipped
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then verdict="FAILED (over ${limit}s)"
  elif [ $rc -ne 0 ]; then verdict=FAILED
  fi
  printf '%-40s %-22s %4ds  rc=%d\n' "$name" "$verdict" $((SECONDS - start)) $rc >>"$results"
}

# Runs up to $jobs checks at once.
running=0
spawn() {
  if [ $running -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
  check "$@" &
  running=$((running + 1))
}

if command -v nvidia-smi >/dev/null; then
  nvidia-smi -L >"$logs/nvidia-smi.log" 2>&1
  nvidia-smi >>"$logs/nvidia-smi.log" 2>&1
  head -n 1 "$logs/nvidia-smi.log"
else
  echo "gpu_check: no nvidia-smi here"
fi

# 1 + 2: tests and sanitizers, side by side.
tests="$build/tests"
for t in test_gpu_kernels test_gpu_device test_gpu_nccl; do
  spawn "$t" "$tests/$t"
done
for suite in test_allreduce test_allgather test_broadcast_gather test_reduce_scatter \
             test_alltoall test_p2p; do
  spawn "${suite}_cuda" env TROUPE_TEST_DEVICE=cuda "$tests/$suite"
  spawn "${suite}_2proc_cuda" env TROUPE_TEST_DEVICE=cuda "$build/apps/troupe-run" -n 2 \
        "$tests/$suite"
done
if command -v compute-sanitizer >/dev/null; then
  # The sanitizer reports every CUDA call that fails, also those the tests
  # make fail on purpose (an invalid launch): those test cases are left out.
  planted='*failed launch throws*,*turns failures into failed works*'
  sanitize=(compute-sanitizer --error-exitcode 9)
  spawn test_gpu_device_memcheck "${sanitize[@]}" --tool memcheck "$tests/test_gpu_device" \
        --test-case-exclude="$planted"
  spawn test_gpu_device_racecheck "${sanitize[@]}" --tool racecheck "$tests/test_gpu_device" \
        --test-case-exclude="$planted"
  spawn test_gpu_kernels_memcheck "${sanitize[@]}" --tool memcheck "$tests/test_gpu_kernels" \
        --test-case-exclude="$planted"
  # racecheck slows every launch down: one run per test case, side by side
  # (a name's text up to its first comma, a doctest filter's separator).
  n=0
  while IFS= read -r name; do
    n=$((n + 1))
    spawn "test_gpu_kernels_racecheck_$n" "${sanitize[@]}" --tool racecheck \
          "$tests/test_gpu_kernels" --test-case-exclude="$planted" --test-case="${name%%,*}*"
  done < <("$tests/test_gpu_kernels" --list-test-cases --no-version 2>/dev/null |
           grep -v -e '^=' -e '^\[doctest\]' -e '^$')
else
  echo "compute-sanitizer                        skipped (not installed)" >>"$results"
fi
wait
running=0

# 3: the float32 reduction kernel's loads (dtype float32 is 8 in the mangled
# name: reduce_kernel<dtype(8)>).
lib=$(ls "$build"/libtroupe.so* 2>/dev/null | head -n 1)
if command -v cuobjdump >/dev/null && [ -n "$lib" ]; then
  cuobjdump -sass "$lib" >"$logs/sass.txt" 2>&1
  awk '/Function :/ { fn = $3 }
       fn ~ /reduce_kernel/ && /LDG/ {
         w = "32"; if ($0 ~ /LDG[.A-Z0-9]*\.128/) w = "128"; else if ($0 ~ /LDG[.A-Z0-9]*\.64/) w = "64";
         n[fn " " w]++ }
       END { for (k in n) print k, n[k] }' "$logs/sass.txt" | sort >"$logs/sass_loads.txt"
  f32=$(grep -E 'dtypeE8E' "$logs/sass_loads.txt")
  if echo "$f32" | grep -q ' 128 '; then verdict=passed; else verdict=FAILED; fi
  printf '%-40s %-22s\n' "sass float32 reduce (128-bit loads)" "$verdict" >>"$results"
  echo "$f32" | sed 's/^/    loads by width: /' >>"$results"
else
  echo "sass                                     skipped (no cuobjdump or no libtroupe)" >>"$results"
fi

# 4: the benchmark, alone on the GPU.
if [ $bench -eq 1 ] && [ -x "$build/bench/gpu_bench" ]; then
  torch=()
  if python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    if timeout "$limit" python3 bench/torch_nccl_bench.py >"$logs/torch_nccl.log" 2>&1; then
      us=$(awk '$1 == "torch_nccl_4B_us" { print $2 }' "$logs/torch_nccl.log")
      [ -n "$us" ] && torch=(--torch-us "$us")
    fi
  fi
  check gpu_bench "$build/bench/gpu_bench" --csv "$logs/gpu_results.csv" "${quick[@]}" \
        "${torch[@]}"
fi

echo "== results"
cat "$results"
for f in "$logs"/*.log; do
  name=$(basename "$f" .log)
  if grep -q "^$name .*FAILED" "$results"; then
    echo "== $name (last lines)"
    tail -n 25 "$f"
  fi
done
if [ -f "$logs/gpu_bench.log" ]; then
  echo "== gpu_bench"
  cat "$logs/gpu_bench.log"
fi
! grep -q FAILED "$results"
