#!/usr/bin/env bash
# Emulated hosts on one machine: H hosts, each its own network namespace (one
# interface, eth0, with its own address), UTS namespace (its own host name,
# which troupe uses to tell hosts apart) and mount namespace (its own /dev/shm
# and an /etc/hosts naming every host), joined through a bridge. Each host's
# link can be shaped to a rate (tbf, both directions, as a full-duplex NIC).
# Runs a command on every host, waits for all, reports each host's exit code
# and removes everything it made, whatever happens.
#
#   scripts/hosts.sh --hosts H [--link RATE|none] [--prefix NAME] [--subnet A.B.C]
#                    [--timeout SEC] [--grace SEC] [--slots S] [--split-cpus]
#                    [--launcher] [--raw] -- command [args...]
#   scripts/hosts.sh --cleanup [PREFIX]
#
#   --hosts H      hosts to make (1 to 200)
#   --link RATE    each host's link rate, as tc writes it: 100mbit, 1gbit,
#                  10gbit (decimal: 1gbit = 1e9 bit/s), shaped both ways with
#                  tbf (a burst of 1 ms at the rate passes at once); none
#                  (default): unshaped
#   --prefix NAME  the prefix of every name made (namespaces, the state folder
#                  /run/troupe-hosts/NAME); default troupe-hosts-<pid>
#   --subnet A.B.C the hosts' /24 (default 10.77.1): host k is A.B.C.(k+1),
#                  the launcher A.B.C.254
#   --timeout SEC  stop every host's command after SEC seconds (exit 124)
#   --grace SEC    after a host's command failed, the others get SEC seconds
#                  to end on their own before they are stopped (default 10)
#   --slots S      slots per host in the hostfile (default 1)
#   --split-cpus   each host runs on its own share of the CPUs (taskset): with
#                  C CPUs, host k gets CPUs k*C/H to (k+1)*C/H-1 (CPU k mod C
#                  when there are fewer CPUs than hosts); default: all share all
#   --launcher     run the command once, on a launcher host on the same bridge
#                  (host name "launcher", unshaped), not on every host: for
#                  mpirun with {hostfile} and {agent}
#   --raw          pass the commands' output through unlabelled (default:
#                  every line prefixed with [hostK], stderr merged into stdout)
#   --cleanup      remove what runs that ended without cleaning up left
#                  behind (also done at every start), or everything of PREFIX
#
# In the command, these placeholders are replaced for each host:
#   {host} its index k   {hosts} H        {name} its host name (hostK)
#   {addr} its address   {master} host 0's address
#   {port} 29500 (free on every host: each has a network of its own)
#   {subnet} A.B.C.0/24  {hostfile} a hostfile naming the hosts (slots=S)
#   {agent} a script that runs a command line on a host, as ssh would:
#           `agent hostK 'command line'` (mpirun's plm_rsh_agent)
# and the command's environment has HOST_INDEX, HOST_COUNT, HOST_NAME,
# HOST_ADDR, HOST_MASTER_ADDR and TROUPE_JOB_TOKEN (one for all hosts,
# generated unless set). The working directory stays the same; the file
# system is shared but for /dev/shm (each host its own tmpfs) and /etc/hosts.
#
# For example, 2 hosts of 2 ranks each over 1 Gbit/s links:
#   scripts/hosts.sh --hosts 2 --link 1gbit -- build/apps/troupe-run -n 2 --nnodes 2 \
#     --node-rank {host} --master-addr {master} --master-port {port} build/tests/test_allreduce
#
# Exit status: 0 when every host's command exited 0, else the status of the
# command that failed first (124 after --timeout); 77 when hosts cannot be
# made here (not root, no `ip netns`, `unshare`, `nsenter`, bridge or `tc`),
# with the reason on stderr; 2 for a bad command line.
set -euo pipefail

me=hosts.sh
state_root=/run/troupe-hosts

usage() { sed -n '2,59p' "$0" | sed 's/^# \{0,1\}//'; }
fail() { echo "$me: $*" >&2; exit 2; }
skip() { echo "$me: cannot make hosts here: $*" >&2; exit 77; }
quiet() { "$@" >/dev/null 2>&1; }

# --- what a run leaves behind, and removing it -------------------------------

# A process's start time (field 22 of /proc/PID/stat), to tell it from a later
# process with the same id.
start_time() { awk '{ print $22 }' "/proc/$1/stat" 2>/dev/null || true; }

# Ends the processes inside a network namespace of ours (they were started in
# it by a run of this script): SIGTERM, then SIGKILL after `wait` seconds.
stop_namespace() {
  local ns=$1 wait=$2 pids t
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  [ -n "$pids" ] || return 0
  # shellcheck disable=SC2086 # one id per word
  kill -TERM $pids 2>/dev/null || true
  for ((t = 0; t < wait * 10; t++)); do
    [ -n "$(ip netns pids "$ns" 2>/dev/null || true)" ] || return 0
    sleep 0.1
  done
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
}

# Removes everything of one prefix: its processes, namespaces and state folder.
remove_prefix() {
  local prefix=$1 ns f dir="$state_root/$1"
  for ns in $(ip netns list 2>/dev/null | awk '{ print $1 }'); do
    [[ "$ns" == "$prefix"-* && "${ns#"$prefix"-}" =~ ^(h[0-9]+|launcher|switch)$ ]] || continue
    stop_namespace "$ns" 2
    quiet ip netns del "$ns" || true
  done
  if [ -d "$dir" ]; then
    for f in "$dir"/*.uts "$dir"/*.mnt; do
      if [ -e "$f" ]; then quiet umount "$f" || true; fi
    done
    quiet umount "$dir" || true
    rm -rf "$dir"
  fi
}

# Removes what runs that are gone left behind (their pid no longer runs).
sweep_stale() {
  local dir pid started
  [ -d "$state_root" ] || return 0
  for dir in "$state_root"/*/; do
    [ -d "$dir" ] || continue
    read -r pid started <"$dir/owner" 2>/dev/null || { pid=0; started=; }
    if [ "$pid" -gt 0 ] && [ "$(start_time "$pid")" = "$started" ]; then continue; fi
    remove_prefix "$(basename "$dir")"
  done
}

# --- the command line ----------------------------------------------------------

hosts=0
link=none
prefix="troupe-hosts-$$"
subnet=10.77.1
timeout=0
grace=10
slots=1
launcher=0
split=0
raw=0
cleanup=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=${2-}; shift ;;
    --link) link=${2-}; shift ;;
    --prefix) prefix=${2-}; shift ;;
    --subnet) subnet=${2-}; shift ;;
    --timeout) timeout=${2-}; shift ;;
    --grace) grace=${2-}; shift ;;
    --slots) slots=${2-}; shift ;;
    --launcher) launcher=1 ;;
    --split-cpus) split=1 ;;
    --raw) raw=1 ;;
    --cleanup) cleanup=1; [ $# -lt 2 ] || { prefix=$2; shift; } ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) fail "unknown argument '$1' (the command comes after --)" ;;
  esac
  shift
done

is_count() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge "$2" ] && [ "$1" -le "$3" ]; }
[[ "$prefix" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$ ]] ||
  fail "--prefix: expected up to 40 letters, digits, '.', '_' or '-', got '$prefix'"
if [ "$cleanup" -eq 1 ]; then
  [ "$(id -u)" -eq 0 ] || skip "--cleanup needs root"
  if [ "$prefix" = "troupe-hosts-$$" ]; then sweep_stale; else remove_prefix "$prefix"; fi
  exit 0
fi
is_count "$hosts" 1 200 || fail "--hosts: expected a number from 1 to 200, got '$hosts'"
is_count "$timeout" 0 86400 || fail "--timeout: expected seconds, got '$timeout'"
is_count "$grace" 0 3600 || fail "--grace: expected seconds, got '$grace'"
is_count "$slots" 1 1024 || fail "--slots: expected a number from 1 to 1024, got '$slots'"
[[ "$subnet" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] ||
  fail "--subnet: expected the first three numbers of a /24 (A.B.C), got '$subnet'"
if [ "$link" != none ]; then
  [[ "$link" =~ ^[0-9]+(\.[0-9]+)?[kmgt]?bit$ ]] ||
    fail "--link: expected a rate such as 100mbit, 1gbit, 10gbit, or none; got '$link'"
fi
[ $# -gt 0 ] || fail "missing the command to run (after --)"
command=("$@")

# --- can hosts be made here? -----------------------------------------------------

[ "$(id -u)" -eq 0 ] || skip "network namespaces need root (running as uid $(id -u))"
for tool in ip unshare nsenter mount umount taskset; do
  command -v "$tool" >/dev/null || skip "'$tool' is not installed"
done
[ "$link" = none ] || command -v tc >/dev/null || skip "'tc' is not installed (needed by --link)"
quiet ip netns list || skip "'ip netns' does not work here"

# --- making the hosts ------------------------------------------------------------

state="$state_root/$prefix"
switch="$prefix-switch"
name_of() { echo "host$1"; }             # host k's host name
addr_of() { echo "$subnet.$(($1 + 1))"; }
launcher_addr="$subnet.254"

made=0
# shellcheck disable=SC2317 # run by the traps
finish() {
  local rc=$?
  trap - EXIT INT TERM HUP
  [ "$made" -eq 0 ] || remove_prefix "$prefix"
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

sweep_stale
if [ -e "$state" ] || [ -e "/run/netns/$switch" ]; then
  fail "--prefix $prefix: a run with this prefix is still there (scripts/hosts.sh --cleanup $prefix)"
fi
# The state folder comes first, with its owner (this process) already in it:
# whatever a crash leaves behind has a folder that says whose it was.
mkdir -p "$state_root"
mkdir "$state.new.$$"
echo "$$ $(start_time $$)" >"$state.new.$$/owner"
mv -T "$state.new.$$" "$state"
made=1
quiet ip netns add "$switch" || skip "cannot create a network namespace ('ip netns add' failed)"
# The namespace files of UTS and mount namespaces must lie on a private mount.
if ! mount --bind "$state" "$state" || ! mount --make-private "$state"; then
  skip "cannot make a private mount for the namespaces' files"
fi
quiet ip -n "$switch" link set lo up
quiet ip -n "$switch" link add br0 type bridge || skip "cannot create a bridge (no bridge support)"
quiet ip -n "$switch" link set br0 up

# /etc/hosts of every host: the hosts and the launcher by name.
{
  echo "127.0.0.1 localhost"
  for ((k = 0; k < hosts; k++)); do echo "$(addr_of "$k") $(name_of "$k")"; done
  echo "$launcher_addr launcher"
} >"$state/etc-hosts"
for ((k = 0; k < hosts; k++)); do echo "$(name_of "$k") slots=$slots"; done >"$state/hostfile"

# tbf on one interface of a namespace: the link's rate in that direction.
# The bucket holds 1 ms at the rate (at least 64 KiB), the queue 10 ms: with a
# smaller bucket the shaper fell well short of the rate here (a 16 KiB bucket
# at 1gbit: 0.66 Gbit/s), as its timer wakes late; the price is that a burst
# of up to the bucket passes at once.
shape() {
  local ns=$1 dev=$2 burst
  burst=$(awk -v r="$link" 'BEGIN {
    n = r + 0; u = substr(r, length(r) - 3, 1)
    m = u == "k" ? 1e3 : u == "m" ? 1e6 : u == "g" ? 1e9 : u == "t" ? 1e12 : 1
    b = n * m / 8 / 1000; if (b < 65536) b = 65536; printf "%d", b }')
  ip -n "$ns" link set "$dev" txqueuelen 1000
  tc -n "$ns" qdisc add dev "$dev" root tbf rate "$link" burst "$burst" latency 10ms ||
    skip "tc cannot shape a link here (tbf on $dev)"
}

# One host: namespaces, a port on the bridge, the address, the shaping.
# make_host SHORT NAME ADDRESS SHAPED: SHORT names its files and its port on
# the bridge; SHAPED 1: its link is shaped (--link), and it gets a mount
# namespace of its own. The launcher stays in this mount namespace: a mount
# namespace's file is not copied into another one, and mpirun's agent must
# reach the hosts' files from there.
make_host() {
  local short=$1 name=$2 addr=$3 shaped=$4 ns="$prefix-$1"
  quiet ip netns add "$ns" || skip "cannot create network namespace $ns"
  ip -n "$switch" link add "$short" type veth peer name eth0 netns "$ns" ||
    skip "cannot create a veth pair"
  ip -n "$switch" link set "$short" master br0 up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  if [ "$shaped" -eq 1 ] && [ "$link" != none ]; then
    shape "$ns" eth0          # what the host sends
    shape "$switch" "$short"  # what it receives
  fi
  touch "$state/$short.uts"
  if [ "$shaped" -eq 0 ]; then
    unshare --uts="$state/$short.uts" hostname "$name" || skip "cannot make a UTS namespace (unshare)"
    return
  fi
  touch "$state/$short.mnt"
  # shellcheck disable=SC2016 # $1 and $2 are the inner shell's
  unshare --uts="$state/$short.uts" --mount="$state/$short.mnt" --propagation private \
    sh -c 'hostname "$1" && mount -t tmpfs -o mode=1777 tmpfs /dev/shm &&
           mount --bind "$2" /etc/hosts' sh "$name" "$state/etc-hosts" ||
    skip "cannot make UTS and mount namespaces (unshare)"
}
for ((k = 0; k < hosts; k++)); do make_host "h$k" "$(name_of "$k")" "$(addr_of "$k")" 1; done
[ "$launcher" -eq 0 ] || make_host launcher launcher "$launcher_addr" 0

# The CPUs of each host: all of ours, or with --split-cpus its share of them.
all_cpus=$(awk '/^Cpus_allowed_list/ { print $2 }' /proc/self/status)
mapfile -t ours < <(echo "$all_cpus" | tr ',' '\n' |
  awk -F- '{ for (c = $1; c <= ($2 == "" ? $1 : $2); c++) print c }')
cpus_of=()
for ((k = 0; k < hosts; k++)); do
  if [ "$split" -eq 0 ]; then
    cpus_of+=("$all_cpus")
  elif [ "${#ours[@]}" -lt "$hosts" ]; then
    cpus_of+=("${ours[k % ${#ours[@]}]}")
  else
    first=$((k * ${#ours[@]} / hosts)) last=$(((k + 1) * ${#ours[@]} / hosts - 1))
    share=("${ours[@]:first:last-first+1}")
    cpus_of+=("$(IFS=,; echo "${share[*]}")")
  fi
done

# enter HOST COMMAND-LINE: what ssh would do, into a host's namespaces.
{
  cat <<'END'
#!/bin/sh
# enter HOST COMMAND...: runs the command line in the namespaces of HOST (a host
# name or address of this set of emulated hosts), as ssh would run it there.
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=${1-}
[ $# -gt 0 ] && shift
case "$host" in
END
  for ((k = 0; k < hosts; k++)); do
    echo "  $(name_of "$k") | $(addr_of "$k")) h=h$k cpus=${cpus_of[k]} ;;"
  done
  echo "  launcher | $launcher_addr) h=launcher cpus=$all_cpus ;;"
  cat <<'END'
  *) echo "enter: no emulated host '$host'" >&2; exit 255 ;;
esac
END
  echo "state=$state netns=/run/netns/$prefix"
  cat <<'END'
mnt=
[ ! -e "$state/$h.mnt" ] || mnt=--mount="$state/$h.mnt"
exec taskset -c "$cpus" nsenter --net="$netns-$h" --uts="$state/$h.uts" ${mnt:+"$mnt"} --wd=/ \
  -- /bin/sh -c "$*"
END
} >"$state/enter"
chmod +x "$state/enter"

# --- running the command ---------------------------------------------------------

token=${TROUPE_JOB_TOKEN:-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')}
master=$(addr_of 0)

# The command with host k's placeholders replaced (into the array `line`).
substitute() {
  local k=$1 addr=$2 name=$3 a
  line=()
  for a in "${command[@]}"; do
    a=${a//\{host\}/$k}
    a=${a//\{hosts\}/$hosts}
    a=${a//\{name\}/$name}
    a=${a//\{addr\}/$addr}
    a=${a//\{master\}/$master}
    a=${a//\{port\}/29500}
    a=${a//\{subnet\}/$subnet.0/24}
    a=${a//\{hostfile\}/$state/hostfile}
    a=${a//\{agent\}/$state/enter}
    line+=("$a")
  done
}

# Runs the command in one host's namespaces; its status lands in rc.<short>.
run_on() {
  local k=$1 short=$2 name=$3 addr=$4
  local mnt=()
  [ ! -e "$state/$short.mnt" ] || mnt=(--mount="$state/$short.mnt")
  substitute "$k" "$addr" "$name"
  set +e
  local cpus=$all_cpus
  [ "$k" -lt 0 ] || cpus=${cpus_of[k]}
  taskset -c "$cpus" nsenter --net="/run/netns/$prefix-$short" --uts="$state/$short.uts" "${mnt[@]}" \
    --wd="$PWD" -- env HOST_INDEX="$k" HOST_COUNT="$hosts" \
    HOST_NAME="$name" HOST_ADDR="$addr" HOST_MASTER_ADDR="$master" \
    TROUPE_JOB_TOKEN="$token" "${line[@]}" </dev/null
  echo $? >"$state/rc.$short.new"
  mv "$state/rc.$short.new" "$state/rc.$short"
}
# Starts it in the background, its lines labelled with the host name unless --raw.
start() {
  if [ "$raw" -eq 1 ]; then
    run_on "$@" &
  else
    run_on "$@" 2>&1 | sed -u "s/^/[$3] /" &
  fi
}

if [ "$launcher" -eq 1 ]; then
  shorts=(launcher)
  start -1 launcher launcher "$launcher_addr"
else
  shorts=()
  for ((k = 0; k < hosts; k++)); do
    shorts+=("h$k")
    start "$k" "h$k" "$(name_of "$k")" "$(addr_of "$k")"
  done
fi

# Wait for all; after the first failure the others get --grace seconds, and
# everything is stopped at --timeout.
stop_all() {
  local s stoppers=()
  for s in "${shorts[@]}"; do
    stop_namespace "$prefix-$s" 5 &
    stoppers+=($!)
  done
  wait "${stoppers[@]}"
}
began=$SECONDS
first=""   # the host whose command failed first
failed_at=0
timed_out=0
stopped=0
while :; do
  pending=0
  for s in "${shorts[@]}"; do
    if [ -f "$state/rc.$s" ]; then
      if [ -z "$first" ] && [ "$(cat "$state/rc.$s")" != 0 ]; then first=$s; failed_at=$SECONDS; fi
    else
      pending=$((pending + 1))
    fi
  done
  [ "$pending" -gt 0 ] || break
  if [ "$stopped" -eq 0 ]; then
    if [ "$timeout" -gt 0 ] && [ $((SECONDS - began)) -ge "$timeout" ]; then
      echo "$me: --timeout $timeout s reached: stopping every host's command" >&2
      timed_out=1
      stopped=1
      stop_all
    elif [ -n "$first" ] && [ $((SECONDS - failed_at)) -ge "$grace" ]; then
      echo "$me: $first failed $grace s ago: stopping the others" >&2
      stopped=1
      stop_all
    fi
  fi
  sleep 0.1
done
wait

# Each host's status, and ours.
rc=0
for s in "${shorts[@]}"; do
  code=$(cat "$state/rc.$s")
  if [ "$s" = launcher ]; then where="launcher ($launcher_addr)"; else
    k=${s#h}; where="$(name_of "$k") ($(addr_of "$k"))"
  fi
  echo "$me: $where exited $code" >&2
done
if [ "$timed_out" -eq 1 ]; then
  rc=124
elif [ -n "$first" ]; then
  rc=$(cat "$state/rc.$first")
fi
exit "$rc"
