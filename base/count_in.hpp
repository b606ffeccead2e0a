#pragma once
// count_in — the members of a group meeting through the store with O(1)
// store traffic each: every member counts itself in under a key, the last
// one writes the key's "/all", the one key every member waits for. Polling
// a counter (store_based_barrier) or waiting for every member's key makes
// each of n members read O(n) keys or poll while it waits: n^2 store traffic
// when the n ranks of a simulation share one store.

#include <chrono>
#include <string>

#include "troupe/store.hpp"

namespace troupe::detail {

/// Counts group rank `rank` of `size` in under `key` and returns once every
/// member did. Throws errc::timeout "OP: Timed out after T ms waiting for
/// ranks 3, 5 to WHAT" naming the members missing at `timeout`; the store's
/// own errors (errc::peer_failure from a watchful store) pass through.
void count_in(store& s, const std::string& key, int rank, int size,
              std::chrono::milliseconds timeout, const std::string& op, const std::string& what);

}  // namespace troupe::detail
