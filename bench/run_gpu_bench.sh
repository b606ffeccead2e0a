#!/usr/bin/env bash
# The GPU benchmark in one command: builds gpu_bench if needed, measures
# PyTorch's one-rank ProcessGroupNCCL allreduce of 4 bytes
# (bench/torch_nccl_bench.py) when PyTorch sees a GPU, then runs gpu_bench,
# which prints one table per part and the targets (see the top of
# bench/gpu_bench.cpp): allreduce bus bandwidth by size (troupe's nccl backend
# on one rank, its actor backend with 2 and 4 ranks sharing cuda:0), the
# overhead of a 4-byte allreduce against raw NCCL and PyTorch, troupe's
# reduction kernel against a device-to-device copy, and 2 ranks sharing the
# GPU against that copy.
#
#   bash bench/run_gpu_bench.sh [--quick] [--iters N] [--build-dir DIR]
#
# --quick stops the allreduce sizes at 16 MiB and shortens the iterations;
# --iters N sets every measurement's timed iterations; --build-dir picks the
# build (default build/, configured with Ninja when new). Writes to bench/out/:
# gpu_results.csv (one row per measurement: part,system,ranks,bytes,time_us,
# busbw_GBps,note), gpu_tables.txt (what gpu_bench prints) and gpu_torch.log
# (PyTorch's run). Without CUDA at build time, or without a usable device,
# it says why and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=()
iters=()
build=build
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=(--quick) ;;
    --iters) iters=(--iters "$2"); shift ;;
    --build-dir) build="$2"; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "run_gpu_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
out=bench/out
mkdir -p "$out"
csv="$out/gpu_results.csv"
rm -f "$csv" "$out/gpu_tables.txt" "$out/gpu_torch.log"

# 1. Configure (again, so that a CUDA installed since is found) and build.
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
else
  cmake -S . -B "$build" >/dev/null
fi
if ! grep -qs 'gpu_bench' "$build/build.ninja" "$build/bench/Makefile"; then
  echo "run_gpu_bench: GPU benchmark skipped: $build has no GPU path (no CUDA toolkit found" \
       "when it was configured; see cmake/cuda.cmake)"
  exit 0
fi
if ! cmake --build "$build" -j"$(nproc)" --target gpu_bench >"$out/gpu_build.log" 2>&1; then
  tail -n 30 "$out/gpu_build.log" >&2
  echo "run_gpu_bench: building gpu_bench FAILED (see $out/gpu_build.log)" >&2
  exit 1
fi

# 2. PyTorch's 4-byte allreduce, when PyTorch can use a GPU.
torch=()
if python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
  torch_args=()
  [ ${#quick[@]} -gt 0 ] && torch_args=(--warmup 50 --iters 500)
  [ ${#iters[@]} -gt 0 ] && torch_args+=(--iters "${iters[1]}")
  if python3 bench/torch_nccl_bench.py "${torch_args[@]}" >"$out/gpu_torch.log" 2>&1; then
    us=$(awk '$1 == "torch_nccl_4B_us" { print $2 }' "$out/gpu_torch.log")
    if [ -n "$us" ]; then
      torch=(--torch-us "$us")
      echo "run_gpu_bench: PyTorch: $(grep -m1 '^torch ' "$out/gpu_torch.log" || true)"
    else
      echo "run_gpu_bench: torch_nccl_bench.py printed no time (see $out/gpu_torch.log)"
    fi
  else
    echo "run_gpu_bench: torch_nccl_bench.py FAILED (see $out/gpu_torch.log); PyTorch not measured"
  fi
else
  echo "run_gpu_bench: PyTorch with CUDA is not available: PyTorch not measured"
fi

# 3. The benchmark: tables and targets (also in gpu_tables.txt), rows in the CSV.
"$build/bench/gpu_bench" --csv "$csv" "${quick[@]}" "${iters[@]}" "${torch[@]}" |
  tee "$out/gpu_tables.txt"
[ -f "$csv" ] && echo "run_gpu_bench: results in $csv, tables in $out/gpu_tables.txt"
exit 0
