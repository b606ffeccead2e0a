// Where a timed-out wait starts. A rank whose call timed out waiting for a
// peer says so through the group's store (engines/waits/SEQ/RANK: "PEER
// WHAT"), and follows what the peers it waited for said, up to the rank that
// waits for nobody: the one stopped, busy outside troupe's calls, or that
// never issued the call. Both engines that run collectives (inline/ and the
// group actors) tell their timeouts this way.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace troupe {
class store;
}

namespace troupe::detail {

/// "; rank 2 (...) was itself waiting for rank 3 (...) to send ..., which has
/// not timed out on this call: the wait starts there (...)", or "" when the
/// rank waited for waits for nobody (or the store cannot tell). Publishes
/// this rank's own wait first; waits up to a tenth of `timeout` (100 ms to
/// 2 s) for the others' word. `name` names a group rank.
std::string wait_chain(store& waits, std::uint64_t seq, int rank, int size, int peer,
                       const std::string& what, const std::function<std::string(int)>& name,
                       std::chrono::milliseconds timeout);

}  // namespace troupe::detail
