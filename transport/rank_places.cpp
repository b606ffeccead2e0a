// rank_places (transport/rank_places.hpp): the table read from the store's entries.

#include "transport/rank_places.hpp"

#include <cstdlib>
#include <unordered_map>

#include "troupe/error.hpp"

namespace troupe::detail {

rank_places read_rank_places(const std::vector<bytes>& entries, const std::string& this_identity) {
  rank_places t;
  t.process_of.reserve(entries.size());
  std::unordered_map<std::string, int> index;  // by identity
  for (std::size_t r = 0; r < entries.size(); ++r) {
    auto v = troupe::to_string(entries[r]);
    // The last field, the CPUs, read first (from the right: a host's name
    // may hold spaces).
    int cpus = 0;
    if (const auto d = v.rfind(' '); d != std::string::npos && d > 0) {
      cpus = std::atoi(v.c_str() + d + 1);
      v.resize(d);
    }
    const auto a = v.find(' '), c = v.rfind(' ');
    const auto b = c == std::string::npos || c == 0 ? std::string::npos : v.rfind(' ', c - 1);
    if (a == std::string::npos || b == std::string::npos || a >= b)
      throw error(errc::backend, "data plane: rank " + std::to_string(r) +
                                     "'s process identity in the store is malformed: '" + v + "'");
    auto identity = v.substr(0, a);
    auto [it, fresh] = index.emplace(identity, static_cast<int>(t.processes.size()));
    if (fresh) {
      rank_places::process p;
      p.identity = std::move(identity);
      p.host = v.substr(a + 1, b - a - 1);
      p.pid = std::atoi(v.substr(b + 1, c - b - 1).c_str());
      p.route = v.substr(c + 1);
      p.cpus = cpus;
      if (p.identity == this_identity) t.here = it->second;
      t.processes.push_back(std::move(p));
    }
    ++t.processes[static_cast<std::size_t>(it->second)].ranks;
    t.process_of.push_back(it->second);
  }
  return t;
}

}  // namespace troupe::detail
