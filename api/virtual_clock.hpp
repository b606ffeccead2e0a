#pragma once
// virtual_clock — the virtual time of a timed troupe::testing::simulate
// (simulation_options::timing, include/troupe/simulation.hpp): a clock per
// rank, moved by the cost model (algorithms/cost_model.hpp) at each wait for
// a call and by virtual_compute. The conductor (base/sim_conductor.hpp)
// hands it the calls; only the rank holding the turn calls it.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "algorithms/cost_model.hpp"
#include "base/sim_conductor.hpp"
#include "troupe/simulation.hpp"

namespace troupe::detail {

class virtual_clock final : public sim_clock {
 public:
  /// Throws errc::invalid_argument when the layout is not n ranks or the
  /// link costs do not parse.
  virtual_clock(int n, const testing::virtual_timing& timing);

  void issued(int rank, const std::shared_ptr<work_state>& s, const sim_call& c) override;
  void waited(int rank, const work_state& s) override;
  void joined(int rank, const std::shared_ptr<work_state>& all,
              const std::vector<const work_state*>& parts) override;
  double now(int rank) override;
  void compute(int rank, double seconds) override;
  /// Every collective (by start) and each rank's clock, where `timing` asks.
  void report(const testing::virtual_timing& timing);

 private:
  /// One collective of a group: every rank that issues its index joins it.
  struct collective {
    testing::timed_call call;
    op_code code = op_code::barrier;
    bool summed = false;  ///< the model's bytes: the ranks' sum (else the largest)
    bool modelled = true;
    std::uint64_t sum = 0, most = 0;
    int priced_with = 0;  ///< arrivals when last priced (0: never)
  };
  /// An issued call not yet waited for.
  struct pending {
    collective* call = nullptr;  ///< a collective's
    std::string group;
    int me = -1;                            ///< the group rank that issued it
    int recv_from = -2;                     ///< a receive's source (-1: any; -2: not a receive)
    double sent = 0;                        ///< a send's (or a batch's sends') arrival
    std::vector<int> recvs_from;            ///< a batch's receives
    std::weak_ptr<const work_state> state;  ///< an any-source receive's source, once done
    std::vector<pending> parts;             ///< a join's
  };
  using route = std::tuple<std::string, int, int>;  // group, source, destination

  const link_cost& link(int world_a, int world_b) const;
  void price(collective& c);
  /// Records `p` as what waiting for `s` means.
  void keep(const std::shared_ptr<work_state>& s, pending p);
  /// Rank `rank`'s clock after waiting for `p`.
  void settle(int rank, pending& p);
  /// The arrival of the next send on `r` (the receiver's clock if none).
  double received(const route& r, double now);

  std::mutex mtx_;
  testing::host_layout layout_;
  cost_model model_;   ///< the layout's, as the ranks choose by
  cost_model shared_;  ///< model_ on the layout's shared CPUs: point-to-point's links
  std::vector<double> now_;
  std::map<std::pair<std::string, std::uint64_t>, collective> calls_;  // stable addresses
  std::map<std::pair<std::string, int>, std::uint64_t> issued_;        // (group, rank) -> count
  std::map<std::string, std::shared_ptr<const group_topology>> topologies_;  // by group
  std::unordered_map<const work_state*, pending> pending_;
  std::map<route, std::deque<double>> in_flight_;  // sends' arrivals, not yet received
};

}  // namespace troupe::detail
