#pragma once
// The cost model of a layout of hosts (testing::host_layout): the link costs
// given (TROUPE_LINK_COSTS's syntax; "": the process's model), its ranks per
// CPU from the layout's CPUs where it gives them. testing::predict and the
// virtual clock price calls with it.

#include <string>

#include "algorithms/cost_model.hpp"
#include "troupe/simulation.hpp"

namespace troupe::detail {

/// Throws errc::invalid_argument, `who` first, on a negative or non-finite
/// cpus_per_host.
cost_model layout_model(const testing::host_layout& layout, const std::string& link_costs,
                        const std::string& who);

}  // namespace troupe::detail
