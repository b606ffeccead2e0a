#pragma once
// rank_places — where the ranks of a job run: the process, host and pid each
// rank wrote to the store as it joined (transport/data_plane.cpp), read once
// per process and shared by the ranks of this process (a record per rank in
// each of n ranks of a simulation would be n^2 records).

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/store.hpp"

namespace troupe::detail {

struct rank_places {
  struct process {
    std::string identity;  ///< process_identity() of that process
    std::string host;
    int pid = 0;
    std::string route;  ///< how its ranks run collectives (TROUPE_ENGINE)
    int ranks = 0;      ///< world ranks it runs
    int cpus = 0;       ///< the CPUs its launcher may use (host_cpus(); 0: not said)
  };
  std::vector<process> processes;        ///< each once, in the order of their first rank
  std::vector<std::int32_t> process_of;  ///< by world rank: its index in `processes`
  int here = -1;                         ///< the index of this process

  const process& of(int r) const {
    return processes[static_cast<std::size_t>(process_of[static_cast<std::size_t>(r)])];
  }
  bool local(int r) const { return process_of[static_cast<std::size_t>(r)] == here; }
  int size() const noexcept { return static_cast<int>(process_of.size()); }
};

/// The table of `entries` ("identity host pid route cpus", by world rank) as seen
/// from the process `this_identity`; throws errc::backend naming a
/// malformed entry.
rank_places read_rank_places(const std::vector<bytes>& entries, const std::string& this_identity);

}  // namespace troupe::detail
