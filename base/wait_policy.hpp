#pragma once
// wait_policy — how troupe's threads wait for another thread or process.
//
// Spin about a microsecond (a peer on the other core answers in well under
// one), then poll while yielding the core (a peer that shares this core — with
// more ranks than cores, or beside other load — gets to run at once instead of
// after a time slice), then sleep (futex or condition variable), so a long
// wait costs nothing. Measured on 2 vCPUs (bench/RESULTS.md): pure spinning
// made a 2-rank 4-byte allreduce take 115 µs whenever both ranks landed on
// one core; spin-then-yield keeps it at 1–9 µs, and 4 ranks on 2 cores at
// 10–16 µs instead of 80 µs.
//
// TROUPE_SPIN_US and TROUPE_POLL_US (integers, microseconds) override the
// two windows; the world checks them at start-up.

#include <chrono>

namespace troupe::detail {

struct wait_policy {
  std::chrono::nanoseconds spin{1'000};   ///< pure spinning
  std::chrono::nanoseconds poll{50'000};  ///< spinning + yielding, then sleep
  bool spin_chosen = false;               ///< TROUPE_SPIN_US set `spin`
  /// The policy the environment asks for now; throws errc::invalid_argument
  /// naming the variable on a bad value.
  static wait_policy from_env();
  /// The process's policy (from_env() when first asked).
  static const wait_policy& get();
  /// This policy for waiting on `ranks` ranks of this host: without the pure
  /// spinning when they outnumber the host's CPUs (unless TROUPE_SPIN_US
  /// set it): the rank waited for may be waiting for this CPU, and yielding
  /// at once lets it run (measured, 4 processes on 2 CPUs: 1 KiB allreduce
  /// 12–19 µs against 15–22, 64 KiB 33–57 against 43–86).
  wait_policy for_ranks(int ranks) const;
  /// One polling step of a wait that began polling `polled` ago: pauses or
  /// yields; false once the poll window is over (time to sleep).
  bool poll_step(std::chrono::nanoseconds polled) const;
};

}  // namespace troupe::detail
