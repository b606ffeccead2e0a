#pragma once
/// troupe::testing::simulate — a deterministic run of n in-process ranks.
///
/// Every rank still has its own world, but only one rank runs at a time: at
/// each troupe call (a collective, a point-to-point call, a wait) the rank
/// hands the turn to a rank that a seeded generator picks. So the order in
/// which ranks issue their calls, and with it whatever depends on it (which
/// sender recv_any_source matches first, which rank meets an error first),
/// follows from the seed alone: the same seed gives the same schedule, the
/// same results and the same errors, run after run.
///
/// Time is virtual: a wait that cannot progress hands the turn on; once every
/// rank waits and a whole round of turns moved nothing, the waits fail at
/// once as a timeout would (a 30-minute timeout passes in microseconds), or
/// with the injected fault that caused it.
///
/// Faults, by rule: kill rank R at its k-th troupe call (its world goes: the
/// others fail with errc::peer_failure naming it), or freeze it there (it
/// never gets the turn again: the others fail with errc::timeout naming it).
///
///   troupe::testing::simulation_options o;
///   o.seed = 42;
///   o.faults = {{troupe::testing::fault::kill, 2, 3}};
///   troupe::testing::simulate(4, [](troupe::world& w) { ... }, o);
///
/// A failing run throws troupe::error whose message starts with
/// "seed S: rank R: ", so re-running with seed S reproduces it.
/// find_failing_seed sweeps seeds for a schedule that breaks a program.
///
/// Limits: the ranks live in one process on the inline engine (the default;
/// not with TROUPE_ENGINE=actors); continuations (on_complete, then) run when a
/// rank waits, not on their own; a rank must not block outside troupe calls
/// (on a mutex another rank holds, say) or the schedule waits forever.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "troupe/world.hpp"

namespace troupe::testing {

/// Where ranks live: `hosts` hosts of `ranks_per_host` ranks each, rank r
/// (of the world; for predict(), of the group) on host r / ranks_per_host.
struct host_layout {
  int hosts = 1;
  int ranks_per_host = 1;
  /// The CPUs each host runs its ranks on (0: one for each rank). Fewer
  /// than ranks_per_host: the ranks share them, and the model prices it
  /// (TROUPE_LINK_COSTS's ranks_per_cpu; hosts that share one machine's
  /// CPUs, as emulated hosts do: a fraction, 0.5 for 4 hosts on 2 CPUs).
  double cpus_per_host = 0;
};

/// One collective of a timed simulation, as the cost model times it.
struct timed_call {
  std::string group;        ///< the group's name
  std::uint64_t index = 0;  ///< the group's n-th collective (from 1)
  std::string op;           ///< the call: "allreduce", "allgather_into_tensor", ...
  /// The bytes the model moves: an allreduce's, broadcast's or reduce's
  /// buffer, an allgather's or gather's whole output, a scatter's or
  /// reduce_scatter's whole input, what one rank of an alltoall sends.
  std::uint64_t bytes = 0;
  int ranks = 0;          ///< the group's size
  int arrived = 0;        ///< how many of them issued it (fewer: a rank died first)
  std::string algorithm;  ///< what the message engine would run on the layout
  double start = 0;       ///< virtual seconds: the last rank's arrival
  double seconds = 0;     ///< the model's time of the call
};

/// Virtual time for simulate (simulation_options::timing). Every rank has a
/// clock, at 0 when fn starts; troupe calls take no time to issue. A
/// collective starts when the last rank of its group issued it and takes
/// the time the cost model gives the algorithm troupe's message engine
/// would choose on `layout` (testing::predict's, extended to
/// reduce_scatter, gather, scatter, alltoall and barrier); a rank's wait
/// for it returns at its end, or at once if its clock is past that. A send
/// arrives a link's latency + bytes / bandwidth after it was issued (the
/// link between the two ranks' hosts, or within one); the sender's wait
/// returns then, the receiver's not before (sends and receives of a pair
/// of ranks match in order). A call its rank does not wait for (only
/// polls, or it failed) moves no clock. Computation is virtual_compute. No
/// one sleeps: thousands of ranks' steps take the real time of their
/// turns. The buffers are real and moved as without timing (their bytes
/// are what the model prices); for sizes beyond memory, predict() prices a
/// single call.
struct virtual_timing {
  host_layout layout;      ///< hosts x ranks_per_host must be simulate's n
  std::string link_costs;  ///< TROUPE_LINK_COSTS's syntax (""): as predict()'s
  /// Receives every collective, in the order of their start.
  std::vector<timed_call>* calls = nullptr;
  /// Receives each rank's clock at its end (the run's time: the largest).
  std::vector<double>* ends = nullptr;
};

/// A fault injected at a rank's k-th troupe call (counted from 1).
struct fault {
  enum kind_t { kill, freeze };
  kind_t kind = kill;
  int rank = 0;
  int at_call = 1;
};

struct simulation_options {
  std::uint64_t seed = 0;
  std::vector<fault> faults;
  /// When set, receives the schedule: one line per turn ("r2 allreduce").
  std::string* schedule = nullptr;
  /// The timeout of every call's real-time deadline (virtual time ends a
  /// stalled wait long before).
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  std::string backend = "actor";
  /// Virtual time from the cost model (above); none: untimed.
  std::optional<virtual_timing> timing;
};

/// A timed simulation's rank: its clock, in virtual seconds since fn began.
/// Throws errc::invalid_argument outside one.
double virtual_now();
/// A timed simulation's rank computes for `seconds` (its clock moves on;
/// nothing sleeps). Throws errc::invalid_argument outside one, or for a
/// negative or non-finite `seconds`.
void virtual_compute(double seconds);

/// Runs fn on n ranks of this process under one seeded scheduler (above).
/// Throws troupe::error "seed S: rank R: ..." with the first rank's failure.
void simulate(int n, const std::function<void(world&)>& fn, const simulation_options& opts = {});

/// What troupe's ranks would run for one call, and its predicted time.
struct prediction {
  std::string algorithm;  ///< e.g. "allreduce_ring", "allreduce_hier (striped)"
  double seconds = 0;     ///< the cost model's time of the call, every rank done
};

/// Predicts one collective on `layout` without running anything: the
/// algorithm troupe's message engine would choose there (the same cost model
/// and the same choice every rank makes, TROUPE_ALGORITHMS included) and the
/// time the model gives it. `collective`: "allreduce", "broadcast",
/// "allgather", "reduce", "reduce_scatter", "alltoall" or "barrier", or
/// "send": a send from rank 0 to rank n / 2 (of another host where there
/// are hosts) while the others wait, as a ping-pong's one-way time;
/// `bytes`: the buffer (allgather: its output; reduce_scatter: its whole
/// input; alltoall: what one rank sends, in even splits; barrier: none). `link_costs`:
/// TROUPE_LINK_COSTS's syntax over the defaults ("": the process's model,
/// TROUPE_LINK_COSTS or the defaults). Cheap at any scale (up to 2^20
/// ranks): 16,384 ranks take milliseconds. On one host the ranks of one
/// process or of several run the shared-memory engine instead (unless
/// TROUPE_ENGINE=messages); the prediction is then the message engine's.
/// Throws errc::invalid_argument naming a bad argument.
prediction predict(const std::string& collective, std::uint64_t bytes, const host_layout& layout,
                   const std::string& link_costs = "");

/// predict(), the algorithm being the one ranks told `chosen_with`
/// (TROUPE_LINK_COSTS's syntax; "": the process's model) would choose,
/// its time priced with `link_costs`: where the ranks ran with one model
/// and the call is priced with another, measured later (a benchmark's
/// report pricing what ran with what the run's own launch measured).
prediction predict_chosen_with(const std::string& collective, std::uint64_t bytes,
                               const host_layout& layout, const std::string& link_costs,
                               const std::string& chosen_with);

/// Runs simulate(n, fn) with seeds first, first+1, ... (count of them) and
/// returns the first seed whose run throws, after printing it and the error
/// to stderr; nullopt when every run passed.
std::optional<std::uint64_t> find_failing_seed(int n, const std::function<void(world&)>& fn,
                                               std::uint64_t first, int count,
                                               const simulation_options& base = {});

}  // namespace troupe::testing
