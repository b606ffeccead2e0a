#pragma once
// Verification of troupe-demo: every collective once, each result checked
// against values computed locally (every value names the rank that made it,
// so a misplaced block is caught, and sums stay exact in float32).

#include <cstddef>

#include "troupe/world.hpp"

namespace demo {

/// Ranks up to which every sum of the checks is exact in float32.
constexpr int max_ranks = 32;

/// How many checks verify() runs.
std::size_t check_count();

/// Runs every check on this rank (every rank of the world calls it). After
/// each check the ranks agree on whether it failed anywhere; rank 0 prints
/// "  ok  <check>" or "  FAILED <check> (on K ranks)", a failing rank prints
/// its message to stderr. A wrong result does not stop the run; an error of
/// the library itself (troupe::error) is rethrown. Returns the number of
/// checks that failed on some rank, the same on every rank.
int verify(troupe::world& w);

}  // namespace demo
