#pragma once
// link_measurement — a world across hosts measures the link between them at
// start (TROUPE_LINK_COSTS=measure): a ping-pong and an exchange between one
// rank of each of its first two hosts, the same exchange by every pair of
// their ranks at once, and a barrier of the world (for ranks that share
// CPUs); world rank 0 fits the cost model to them (algorithms/cost_fit.hpp)
// and every rank reads the result from the store, so every rank's groups
// choose their algorithms by the same model. Rank 0's setting decides.

#include <string>

#include "troupe/process_group.hpp"
#include "troupe/store.hpp"

namespace troupe::detail {

class data_plane;
class rendezvous;

/// Whether the world's ranks run on more than one host and rank 0's
/// TROUPE_LINK_COSTS (read now) asks for the measurement: rank 0 writes its
/// answer at `key`, every rank follows it (the other items beside `measure`
/// are rank 0's for every rank too).
bool measures_links(const data_plane& plane, int rank, int world_size, store& s,
                    const std::string& key, rendezvous& rdv);

/// Measures on `pg` (every world rank, a group of the host backend made for
/// it, in world rank order) and returns the model in TROUPE_LINK_COSTS's
/// syntax, the same text on every rank (rank 0 writes it at `key`).
/// `debug`: rank 0 prints what it measured to stderr.
std::string measure_link_costs(process_group& pg, const data_plane& plane, store& s,
                               const std::string& key, rendezvous& rdv, bool debug);

}  // namespace troupe::detail
