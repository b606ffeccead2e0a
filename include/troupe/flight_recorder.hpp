#pragma once
/// troupe's flight recorder: every group of every rank keeps its last calls
/// (op, sequence number, sizes, dtype, peer, issue and end times, state) in a
/// ring buffer, at the cost of one small record per call. It answers, after
/// a hang or a failure, which ranks had which sequence numbers in flight.
///
///   auto entries = w.flight_record();            // this rank, every group
///   std::fputs(troupe::format_flight_record(entries).c_str(), stderr);
///   troupe::write_chrome_trace("trace.json", {entries_of_rank0, entries_of_rank1});
///
/// The trace is Chrome's trace-event JSON (opens in Perfetto and
/// chrome://tracing): one track per rank, one slice per call.
///
/// TROUPE_FLIGHT_RECORDER=N keeps N calls per group (default 2000; 0 turns
/// recording off unless a group enables collective timing). When a call
/// fails with a timeout, a collective mismatch or a peer failure, the rank
/// prints its record of that group once (to stderr, or into the directory
/// TROUPE_FLIGHT_RECORDER_DUMP names, as <group>-rank<R>.txt).

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

/// One call in a flight record.
struct flight_entry {
  std::uint64_t id = 0;  ///< issue order within the group's record
  std::string group;
  int rank = -1;  ///< the rank in the group
  int group_size = 0;
  std::string op;          ///< "allreduce", "send", ...
  std::uint64_t seq = 0;   ///< the group's sequence number (0: none)
  std::int64_t numel = 0;  ///< elements of the call's tensors (all of them)
  std::uint64_t bytes = 0;
  std::string dtype;  ///< of the first tensor ("" without tensors)
  int tensors = 0;
  int peer = -1;  ///< send/recv: the peer's group rank
  /// Microseconds since the epoch (system clock): comparable across processes.
  std::int64_t issued_us = 0;
  std::int64_t ended_us = 0;  ///< 0 while in flight
  std::string state;          ///< "in flight", "completed", "failed"
  std::string error;          ///< why it failed
};

/// Serialization (troupe/serialize.hpp's convention): records travel with
/// gather_object, e.g. to write one trace of a launched job on rank 0.
template <class Inspector>
auto inspect(Inspector& f, flight_entry& e) {
  return f(e.id, e.group, e.rank, e.group_size, e.op, e.seq, e.numel, e.bytes, e.dtype, e.tensors,
           e.peer, e.issued_us, e.ended_us, e.state, e.error);
}

/// A readable table: one line per call, the calls in flight marked.
std::string format_flight_record(const std::vector<flight_entry>& entries);

/// The Chrome/Perfetto trace-event JSON of the ranks' records (one track per
/// rank: per_rank[i] holds rank i's entries, of any groups).
std::string chrome_trace_json(const std::vector<std::vector<flight_entry>>& per_rank);

/// Writes chrome_trace_json to `path`; throws errc::invalid_argument naming
/// the path when it cannot be written.
void write_chrome_trace(const std::string& path,
                        const std::vector<std::vector<flight_entry>>& per_rank);

}  // namespace troupe
