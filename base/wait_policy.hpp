#pragma once
// wait_policy — how troupe's threads wait for another thread or process.
//
// Spin about a microsecond (a peer on the other core answers in well under
// one), then poll while yielding the core (a peer that shares this core — with
// more ranks than cores, or beside other load — gets to run at once instead of
// after a time slice), then sleep (futex or condition variable), so a long
// wait costs nothing. Pure spinning would make two ranks on one core wait
// out each other's time slices in every small call.
//
// A rank on a CPU of its own (bound to one CPU, as troupe-run and mpirun
// --bind-to core bind them when the host has a CPU for every rank) spins
// 20 µs before it yields (nothing of the job waits for that CPU, and a
// yield is a system call that delays noticing the peer). "A CPU for every
// rank" counts the CPUs the launcher may use (host_cpus()), not the
// machine's: ranks confined together to fewer CPUs share them.
//
// Every rank polls (yielding) for 1 ms before it sleeps. On a CPU of its
// own a sleeping waiter hands its sockets to the data plane's reader
// threads, whose wake-ups on the rank's CPU lengthen the next wait; on a
// CPU its ranks share, a sleeping waiter's wake-up waits for that CPU,
// while a yielding one runs as soon as the CPU's rank yields it (4 hosts of
// 2 ranks on 2 CPUs, 4 B allreduce: 640-830 us a call after 50 us of
// polling, 370-590 after 1 ms; barrier 500-570 -> 330-430; one host's 4 or
// 7 ranks on 2 CPUs alike within the noise).
//
// A device actor (actors/device_actor.cpp) watches a job's CUDA event for up to
// `gpu_watch` (1 ms) before it asks CUDA for a host callback, and after each
// job polls its mailbox for the next one through the `poll` window before its
// thread sleeps. The host callback and the actor's wake-up behind it cost
// about 70 µs on an H100: the watch covers what one job of a training step
// takes (a bucket's allreduce, a broadcast), and a job longer than it still
// costs one yielding thread no more than the window.
//
// TROUPE_SPIN_US, TROUPE_POLL_US and TROUPE_GPU_WATCH_US (integers,
// microseconds) override the three windows; the world checks them at start-up.

#include <chrono>

namespace troupe::detail {

/// The spinning window of a rank on a CPU of its own.
inline constexpr std::chrono::nanoseconds own_cpu_spin{20'000};

/// How many CPUs the ranks of this host share: those its launcher may run
/// on (the affinity of this process's parent: troupe-run, mpirun's daemon,
/// torchrun), at most the online CPUs. A host confined to fewer CPUs than
/// it runs ranks (a container's cpuset, taskset) has its ranks share them
/// whichever CPU each is bound to.
long host_cpus();
/// The CPUs in a Linux CPU list ("0-3,8,10-11": 7); 0 when malformed.
long count_cpu_list(const char* list);

struct wait_policy {
  std::chrono::nanoseconds spin{1'000};  ///< pure spinning
  /// Spinning + yielding, then sleep (two hosts' ranks with a CPU each
  /// exchanging 1 MiB: about 800 us a call where waiters slept after 50 us,
  /// 350 while they read their sockets).
  std::chrono::nanoseconds poll{1'000'000};
  /// How long a device actor watches a job's event (yielding) before it asks
  /// CUDA to call back on the host.
  std::chrono::nanoseconds gpu_watch{1'000'000};
  bool spin_chosen = false;  ///< TROUPE_SPIN_US set `spin`
  /// The policy the environment asks for now; throws errc::invalid_argument
  /// naming the variable on a bad value.
  static wait_policy from_env();
  /// The process's policy (from_env() when first asked).
  static const wait_policy& get();
  /// This policy for waiting on `ranks` ranks of this host: without the pure
  /// spinning when they outnumber the host's CPUs (host_cpus(); unless TROUPE_SPIN_US
  /// set it): the rank waited for may be waiting for this CPU, and yielding
  /// at once lets it run.
  wait_policy for_ranks(int ranks) const;
  /// One polling step of a wait that began polling `polled` ago: pauses
  /// once (spinning) or yields; false once the poll window is over (time to
  /// sleep). One pause, not more: a pause takes 25 ns on these AMD EPYC
  /// machines (140 cycles on recent Intel), and every pause more a step
  /// delays noticing the peer.
  bool poll_step(std::chrono::nanoseconds polled) const;
};

}  // namespace troupe::detail
