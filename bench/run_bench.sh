#!/usr/bin/env bash
# The collectives benchmark in one command: troupe (in one process, one
# process per rank over shared memory, forced TCP), Gloo (TCP on loopback) and
# OpenMPI (shared memory, TCP on loopback), 2 and 4 ranks, in the same run,
# next to a single-thread memcpy at the same sizes, the raw TCP exchange of
# two processes on loopback (tcp_exchange: the ceiling of a 2-rank allreduce
# over TCP; with more ranks, the bytes of a ring allreduce moved round a ring
# of processes: the ceiling of theirs) and the peak resident memory of each
# rank during a 64 MiB allreduce, and a flag barrier of the processes in
# shared memory (flag_barrier: the least time of a collective whose every rank
# must hear from every other, as troupe's do).
#
#   bash bench/run_bench.sh [--quick] [--ranks "2 4"] [--iters K] [--build-dir DIR]
#                           [--ops allreduce,broadcast,allgather,reduce_scatter,alltoall,
#                                 reduce,gather,scatter,barrier,pingpong,halo,heat | all]
#                           [--heat-cells C] [--no-rss] [--repeat K]
#   bash bench/run_bench.sh --hosts H [--link RATE|none] [--ranks-per-host R] [--quick]
#                           [--ops ...] [--iters K] [--repeat K] [--build-dir DIR] [--no-build]
#                           [--no-calibrate]
#
# --hosts H measures across H emulated hosts instead (bench/hosts_bench.sh: as
# root, each host its own network namespace, host name and /dev/shm, its link
# shaped to --link, default 1gbit): troupe, Gloo and OpenMPI over TCP in the
# same topology, with the bound each host's link sets, and the targets across
# hosts; the cost model's terms measured first unless --no-calibrate, the
# model set beside each measurement. Skipped (exit 77) where namespaces
# cannot be made.
#
# --quick stops at 1 MiB (whole run well under 3 minutes on 2 cores; the TCP
# exchange only at 16 MiB, under a second); the full run goes to 64 MiB. --ops picks the
# operations every worker runs: the five collectives above, reduce, gather,
# scatter (root 0), barrier (one 0-byte row), pingpong (2 ranks only; one-way
# time = round trip / 2; skipped with 4), halo (ring, a block to and from both
# neighbours; also at 8 KiB), and heat: the step of examples/heat_simulation.cpp
# (heat_bench against heat_mpi, C cells per rank, --heat-cells, default 1024;
# in one process, over shm, and OpenMPI shm). --ops all = every one of them, and
# so is the run without --ops: the added ops take about as long as the five
# collectives (full run, 2 cores, one round without RSS: the five 124 s, the
# others 95 s more), so a full run with --repeat 2 goes from about 4 to about 8
# minutes, and --quick stays well under a minute. For the five alone, as
# before: --ops allreduce,broadcast,allgather,reduce_scatter,alltoall (the
# workers' own default, without --ops, is still those five).
# --no-rss skips the peak-memory runs (one fresh process per system
# and rank count, a few 64 MiB allreduces each; also in --quick). --repeat K
# (default 2) measures every system K times, one round after another; the
# report keeps each cell's lower median (the machine has windows of seconds
# in which memory is several times slower: one round may fall into one). Builds what
# is missing (installs nothing: scripts/setup.sh installs the peers), then
# writes to bench/out/: results.csv (every system's records, memcpy's and
# tcp-ceiling's and flag-barrier's), rss.csv (peak RSS per system and rank count), tables.txt
# (what is printed: one table per op, the heat step's, memcpy and allreduce/memcpy,
# peak RSS, targets met / missed / out of reach with the TCP ceiling and the
# memory-bandwidth bound), busbw_<op>_<n>ranks.png (gnuplot) and logs/ (each
# run's output). A system that is not installed is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=()
ranks="2 4"
iters=()
build=build
ops=()
rss=1
repeat=2
heat=0
heat_cells=1024
hosts_args=()  # --hosts and what goes with it: bench/hosts_bench.sh runs instead
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts | --link | --ranks-per-host) hosts_args+=("$1" "$2"); shift ;;
    --no-build | --no-calibrate) hosts_args+=("$1") ;;  # across hosts only
    --quick) quick=(--quick) ;;
    --ranks) ranks="$2"; shift ;;
    --iters) iters=(--iters "$2"); shift ;;
    --build-dir) build="$2"; shift ;;
    --ops) ops=(--ops "$2"); shift ;;
    --heat-cells)
      heat_cells="$2"
      [[ "$heat_cells" =~ ^[1-9][0-9]*$ ]] || { echo "run_bench.sh: --heat-cells: expected a positive integer, got '$heat_cells'" >&2; exit 2; }
      shift ;;
    --no-rss) rss=0 ;;
    --repeat)
      repeat="$2"
      [[ "$repeat" =~ ^[1-9][0-9]*$ ]] || { echo "run_bench.sh: --repeat: expected a positive integer, got '$repeat'" >&2; exit 2; }
      shift ;;
    -h|--help) sed -n '2,54p' "$0"; exit 0 ;;
    *) echo "run_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
if [ ${#hosts_args[@]} -gt 0 ]; then
  [[ " ${hosts_args[*]} " == *" --hosts "* ]] ||
    { echo "run_bench.sh: --link and --ranks-per-host go with --hosts H" >&2; exit 2; }
  exec bash bench/hosts_bench.sh "${hosts_args[@]}" "${quick[@]}" "${iters[@]}" "${ops[@]}" \
    --repeat "$repeat" --build-dir "$build"
fi
collectives=1                            # whether the workers run (not for --ops heat alone)
[ ${#ops[@]} -gt 0 ] || ops=(--ops all)  # the default: every op and heat
# The workers check too; fail before building.
known="allreduce broadcast allgather reduce_scatter alltoall reduce gather scatter barrier"
known+=" pingpong halo heat"
[ -n "${ops[1]}" ] || { echo "run_bench.sh: --ops: empty list (known: $known, all)" >&2; exit 2; }
if [ "${ops[1]}" = all ]; then
  heat=1
else
  # heat is this script's (heat_bench, heat_mpi); the rest goes to the workers.
  IFS=, read -ra picked <<<"${ops[1]}"
  rest=()
  for o in "${picked[@]}"; do
    if [[ " $known " != *" $o "* ]]; then
      echo "run_bench.sh: --ops: unknown collective '$o' (known: ${known// /, }, all)" >&2
      exit 2
    fi
    if [ "$o" = heat ]; then heat=1; else rest+=("$o"); fi
  done
  if [ ${#rest[@]} -eq 0 ]; then
    collectives=0
    ops=()
  else
    ops=(--ops "$(IFS=,; echo "${rest[*]}")")
  fi
fi
start=$(date +%s)

# 1. Configure (again, so peers installed since are found) and build.
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
else
  cmake -S . -B "$build" >/dev/null
fi
has_target() { grep -qs "$1" "$build/build.ninja" "$build/bench/Makefile"; }
targets=(troupe_bench_worker tcp_exchange flag_barrier bench_report troupe-run heat_bench)
has_target gloo_bench_worker && targets+=(gloo_bench_worker)
has_target mpi_bench_worker && targets+=(mpi_bench_worker heat_mpi)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >/dev/null

# 2. Every system for every rank count; rank 0 of each run appends to the CSV.
out=bench/out
mkdir -p "$out/logs"
csv="$out/results.csv"
rss_csv="$out/rss.csv"
rm -f "$csv" "$rss_csv" "$out"/busbw_*.png "$out"/busbw_*.dat "$out/plots.gp" "$out"/logs/*.log
worker=("$build/bench/troupe_bench_worker")
common=(--csv "$csv" "${quick[@]}" "${iters[@]}" "${ops[@]}")
rss_args=(--rss --csv "$rss_csv")
limit=$([ ${#quick[@]} -gt 0 ] && echo 150 || echo 900)  # seconds per run
# Placement: every system as its users run it by default. troupe-run binds each
# rank to a CPU (--bind auto: round robin with more ranks than CPUs); mpirun
# binds to core for 2 ranks and, with more ranks than CPUs, needs
# --oversubscribe --bind-to none to start them. Gloo has no launcher:
# under torchrun its ranks are not bound (bound, its transport thread and the
# caller share one CPU and a 64 KiB allreduce takes 4 ms instead of 0.3).
mpirun_base=(--mca pml ob1)
[ "$(id -u)" -eq 0 ] && mpirun_base+=(--allow-run-as-root)
cpus=$(nproc)
failed=()

run() {  # run NAME COMMAND...: one system at one rank count, logged
  local name=$1 t0=$SECONDS
  shift
  printf 'run_bench: %-22s ' "$name"
  if timeout "$limit" "$@" >"$out/logs/$name.log" 2>&1; then
    echo "ok ($((SECONDS - t0)) s)"
  else
    echo "FAILED (exit $?, see $out/logs/$name.log)"
    failed+=("$name")
  fi
}

measure() {  # measure NAME COMMAND...: the collectives, then (unless --no-rss) peak RSS
  local name=$1
  shift
  [ "$collectives" -eq 0 ] || run "$name" "$@" "${common[@]}"
  [ "$rss_now" -eq 0 ] || run "${name%-r1}-rss" "$@" "${rss_args[@]}"
}
heat_args=(--csv "$csv" --cells "$heat_cells" "${quick[@]}")
have_mpi() { [ -x "$build/bench/mpi_bench_worker" ] && command -v mpirun >/dev/null; }

for round in $(seq 1 "$repeat"); do
  tag=""
  [ "$repeat" -eq 1 ] || tag="-r$round"
  rss_now=$rss  # peak memory once, in the first round
  [ "$round" -eq 1 ] || rss_now=0
  # memcpy, one thread, at the same sizes: the reference of the bandwidths.
  run "memcpy$tag" "${worker[@]}" --memcpy --csv "$csv" "${quick[@]}" "${iters[@]}"
  # Two processes exchanging N bytes each way over one loopback TCP connection,
  # no troupe (16 and 64 MiB; --quick: 16 MiB): the TCP ceiling of the targets.
  run "tcp-ceiling$tag" "$build/bench/tcp_exchange" --csv "$csv" "${quick[@]}" "${iters[@]}"
  for n in $ranks; do
    # More ranks: the bytes of a ring allreduce moved round a ring of n
    # processes over loopback TCP (no troupe): the ceiling of n-rank TCP targets.
    [ "$n" -le 2 ] || [ "$collectives" -eq 0 ] ||
      run "tcp-ceiling-${n}$tag" "$build/bench/tcp_exchange" --ranks "$n" --csv "$csv" \
        "${quick[@]}" "${iters[@]}"
    # The plainest barrier of n processes in shared memory (no troupe): the
    # least time of a collective of theirs (every rank hears every rank).
    [ "$collectives" -eq 0 ] ||
      run "flag-barrier-${n}$tag" "$build/bench/flag_barrier" --ranks "$n" --csv "$csv"
    measure "troupe-inproc-${n}$tag" "${worker[@]}" --inprocess "$n"
    for t in shm tcp; do
      measure "troupe-${t}-${n}$tag" env TROUPE_TRANSPORT=$t "$build/apps/troupe-run" -n "$n" \
        "${worker[@]}"
    done
    # allreduce once more on tensors kept private (TROUPE_SHARE_IN_PLACE=off):
    # staged through the segment, as borrowed memory is.
    [ "$collectives" -eq 0 ] ||
      run "troupe-shmstaged-${n}$tag" env TROUPE_TRANSPORT=shm "$build/apps/troupe-run" -n "$n" \
        "${worker[@]}" --transport shmstaged "${common[@]}" --ops allreduce
    if [ -x "$build/bench/gloo_bench_worker" ]; then
      measure "gloo-tcp-${n}$tag" "$build/bench/gloo_bench_worker" --ranks "$n"
    else
      echo "run_bench: gloo skipped (not built: apt-get install libgloo-dev, then rebuild)"
    fi
    mpirun_args=("${mpirun_base[@]}" --bind-to core)
    [ "$n" -le "$cpus" ] || mpirun_args=("${mpirun_base[@]}" --oversubscribe --bind-to none)
    if have_mpi; then
      measure "mpi-shm-${n}$tag" mpirun "${mpirun_args[@]}" --mca btl self,vader -n "$n" \
        "$build/bench/mpi_bench_worker" --transport shm
      measure "mpi-tcp-${n}$tag" mpirun "${mpirun_args[@]}" --mca btl self,tcp \
        --mca btl_tcp_if_include lo -n "$n" "$build/bench/mpi_bench_worker" --transport tcp
    else
      echo "run_bench: mpi skipped (not built: apt-get install libopenmpi-dev openmpi-bin)"
    fi
    # The heat simulation's step (--ops heat or all): troupe in one process and
    # over shared memory, OpenMPI over shared memory.
    if [ "$heat" -eq 1 ]; then
      run "heat-troupe-inproc-${n}$tag" "$build/bench/heat_bench" --inprocess "$n" "${heat_args[@]}"
      run "heat-troupe-shm-${n}$tag" env TROUPE_TRANSPORT=shm "$build/apps/troupe-run" -n "$n" \
        "$build/bench/heat_bench" "${heat_args[@]}"
      if have_mpi && [ -x "$build/bench/heat_mpi" ]; then
        run "heat-mpi-shm-${n}$tag" mpirun "${mpirun_args[@]}" --mca btl self,vader -n "$n" \
          "$build/bench/heat_mpi" --transport shm "${heat_args[@]}"
      else
        echo "run_bench: heat_mpi skipped (not built: apt-get install libopenmpi-dev openmpi-bin)"
      fi
    fi
  done
done

# 3. Tables, targets and plots.
if [ -f "$csv" ]; then
  report_rss=()
  [ -f "$rss_csv" ] && report_rss=(--rss "$rss_csv")
  "$build/bench/bench_report" "$csv" --plots "$out" "${report_rss[@]}" | tee "$out/tables.txt"
  if command -v gnuplot >/dev/null; then
    (cd "$out" && gnuplot plots.gp) && echo "run_bench: plots in $out/busbw_<op>_<n>ranks.png"
  else
    echo "run_bench: gnuplot not installed (apt-get install gnuplot-nox): no plots"
  fi
fi
echo "run_bench: results in $csv; $(($(date +%s) - start)) s in all"
if [ ${#failed[@]} -gt 0 ]; then
  echo "run_bench: FAILED: ${failed[*]}" >&2
  exit 1
fi
