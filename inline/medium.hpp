#pragma once
// medium — what an inline engine's operations travel through (inline/engine.hpp):
// the group's shared segment (shm_medium) or the data plane's connections
// (message_medium). The inline engine drives the operations; the medium says how to wait
// for a peer, whether a peer is lost, and brings incoming data within reach.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace troupe::detail {

class peer_memory;

class segment;

/// What a thread waiting for the inline engine's operations reads itself
/// (pump) meanwhile: nothing, the peers on its host (their shared-memory
/// rings: a ring's reader thread runs at the lowest priority, so a large
/// operation left to it crawls) or every peer (sockets too: operations up
/// to 1 MiB, where latency counts; larger ones leave sockets to the reader
/// threads, which receive while the waiting thread sends).
enum class reading : std::uint8_t { none, host, all };

class medium {
 public:
  virtual ~medium() = default;
  virtual int size() const noexcept = 0;
  /// The group's ranks that run on this host (they share its CPUs), when
  /// known; 0 when not.
  virtual int ranks_on_host() const noexcept { return 0; }
  /// Moves incoming data from the peers `what` names within reach of the
  /// operations without blocking (reads rings and sockets); true when
  /// something arrived.
  virtual bool pump(reading /*what*/) { return false; }
  /// What a waiting thread that would read `wanted` has to pump (none:
  /// begin_wait, pump, sleep and end_wait are told it does not read).
  virtual reading reads_while_waiting(reading wanted) { return wanted; }
  /// How long a wait lasts before its thread starts reading (begin_wait).
  virtual std::chrono::nanoseconds read_after() { return {}; }
  /// A thread starts / stops waiting (driving) for the inline engine's operations;
  /// `reads` says what it reads itself (pump) meanwhile.
  virtual void begin_wait(reading /*reads*/) {}
  virtual void end_wait(reading /*reads*/) {}
  /// Sleeps until group rank `r` may have published something or `max`
  /// passed; `recheck()` runs after registering as sleeper and cancels the
  /// sleep when it returns true. `reads` as for begin_wait.
  virtual void sleep(int r, std::chrono::nanoseconds max, const std::function<bool()>& recheck,
                     reading reads) = 0;
  /// Why operation `op`, blocked waiting for group rank `blocker` (-1:
  /// unknown), can never finish because a rank it needs is gone (empty: it
  /// still can; a member found crashed: empty until crash_grace passed since
  /// the first look found it). `now`: the caller's clock reading (no second
  /// read per turn).
  virtual std::string lost(std::uint64_t op, int blocker,
                           std::chrono::steady_clock::time_point now) = 0;
  /// Records which collective this rank issued as sequence number `seq`.
  virtual void announce(std::uint64_t /*seq*/, std::uint8_t /*code*/) {}
  /// The collective rank `r` announced for `seq`, or -1 when unknown.
  virtual int announced(int /*r*/, std::uint64_t /*seq*/) { return -1; }
  /// Operation `op` ended (finished or failed): work the medium does for it
  /// on other threads stops, and this returns once none runs any more.
  virtual void end_op(std::uint64_t /*op*/) {}
  /// Wakes this rank's threads sleeping in sleep() (abort).
  virtual void wake_all() = 0;
  /// This rank leaves the group: peers waiting for it learn so.
  virtual void leave() = 0;
  /// The shared segment, for operations that work on it (null: none).
  virtual segment* shared_segment() noexcept { return nullptr; }
  /// Every rank lives in this process (buffers can be read directly).
  virtual bool one_process() const noexcept { return false; }
  /// The peers' shared buffers mapped into this process (shm_medium between
  /// processes), else null.
  virtual peer_memory* peers() noexcept { return nullptr; }
};

}  // namespace troupe::detail
