#include "base/wait_chain.hpp"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/store.hpp"

namespace troupe::detail {

told_waits wait_chain(store& waits, std::uint64_t seq, int rank, int size, int peer,
                      const std::string& what, const std::function<std::string(int)>& name,
                      std::chrono::milliseconds timeout) {
  using std::chrono::milliseconds;
  // The others time out about when this rank did (each from its own issue):
  // a tenth of the timeout, 100 ms to 2 s, for their word to arrive.
  const auto grace = std::clamp<milliseconds>(timeout / 10, milliseconds(100), milliseconds(2000));
  const auto until = std::chrono::steady_clock::now() + grace;
  const std::string base = "engines/waits/" + std::to_string(seq) + "/";
  std::string chain;
  int at = peer;
  try {
    waits.set(base + std::to_string(rank), to_bytes(std::to_string(peer) + " " + what));
    std::vector<int> seen{rank};
    for (;;) {
      if (std::find(seen.begin(), seen.end(), at) != seen.end())
        return {chain + "; so these ranks wait for each other in a cycle", -1};
      seen.push_back(at);
      const auto key = base + std::to_string(at);
      bool told = waits.check({key});
      const auto left =
          std::chrono::duration_cast<milliseconds>(until - std::chrono::steady_clock::now());
      if (!told && left.count() > 0) {
        try {
          waits.wait({key}, left);
          told = true;
        } catch (const error& e) {
          if (e.code() != errc::timeout) throw;
        }
      }
      if (!told) break;  // `at` waits for nobody on this call
      const auto v = troupe::to_string(waits.get(key));
      const auto space = v.find(' ');
      const int next = space == std::string::npos ? -1 : std::atoi(v.c_str());
      if (next < 0 || next >= size) break;
      chain +=
          "; " + name(at) + " was itself waiting for " + name(next) + " to " + v.substr(space + 1);
      at = next;
    }
  } catch (const std::exception&) {
    // The store is gone or refuses: what was learned so far.
  }
  if (chain.empty()) return {};
  return {chain +
              ", which has not timed out on this call: the wait starts there (a rank that "
              "is stopped, busy outside troupe's calls, or never issued this call)",
          at};
}

std::string blame(const std::string& waited, const told_waits& told,
                  const std::function<std::string(int)>& name) {
  if (told.start < 0 || waited.rfind("waiting for ", 0) != 0) return waited + told.chain;
  return "waiting for " + name(told.start) + ", where a chain of waits starts: this rank was " +
         waited + told.chain;
}

}  // namespace troupe::detail
