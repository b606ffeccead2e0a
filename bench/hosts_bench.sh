#!/usr/bin/env bash
# The collectives benchmark across emulated hosts (scripts/hosts.sh: a network,
# UTS and mount namespace per host, joined through a bridge, each host's link
# shaped to --link): troupe (troupe-run on every host), Gloo (its ranks on
# every host, meeting in a file store on the shared file system) and OpenMPI
# (mpirun on a launcher host, starting its daemons on the hosts through
# hosts.sh's agent; TCP alone, and shared memory inside a host + TCP across)
# in the same topology, 4 B to 64 MiB, each result checked before it is timed.
# Prints one table per collective with the link's bound, then the targets.
# run_bench.sh --hosts H runs this.
#
#   bash bench/hosts_bench.sh --hosts H [--ranks-per-host R] [--link RATE|none]
#                             [--ops allreduce,broadcast,allgather,reduce_scatter,alltoall]
#                             [--quick] [--iters K] [--repeat K] [--build-dir DIR] [--no-build]
#                             [--no-calibrate | --measure-at-start] [--peers gloo,mpi|none]
#
# --hosts H (default 2) hosts of --ranks-per-host R (default 2) ranks each;
# --link: each host's link rate, as tc writes it (1gbit, 100mbit; default
# 1gbit), or none (unshaped veth pairs through a bridge: the CPUs are the
# limit). --ops: the collectives (default the five above; every worker's op
# runs, but the link's bound is printed for these five and reduce). --quick stops at
# 1 MiB. --repeat K (default 2): every system K times, one round after
# another; the report keeps each cell's lower median. --no-build uses the
# build as it is (default: configure and build what is missing, as
# run_bench.sh does). --peers: the peers run beside troupe (default
# gloo,mpi; none: troupe alone, as when its model is checked).
#
# Calibration (unless --no-calibrate, which leaves the model's defaults):
# troupe is told what README asks a user to tell it about the hosts
# (TROUPE_LINK_COSTS), measured here first (bench_hosts_report --fit):
# between 2 hosts of one rank each (a CPU each where there are 2), unshaped,
# a 4-byte ping-pong's one-way time is the latency between hosts, and the
# CPU rate (cpu=) the one at which the model's 16 MiB allreduce of those
# two ranks takes what it measured (cpu_cached=: their 1 MiB one, which
# the cache holds); the local link's bandwidth (local=, local_cached=)
# likewise from 2 ranks of one host over the shared-memory rings (the
# message engine); where the layout's ranks share CPUs, a barrier of the
# layout itself on the tables' link says how long each hop waits for its
# CPU (hop_wait=), and an unshaped 16 MiB ping-pong between two of its
# hosts how much of a working rank's CPU the waiting ranks take
# (wait_share=); and a pairwise alltoall of 4-byte blocks of the layout on
# the tables' link the work of each further message a rank sends in a step
# (overhead=), timed as long as the tables' calls are (--min-time 600
# where ranks share CPUs, below); each twice,
# the fit taking the lower median. The report's model is told the same,
# and compared with other calls than these (About 40 s.), except that
# where ranks share CPUs its hop_wait comes from a barrier troupe's table
# launches time first (the pace of a hop there, which moved 30-40% from the
# calibrating launch's minutes apart).
# --measure-at-start instead has troupe measure them itself as a user's
# world does (TROUPE_LINK_COSTS=measure: the benchmark's own layout, at
# each world's start; api/link_measurement.hpp), and the report's model is
# told what the first troupe run measured.
#
# Placement: the hosts share this machine's CPUs, so each host runs on its own
# share of them (hosts.sh --split-cpus) when there are at least as many CPUs as
# hosts, and no launcher binds ranks (troupe-run --bind none, mpirun
# --bind-to none, and OpenMPI yields when idle when a host has more ranks than
# CPUs): every system alike, as on hosts with fewer cores than ranks.
#
# Writes bench/out/hosts_<H>x<R>_<link>.csv (every record), .txt (what is
# printed) and logs/hosts_*.log (each run's output). Exits 77 where hosts
# cannot be made (hosts.sh: not root, no namespaces); a peer that is not
# installed is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

hosts=2
per_host=2
link=1gbit
ops=allreduce,broadcast,allgather,reduce_scatter,alltoall
quick=()
iters=()
repeat=2
build=build
do_build=1
calibrate=1
peers=gloo,mpi
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift ;;
    --ranks-per-host) per_host=$2; shift ;;
    --link) link=$2; shift ;;
    --ops) ops=$2; shift ;;
    --quick) quick=(--quick) ;;
    --iters) iters=(--iters "$2"); shift ;;
    --repeat) repeat=$2; shift ;;
    --build-dir) build=$2; shift ;;
    --no-build) do_build=0 ;;
    --calibrate) calibrate=1 ;;  # the default
    --no-calibrate) calibrate=0 ;;
    --measure-at-start) calibrate=2 ;;
    --peers) peers=$2; shift ;;
    -h | --help) sed -n '2,61p' "$0"; exit 0 ;;
    *) echo "hosts_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
for v in hosts per_host repeat; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || {
    echo "hosts_bench.sh: --${v//_/-}: expected a positive integer, got '${!v}'" >&2
    exit 2
  }
done
[ "$hosts" -ge 2 ] || { echo "hosts_bench.sh: --hosts: at least 2" >&2; exit 2; }
ranks=$((hosts * per_host))
start=$(date +%s)

# 1. Build what is missing.
if [ "$do_build" -eq 1 ]; then
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  else
    cmake -S . -B "$build" >/dev/null
  fi
  has_target() { grep -qs "$1" "$build/build.ninja" "$build/bench/Makefile"; }
  targets=(troupe_bench_worker troupe-run bench_hosts_report)
  has_target gloo_bench_worker && targets+=(gloo_bench_worker)
  has_target mpi_bench_worker && targets+=(mpi_bench_worker)
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >/dev/null
fi

# 2. Can hosts be made here? (hosts.sh says why not, and exits 77.)
bash scripts/hosts.sh --hosts 1 -- true >/dev/null

out=bench/out
name="hosts_${hosts}x${per_host}_${link}"
csv="$out/$name.csv"
mkdir -p "$out/logs"
rm -f "$csv" "$out/logs/$name"-*.log
limit=$([ ${#quick[@]} -gt 0 ] && echo 300 || echo 1800)  # seconds per run
common=(--csv "$PWD/$csv" --ops "$ops" "${quick[@]}" "${iters[@]}")

cpus=$(nproc)
place=()
per_host_cpus=$cpus
if [ "$cpus" -ge "$hosts" ]; then
  place=(--split-cpus)
  per_host_cpus=$((cpus / hosts))
fi
# Where the ranks outnumber the CPUs, every system's calls are timed for at
# least 600 ms after 300 ms of warm-up (--min-time; the default window is
# 100 ms after 30): there calls switch between a fast and a slow pace in
# stretches of a hundred calls or more, and a 64 KiB allreduce's median
# over the default window moved 2x from run to run (bench_common.cpp).
window=()
[ "$ranks" -le "$cpus" ] || [ ${#quick[@]} -gt 0 ] || window=(--min-time 600)
common+=("${window[@]}")
mpi_place=(--bind-to none)
[ "$per_host" -le "$per_host_cpus" ] || mpi_place+=(--mca mpi_yield_when_idle 1)
echo "hosts_bench: $hosts hosts x $per_host ranks, link $link, $cpus CPUs:" \
  "$([ ${#place[@]} -gt 0 ] && echo "$per_host_cpus of them per host" || echo "shared by all hosts"),"\
  "no rank bound"
# troupe is told what README asks a user to tell it (TROUPE_LINK_COSTS):
# the link's rate, 95% of it (what TCP over a 1500-byte MTU leaves), and
# its shaper's bucket (burst: hosts.sh's 1 ms at the rate, at 95%), the
# terms calibrated (else the model's defaults); and, where the hosts' ranks
# outnumber the CPUs they run on, the ranks per CPU. The report's model is
# the same (its layout says the CPUs of a host).
host_cpus=$(awk -v c="$cpus" -v h="$hosts" 'BEGIN { printf "%.4f", c / h }')
hosts_sh=(bash scripts/hosts.sh --hosts "$hosts" --link "$link" --timeout "$limit" "${place[@]}")
troupe_on() {  # troupe_on HOSTS_SH_ARGS... -- RANKS_PER_HOST HOSTS WORKER_ARGS...
  local args=()
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  local n=$1 h=$2
  shift 2
  "${args[@]}" -- "${troupe_env[@]}" "$build/apps/troupe-run" -n "$n" --bind none --nnodes "$h" \
    --node-rank '{host}' --master-addr '{master}' --master-port '{port}' \
    "$build/bench/troupe_bench_worker" --transport shm+tcp "$@"
}
troupe_env=()
fitted=""
if [ "$calibrate" -eq 1 ]; then
  ccsv="$out/$name-calibration.csv"
  clog="$out/logs/$name-calibration.log"
  rm -f "$ccsv"
  # A CPU for each of the calibration's two ranks where there are two: its
  # two hosts split them, and its two ranks of one host are bound (left to
  # the scheduler, that 16 MiB allreduce took 2.2 or 6.5 ms from one run
  # to the next; bound, 2.1-2.2).
  cplace=()
  rings_bind=none
  [ "$cpus" -lt 2 ] || { cplace=(--split-cpus); rings_bind=core; }
  # Two hosts of a rank each, unshaped: the latency between hosts and what
  # a CPU moves over TCP; two ranks of one host over the shared-memory
  # rings (the message engine, as the hierarchies' stages within a host):
  # what the local link moves; then the benchmark's own layout, unshaped: a
  # 16 MiB ping-pong between two of its hosts, for how much of a working
  # rank's CPU the waiting ones take; and on the tables' link (its shaper's
  # queue is on every message's path: 2 x 2 at 2 ranks per CPU, a hop 39 us
  # unshaped, 62 us shaped to 1 Gbit/s), a barrier, for how long each hop
  # waits for a CPU that ranks share, and a pairwise alltoall of 4-byte
  # blocks, for the work of each message. Twice, as the tables' rounds: the
  # fit takes each call's lower median.
  calibration() {
    troupe_on bash scripts/hosts.sh --hosts 2 --link none --timeout 300 "${cplace[@]}" -- 1 2 \
      --csv "$PWD/$ccsv" --ops pingpong,allreduce --sizes 4B,1MiB,16MiB &&
      TROUPE_ENGINE=messages timeout 300 "$build/apps/troupe-run" -n 2 --bind "$rings_bind" \
        "$build/bench/troupe_bench_worker" --transport rings --csv "$PWD/$ccsv" --ops allreduce \
        --sizes 1MiB,16MiB &&
      troupe_on bash scripts/hosts.sh --hosts "$hosts" --link none --timeout 300 "${place[@]}" \
        -- "$per_host" "$hosts" --csv "$PWD/$ccsv" --ops pingpong --sizes 16MiB \
        "${window[@]}" &&
      local troupe_env=(env TROUPE_ALGORITHMS=alltoall=pairwise) &&
      troupe_on bash scripts/hosts.sh \
        --hosts "$hosts" --link "$link" --timeout 300 "${place[@]}" -- "$per_host" "$hosts" \
        --csv "$PWD/$ccsv" --ops barrier,alltoall --sizes 4B "${window[@]}"
  }
  if calibration >"$clog" 2>&1 && calibration >>"$clog" 2>&1; then
    fitted=$("$build/bench/bench_hosts_report" "$ccsv" --fit --hosts "$hosts" \
      --ranks-per-host "$per_host" --link "$link" --cpus-per-host "$host_cpus" 2>>"$clog") ||
      fitted=""
  fi
  if [ -n "$fitted" ]; then
    echo "hosts_bench: calibrated: $fitted"
  else
    echo "hosts_bench: calibration failed (see $clog): the model's defaults"
  fi
fi
costs=()
if [ "$calibrate" -eq 2 ]; then
  costs=(measure)
elif [ -n "$fitted" ]; then
  costs=("$fitted")
elif [ "$link" != none ]; then
  costs=("host=:$(awk -v r="$link" 'BEGIN {
    n = r + 0; u = tolower(substr(r, length(n "") + 1))
    f = u == "kbit" ? 1e3 : u == "mbit" ? 1e6 : u == "gbit" ? 1e9 : u == "bit" ? 1 : 0
    if (f > 0) printf "%.0fB/s,burst=%.0fB", n * f / 8 * 0.95, (n * f / 8000 < 65536 ? 65536 : n * f / 8000) * 0.95 }')")
fi
measured=("${costs[@]}")
sharing=$(awk -v r="$ranks" -v c="$cpus" 'BEGIN { if (r > c) printf "%g", r / c }')
[ -z "$sharing" ] || costs+=("ranks_per_cpu=$sharing")
[ ${#costs[@]} -eq 0 ] || troupe_env=(env "TROUPE_LINK_COSTS=$(IFS=,; echo "${costs[*]}")")
failed=()
# Where the ranks share CPUs and troupe was calibrated, its own launches
# also time a barrier of the layout first (not a table the model is
# compared with): the report's model takes hop_wait from it, the pace of
# a hop in the launches it is compared with (at 4 ranks per CPU that pace
# moved 30-40% between launches minutes apart).
troupe_common=("${common[@]}")
chosen_with=()
if [ "$calibrate" -eq 1 ] && [ -n "$fitted" ] && [ -n "$sharing" ] &&
  [[ ",$ops," != *,barrier,* ]]; then
  troupe_common=(--csv "$PWD/$csv" --ops "barrier,$ops" "${quick[@]}" "${iters[@]}" "${window[@]}")
fi

run() {  # run NAME COMMAND...: one system, logged
  local label=$1 t0=$SECONDS log="$out/logs/$name-$1.log"
  shift
  printf 'hosts_bench: %-22s ' "$label"
  if "$@" >"$log" 2>&1; then
    echo "ok ($((SECONDS - t0)) s)"
  else
    echo "FAILED (exit $?, see $log)"
    failed+=("$label")
  fi
}

for round in $(seq 1 "$repeat"); do
  tag=""
  [ "$repeat" -eq 1 ] || tag="-r$round"
  run "troupe$tag" troupe_on "${hosts_sh[@]}" -- "$per_host" "$hosts" "${troupe_common[@]}"
  if [[ ",$peers," != *,gloo,* ]]; then
    :
  elif [ -x "$build/bench/gloo_bench_worker" ]; then
    store=$(mktemp -d /tmp/gloo-hosts-XXXXXX)
    run "gloo$tag" "${hosts_sh[@]}" -- "$build/bench/gloo_bench_worker" --ranks "$ranks" \
      --local "$per_host" --node-rank '{host}' --store "$store" --address '{addr}' "${common[@]}"
    rm -rf "$store"
  else
    echo "hosts_bench: gloo skipped (not built: apt-get install libgloo-dev, then rebuild)"
  fi
  if [[ ",$peers," != *,mpi,* ]]; then
    :
  elif [ -x "$build/bench/mpi_bench_worker" ] && command -v mpirun >/dev/null; then
    mpirun=(mpirun --hostfile '{hostfile}' --mca plm_rsh_agent '{agent}' -n "$ranks"
      "${mpi_place[@]}" --mca pml ob1 --mca btl_tcp_if_include '{subnet}'
      --mca oob_tcp_if_include '{subnet}')
    [ "$(id -u)" -ne 0 ] || mpirun+=(--allow-run-as-root)
    for btl in tcp shm+tcp; do
      run "mpi-$btl$tag" "${hosts_sh[@]}" --launcher --slots "$per_host" -- "${mpirun[@]}" \
        --mca btl "$([ $btl = tcp ] && echo self,tcp || echo self,vader,tcp)" \
        "$build/bench/mpi_bench_worker" --transport "$btl" "${common[@]}"
    done
  else
    echo "hosts_bench: mpi skipped (not built: apt-get install libopenmpi-dev openmpi-bin)"
  fi
done

# 3. Tables and targets.
if [ "$calibrate" -eq 2 ]; then  # what troupe measured at its first start
  measured=("$(grep -h -o 'troupe link costs: .*' "$out/logs/$name-troupe"*.log 2>/dev/null |
    head -1 | sed 's/^troupe link costs: //')")
  echo "hosts_bench: troupe measured at start: ${measured[0]:-nothing (see the troupe logs)}"
fi
if [ "${troupe_common[*]}" != "${common[*]}" ] && [ -f "$csv" ]; then
  launch_fit=$("$build/bench/bench_hosts_report" "$ccsv" --fit --hosts "$hosts" \
    --ranks-per-host "$per_host" --link "$link" --cpus-per-host "$host_cpus" \
    --fit-launch "$PWD/$csv" 2>>"$clog") || launch_fit=""
  if [ -n "$launch_fit" ]; then
    measured=("$launch_fit")
    chosen_with=(--chosen-with "$fitted")  # what the ranks chose by
    echo "hosts_bench: the model's hop_wait from the tables' own barrier: $launch_fit"
  fi
fi
if [ -f "$csv" ]; then
  "$build/bench/bench_hosts_report" "$csv" --hosts "$hosts" --ranks-per-host "$per_host" \
    --link "$link" --cpus-per-host "$host_cpus" --link-costs "$(IFS=,; echo "${measured[*]}")" \
    "${chosen_with[@]}" |
    tee "$out/$name.txt"
fi
echo "hosts_bench: results in $csv; $(($(date +%s) - start)) s in all"
if [ ${#failed[@]} -gt 0 ]; then
  echo "hosts_bench: FAILED: ${failed[*]}" >&2
  exit 1
fi
