#include "base/wait_chain.hpp"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "base/call_until.hpp"
#include "troupe/error.hpp"
#include "troupe/store.hpp"

namespace troupe::detail {
namespace {

/// "PEER WHAT", as a rank tells its wait: {PEER, WHAT}, PEER -1 if not so.
std::pair<int, std::string> told_wait(const std::string& v, int size) {
  const auto space = v.find(' ');
  const int next = space == std::string::npos ? -1 : std::atoi(v.c_str());
  if (next < 0 || next >= size) return {-1, {}};
  return {next, v.substr(space + 1)};
}

/// Where the ranks tell their waits on call `seq` (a key per group rank).
std::string waits_base(std::uint64_t seq) {
  return "engines/waits/" + std::to_string(seq) + "/";
}

/// Tells that group rank `rank`'s call `seq` waits for `peer` to `what`
/// ("PEER WHAT", as told_wait reads it).
void tell(store& waits, std::uint64_t seq, int rank, int peer, const std::string& what) {
  waits.set(waits_base(seq) + std::to_string(rank), to_bytes(std::to_string(peer) + " " + what));
}

/// How a chain ends at the rank where the wait starts.
constexpr const char* starts_there =
    ", which has not timed out on this call: the wait starts there (a rank that is stopped, "
    "busy outside troupe's calls, or never issued this call)";

/// How many ranks' waits a chain that ends in a cycle reads, at most.
constexpr int cycle_look_limit = 256;

/// Where a cycle of waits among ranks `seen` is held up from: a wait that
/// another rank told, not into the cycle, for a rank that told none (it
/// has not timed out: stopped, as a rule). Live ranks wait for each other
/// in a cycle where their messages are still in flight behind data that a
/// stopped rank holds up (a chain's rings, full because the rank after it
/// stopped): {teller, the rank it waits for, what for}; teller -1: none.
std::tuple<int, int, std::string> held_up_from(store& waits, const std::string& base, int size,
                                               const std::vector<int>& seen) {
  auto in = [&](int r) { return std::find(seen.begin(), seen.end(), r) != seen.end(); };
  for (int r = 0; r < std::min(size, cycle_look_limit); ++r) {
    if (in(r) || !waits.check({base + std::to_string(r)})) continue;
    auto [next, what] = told_wait(troupe::to_string(waits.get(base + std::to_string(r))), size);
    if (next < 0 || in(next) || waits.check({base + std::to_string(next)})) continue;
    return {r, next, what};
  }
  return {-1, -1, {}};
}

}  // namespace

namespace {

/// What the store said of a chain of waits, before anyone is named: each
/// step (a rank, the rank it waited for, what for), then either a cycle and
/// where it is held up from, or the rank the chain ends at.
struct read_waits {
  std::vector<std::tuple<int, int, std::string>> steps;
  bool cycle = false;
  std::tuple<int, int, std::string> held_up{-1, -1, {}};  // held_up_from's
  int end = -1;
};

/// Reads the chain from `peer` (see wait_chain); what the store refuses
/// ends it where it was.
read_waits read_chain(store& waits, std::uint64_t seq, int rank, int size, int peer,
                      const std::string& what, std::chrono::steady_clock::time_point until) {
  using std::chrono::milliseconds;
  read_waits out;
  const std::string base = waits_base(seq);
  int at = peer;
  try {
    tell(waits, seq, rank, peer, what);
    std::vector<int> seen{rank};
    for (;;) {
      if (std::find(seen.begin(), seen.end(), at) != seen.end()) {
        out.cycle = true;
        out.held_up = held_up_from(waits, base, size, seen);
        return out;
      }
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
      auto [next, next_what] = told_wait(troupe::to_string(waits.get(key)), size);
      if (next < 0) break;
      out.steps.emplace_back(at, next, std::move(next_what));
      at = next;
    }
  } catch (const std::exception&) {
    // The store is gone or refuses: what was learned so far.
  }
  out.end = at;
  return out;
}

/// How long past its tenth of the timeout a chain's reading may take
/// before the caller goes on without it (a store whose server stopped).
constexpr std::chrono::milliseconds store_slack{500};

}  // namespace

told_waits wait_chain(const std::shared_ptr<store>& waits, std::uint64_t seq, int rank, int size,
                      int peer, const std::string& what,
                      const std::function<std::string(int)>& name,
                      std::chrono::milliseconds timeout) {
  using std::chrono::milliseconds;
  // The others time out about when this rank did (each from its own issue):
  // a tenth of the timeout, 100 ms to 2 s, for their word to arrive.
  const auto grace = std::clamp<milliseconds>(timeout / 10, milliseconds(100), milliseconds(2000));
  const auto until = std::chrono::steady_clock::now() + grace;
  // The store is read on a thread of its own (base/call_until.hpp): one
  // whose server stopped holds a call up to the store's own timeout.
  const auto read =
      call_until([waits, seq, rank, size, peer, what,
                  until] { return read_chain(*waits, seq, rank, size, peer, what, until); },
                 until + store_slack);
  if (!read) return {};
  const auto& w = *read;
  std::string chain;
  for (const auto& [at, next, next_what] : w.steps)
    chain += "; " + name(at) + " was itself waiting for " + name(next) + " to " + next_what;
  if (w.cycle) {
    chain += "; so these ranks wait for each other in a cycle";
    const auto& [teller, held, held_what] = w.held_up;
    if (teller < 0) return {chain, -1};
    return {chain + ", held up where " + name(teller) + " was waiting for " + name(held) + " to " +
                held_what + starts_there,
            held};
  }
  if (chain.empty()) return {};
  return {chain + starts_there, w.end};
}

void tell_wait_early(const std::shared_ptr<store>& waits, std::uint64_t seq, int rank, int peer,
                     const std::string& what, std::chrono::milliseconds timeout) noexcept {
  // Never waited for (see wait_chain): a store that does not answer leaves
  // the chain shorter, not the call later. What it refuses is left untold.
  call_until(
      [waits, seq, rank, peer,
       text = what + " (still waiting after " + std::to_string(tell_early_after(timeout).count()) +
              " ms, half its call's timeout)"] {
        tell(*waits, seq, rank, peer, text);
        return true;
      },
      std::chrono::steady_clock::now());
}

std::string blame(const std::string& waited, const told_waits& told,
                  const std::function<std::string(int)>& name) {
  if (told.start < 0 || waited.rfind("waiting for ", 0) != 0) return waited + told.chain;
  return "waiting for " + name(told.start) + ", where a chain of waits starts: this rank was " +
         waited + told.chain;
}

}  // namespace troupe::detail
