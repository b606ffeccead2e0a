// troupe::testing::predict (include/troupe/simulation.hpp): the algorithm the
// ranks of a layout of hosts would choose for one call, and its time, from
// the same cost model and choice the message engine makes (algorithms/).

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/cost_model.hpp"
#include "api/layout_model.hpp"
#include "troupe/error.hpp"
#include "troupe/simulation.hpp"

namespace troupe::detail {

cost_model layout_model(const testing::host_layout& layout, const std::string& link_costs,
                        const std::string& who) {
  auto model = link_costs.empty() ? cost_model::of_process() : cost_model::parse(link_costs);
  const double cpus = layout.cpus_per_host;
  if (!std::isfinite(cpus) || cpus < 0)
    throw error(errc::invalid_argument, who + ": cpus_per_host " + std::to_string(cpus) +
                                            " must be 0 (a CPU for each rank) or more");
  if (cpus > 0) model.ranks_per_cpu = std::max(1.0, layout.ranks_per_host / cpus);
  return model;
}

}  // namespace troupe::detail

namespace troupe::testing {

namespace {

prediction predict_with(const std::string& collective, std::uint64_t bytes,
                        const host_layout& layout, const std::string& link_costs,
                        const std::string* chosen_with) {
  using detail::op_code;
  auto bad = [](const std::string& what) {
    throw error(errc::invalid_argument, "predict: " + what);
  };
  op_code code = op_code::allreduce;
  const bool send = collective == "send";
  if (send || collective == "allreduce")
    code = op_code::allreduce;
  else if (collective == "broadcast")
    code = op_code::broadcast;
  else if (collective == "allgather")
    code = op_code::allgatherv;
  else if (collective == "reduce")
    code = op_code::reduce;
  else if (collective == "reduce_scatter")
    code = op_code::reduce_scatterv;
  else if (collective == "alltoall")
    code = op_code::alltoallv;
  else if (collective == "barrier")
    code = op_code::barrier;
  else
    bad("collective '" + collective +
        "' is not one of allreduce, broadcast, allgather, reduce, reduce_scatter, alltoall, "
        "barrier, send");
  if (layout.hosts < 1) bad("hosts " + std::to_string(layout.hosts) + " must be at least 1");
  if (layout.ranks_per_host < 1)
    bad("ranks_per_host " + std::to_string(layout.ranks_per_host) + " must be at least 1");
  constexpr long long most = 1LL << 20;
  const long long ranks = static_cast<long long>(layout.hosts) * layout.ranks_per_host;
  if (ranks > most)
    bad(std::to_string(layout.hosts) + " hosts x " + std::to_string(layout.ranks_per_host) +
        " ranks = " + std::to_string(ranks) + " ranks; at most " + std::to_string(most));
  const auto model = detail::layout_model(layout, link_costs, "predict");
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<std::size_t>(ranks));
  for (long long r = 0; r < ranks; ++r) hosts.push_back(std::to_string(r / layout.ranks_per_host));
  const auto t = detail::group_topology::of_hosts(hosts);
  if (send) return {"send", ranks < 2 ? 0 : detail::send_time(bytes, *t, model, 0, int(ranks / 2))};
  std::optional<detail::cost_model> told;
  if (chosen_with) told = detail::layout_model(layout, *chosen_with, "predict");
  const auto p = detail::predict_call(code, bytes, *t, model, told ? &*told : nullptr);
  return {p.algorithm, p.seconds};
}

}  // namespace

prediction predict(const std::string& collective, std::uint64_t bytes, const host_layout& layout,
                   const std::string& link_costs) {
  return predict_with(collective, bytes, layout, link_costs, nullptr);
}

prediction predict_chosen_with(const std::string& collective, std::uint64_t bytes,
                               const host_layout& layout, const std::string& link_costs,
                               const std::string& chosen_with) {
  return predict_with(collective, bytes, layout, link_costs, &chosen_with);
}

}  // namespace troupe::testing
