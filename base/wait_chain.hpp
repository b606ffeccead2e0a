// Where a timed-out wait starts. A rank whose call timed out waiting for a
// peer says so through the group's store (engines/waits/SEQ/RANK: "PEER
// WHAT"), and follows what the peers it waited for said, up to the rank that
// waits for nobody: the one stopped, busy outside troupe's calls, or that
// never issued the call. Both engines that run collectives (inline/ and the
// group actors) tell their timeouts this way, and a wait that lasted half
// the timeout before it: a rank that issued the call earlier (or waited
// less long for its data) times out first and follows the chain through
// ranks that have not timed out yet, which a stopped rank holds up as well.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "troupe/error.hpp"

namespace troupe {
class store;
}

namespace troupe::detail {

/// What the peers told of their waits.
struct told_waits {
  /// "; rank 2 (...) was itself waiting for rank 3 (...) to send ..., which
  /// has not timed out on this call: the wait starts there (...)", or "" when
  /// the rank waited for waits for nobody (or the store cannot tell).
  std::string chain;
  /// The group rank where the wait starts (the chain's end), -1 when there is
  /// no chain or the ranks wait in a cycle that no told wait leads out of
  /// (a cycle of live ranks whose messages are in flight is held up, as a
  /// rule, where another rank waits for a stopped one: that one starts it).
  int start = -1;
};

/// Publishes this rank's own wait first; waits up to a tenth of `timeout`
/// (100 ms to 2 s) for the others' word. `name` names a group rank. The
/// store is read on a thread of its own: past that tenth and 500 ms the
/// caller goes on without a chain (a store whose server stopped).
told_waits wait_chain(const std::shared_ptr<store>& waits, std::uint64_t seq, int rank, int size,
                      int peer, const std::string& what,
                      const std::function<std::string(int)>& name,
                      std::chrono::milliseconds timeout);

/// How far into a wait a call tells it early, before its timeout (half of it).
inline std::chrono::milliseconds tell_early_after(std::chrono::milliseconds timeout) {
  return timeout / 2;
}

/// Tells, before its `timeout`, that this rank's call `seq` has waited
/// tell_early_after(timeout) for group rank `peer` to `what` (the word its
/// timeout then replaces). What the store refuses is left untold; told from
/// a thread of its own, never waited for.
void tell_wait_early(const std::shared_ptr<store>& waits, std::uint64_t seq, int rank, int peer,
                     const std::string& what, std::chrono::milliseconds timeout) noexcept;

/// What a rank waits for whose write its peer takes nothing of.
inline constexpr const char* take_what_it_was_sent = "take what it was sent";

/// What an algorithm's send throws (op_context::transmit, on either
/// engine) where group rank `peer` took nothing until the call's deadline
/// (its connection was closed and it failed): the call times out waiting
/// for that peer, and follows the chain of waits from it (wait_chain) as
/// any timeout does: a peer that took nothing because it was itself
/// blocked writing to a stopped rank is not the one blamed.
class peer_given_up : public error {
 public:
  peer_given_up(int peer, const std::string& why) : error(errc::timeout, why), peer_(peer) {}
  int peer() const noexcept { return peer_; }
  /// "take what it was sent (writing to it timed out after ...)".
  std::string what_waited() const {
    return std::string(take_what_it_was_sent) + " (" + what() + ")";
  }

 private:
  int peer_;
};

/// A timeout's words from `waited` ("waiting for rank 1 (...) to send its
/// data") and the chain: the rank where the wait starts comes first
/// ("waiting for rank 3 (...), where a chain of waits starts: this rank was
/// waiting for rank 1 (...) to ...; rank 1 (...) was itself waiting for ...").
std::string blame(const std::string& waited, const told_waits& told,
                  const std::function<std::string(int)>& name);

}  // namespace troupe::detail
