#pragma once
// direct_layout — what one collective moves through the shared segment, for
// direct_shm (which runs them all): whose input bytes (its "source") each
// rank's output needs, and where they go. One file per collective:
// direct_broadcast, direct_gather (allgather and gather), direct_scatter,
// direct_reduce_scatter, direct_alltoall.

#include <cstdint>
#include <memory>
#include <vector>

#include "base/call.hpp"

namespace troupe::detail {

/// Bytes [from, to) of a rank's source go to the output at byte `at`
/// (from == to: nothing).
struct direct_need {
  std::int64_t from = 0, to = 0, at = 0;
};

/// What a layout sees of the call (the same on every rank once the ranks'
/// calls agree).
struct direct_view {
  const collective_call& call;
  int size;
  std::int64_t element_bytes;
  /// alltoall: rank r's send counts, or (receive) its receive counts, as it
  /// posted them in its small slot: splits(r, receive). A plain function and
  /// its arguments: a step makes several views, and building a std::function
  /// for each costs more than the lookups.
  struct counts_source {
    const void* owner;
    void* context;
    const std::int64_t* (*fn)(const void* owner, void* context, int r, bool receive);
    const std::int64_t* operator()(int r, bool receive) const {
      return fn(owner, context, r, receive);
    }
  } splits;
  /// The counts summed up to each rank (size + 1 of them, from 0): made once
  /// per call, so that a rank's offset costs one load (summing the counts
  /// before each of n blocks, for n ranks, costs n^2 per call).
  const std::int64_t* prefix;
  /// alltoall: the one count of every rank's every send and receive, when
  /// each rank posted such even splits (splits_mark); else -1.
  std::int64_t even = -1;

  /// Block r of the counts, in bytes: its offset and its length.
  std::int64_t offset(int r) const;
  std::int64_t length(int r) const;
  /// Every rank's counts together, in bytes.
  std::int64_t total() const;
};

class direct_layout {
 public:
  virtual ~direct_layout() = default;
  /// Bytes rank r's input must hold, or -1 when any size will do (every
  /// rank checks every rank's, so all refuse alike).
  virtual std::int64_t expected_input(const direct_view&, int /*r*/) const { return -1; }
  /// Bytes of rank r's input the others may need (its source).
  virtual std::int64_t source_bytes(const direct_view& v, int r) const = 0;
  /// What rank `me` needs of rank r's source (r == me: of its own input).
  virtual direct_need needed(const direct_view& v, int me, int r) const = 0;
  /// Whether every rank combines the same range of every source (reduce)
  /// instead of copying what it needs.
  virtual bool reduces() const { return false; }
  /// Whether ranks of several processes read straight from each other's
  /// shared inputs rather than through the staging slots: where every rank
  /// reads bytes no other rank reads (alltoall, reduce_scatter, scatter,
  /// gather: a gather's root reads every block once instead of each being
  /// copied twice). A broadcast, read by all from one root, goes faster
  /// staged.
  virtual bool pulls_between_processes() const { return false; }
  /// Whether the others write what the root needs straight into its output
  /// (shared by the root between processes) instead of the root reading
  /// every block one after the other: a gather, whose root alone needs
  /// anything.
  virtual bool pushes_to_root() const { return false; }
};

/// `counts` summed up to each index: counts.size() + 1 sums, from 0.
std::vector<std::int64_t> count_prefix(const std::vector<std::int64_t>& counts);

/// The layouts: one immutable instance each, shared by every call.
const direct_layout& make_direct_broadcast();
const direct_layout& make_direct_gather(bool to_all);
const direct_layout& make_direct_scatter();
const direct_layout& make_direct_reduce_scatter();
const direct_layout& make_direct_alltoall();

}  // namespace troupe::detail
