#pragma once
// The device exchange: how the "actor" backend runs a collective on cuda
// tensors when every rank of the group lives in this process (ranks sharing a
// GPU). Each rank posts its call; the ranks then run their shares of the
// direct plan (backends/direct_plan.hpp) as kernels on their own device actors'
// streams, reading and writing the peers' device buffers. No host memory and
// no thread waits on the GPU: the stages are chained by CUDA events and
// device-actor jobs.
//
//   post     rank r records `ready[r]` on its stream (everything it issued
//            before, on any group, is then ordered before the collective)
//   share    once every rank recorded: each stream waits for every ready
//            event, runs its rank's steps, records `done[r]`
//   finish   once every rank recorded done: each stream waits for every done
//            event (peers wrote into this rank's buffers), then the rank's
//            work completes from its device actor
//
// A rank that does not post within the call's timeout fails every posted
// rank's work (naming the missing rank); calls that disagree fail every rank
// with errc::mismatch or errc::invalid_argument; a failed CUDA call fails the
// whole round. The device work goes through device_ops (CUDA in the library,
// host memory in the tests); this code is free of CUDA and CAF.

#include <memory>
#include <string>

#include "base/call.hpp"

namespace troupe::detail::gpu {

class device_queue;
class device_ops;

class device_exchange {
 public:
  /// The exchange of group `key` among `size` ranks of this process, on
  /// `ops`; every rank of the group that opens `key` gets the same one.
  static std::shared_ptr<device_exchange> open(const std::string& key, int size, device_ops& ops);
  virtual ~device_exchange() = default;
  /// Rank `rank` posts `c` (sequence number set, tensors on `queue`'s device);
  /// c->handle completes when the collective is done on every rank's stream.
  virtual void post(int rank, const call_ptr& c, std::shared_ptr<device_queue> queue) = 0;
  /// Fails every unfinished call and every later one with `reason`.
  virtual void abort(const std::string& reason) = 0;
  /// Rank `rank` leaves (its group is destroyed): calls that wait for it fail
  /// with errc::peer_failure, now and later.
  virtual void leave(int rank, const std::string& reason) = 0;
};

}  // namespace troupe::detail::gpu
