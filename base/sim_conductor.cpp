// sim_conductor (sim_conductor.hpp).

#include "base/sim_conductor.hpp"

#include <atomic>
#include <string>

#include "base/work_state.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

namespace {
thread_local sim_conductor* here = nullptr;
thread_local int here_rank = -1;
std::atomic<int> conductors{0};  // of simulations running in this process
}  // namespace

sim_conductor* sim_here() noexcept {
  return here;
}
int sim_rank_here() noexcept {
  return here_rank;
}
bool in_simulation() noexcept {
  return conductors.load(std::memory_order_relaxed) != 0 && here != nullptr;
}
void set_sim_here(sim_conductor* c, int rank) noexcept {
  here = c;
  here_rank = rank;
}

sim_conductor::sim_conductor(int n, std::uint64_t seed, std::vector<fault_rule> faults,
                             std::string* log)
    : n_(n),
      seed_(seed),
      rng_(seed),
      faults_(std::move(faults)),
      log_(log),
      state_(static_cast<std::size_t>(n), st::starting),
      calls_(static_cast<std::size_t>(n), 0),
      stalled_(static_cast<std::size_t>(n), false),
      quiet_(static_cast<std::size_t>(n), false) {
  conductors.fetch_add(1);
}

sim_conductor::~sim_conductor() {
  conductors.fetch_sub(1);
}

std::uint64_t sim_conductor::next_random() {
  // splitmix64: the same sequence for the same seed on every platform.
  std::uint64_t z = (rng_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void sim_conductor::log_locked(int rank, const std::string& what) {
  if (log_) *log_ += "r" + std::to_string(rank) + " " + what + "\n";
}

void sim_conductor::moved_locked() {
  quiet_.assign(static_cast<std::size_t>(n_), false);
}

void sim_conductor::pass_locked() {
  std::vector<int> live;
  for (int r = 0; r < n_; ++r)
    if (state_[static_cast<std::size_t>(r)] == st::live) live.push_back(r);
  if (live.empty()) {
    // Only frozen ranks are left (or none): they end now.
    releasing_ = true;
    current_ = -1;
  } else {
    current_ = live[static_cast<std::size_t>(next_random() % live.size())];
  }
  cv_.notify_all();
}

void sim_conductor::wait_turn(std::unique_lock<std::mutex>& g, int rank) {
  const auto r = static_cast<std::size_t>(rank);
  cv_.wait(g, [&] { return current_ == rank || (releasing_ && state_[r] == st::frozen); });
  if (state_[r] == st::frozen) {
    state_[r] = st::done;
    throw sim_stop{false};
  }
}

void sim_conductor::enter(int rank) {
  std::unique_lock<std::mutex> g{mtx_};
  state_[static_cast<std::size_t>(rank)] = st::live;
  if (++entered_ == n_) pass_locked();
  wait_turn(g, rank);
}

void sim_conductor::call(int rank, const char* op) {
  std::unique_lock<std::mutex> g{mtx_};
  const auto r = static_cast<std::size_t>(rank);
  const int k = ++calls_[r];
  moved_locked();
  for (const auto& f : faults_) {
    if (f.rank != rank || f.at_call != k) continue;
    if (f.kill) {
      log_locked(rank, std::string("killed at call ") + std::to_string(k) + " (" + op + ")");
      state_[r] = st::done;
      killed_.push_back(rank);
      throw sim_stop{true};  // its world goes; leave() passes the turn
    }
    log_locked(rank, std::string("frozen at call ") + std::to_string(k) + " (" + op + ")");
    state_[r] = st::frozen;
    frozen_.push_back(rank);
    pass_locked();
    wait_turn(g, rank);  // throws once the others are done
  }
  log_locked(rank, op);
  pass_locked();
  wait_turn(g, rank);
}

void sim_conductor::wait(int rank, work_state& s) {
  const auto r = static_cast<std::size_t>(rank);
  for (;;) {
    if (!s.finished.load() && s.driver) {
      // With every other rank parked, a pass moves all that can move now.
      s.driver->poke();
      s.driver->poke();
    }
    std::unique_lock<std::mutex> g{mtx_};
    if (s.finished.load()) {
      moved_locked();
      return;
    }
    // Stalled once every live rank had a turn in a wait that moved nothing
    // since anything last moved (a call, or a wait that ended).
    quiet_[r] = true;
    bool all_quiet = true;
    for (int q = 0; q < n_; ++q)
      if (state_[static_cast<std::size_t>(q)] == st::live && !quiet_[static_cast<std::size_t>(q)])
        all_quiet = false;
    if (all_quiet && !stalled_[r]) {
      for (int q = 0; q < n_; ++q)
        if (state_[static_cast<std::size_t>(q)] == st::live)
          stalled_[static_cast<std::size_t>(q)] = true;
      moved_locked();
    }
    if (stalled_[r]) {
      stalled_[r] = false;
      const auto where = std::string(s.op) + " on group '" + s.group + "' (seq " +
                         std::to_string(s.seq.load()) + ") failed: ";
      const auto seed = " (fault injection, seed " + std::to_string(seed_) + ")";
      log_locked(rank, std::string("fails ") + s.op);
      if (!killed_.empty())
        throw error(errc::peer_failure,
                    where + "rank " + std::to_string(killed_.front()) + " was killed" + seed);
      if (!frozen_.empty())
        throw error(errc::timeout, where + "Timed out (virtual time) waiting for rank " +
                                       std::to_string(frozen_.front()) + ", which is frozen" +
                                       seed);
      throw error(errc::timeout, where +
                                     "Timed out (virtual time): every rank waits and nothing can "
                                     "progress (a deadlock; seed " +
                                     std::to_string(seed_) + ")");
    }
    log_locked(rank, std::string("wait ") + s.op);
    pass_locked();
    wait_turn(g, rank);
  }
}

void sim_conductor::leave(int rank, bool killed) {
  std::unique_lock<std::mutex> g{mtx_};
  const auto r = static_cast<std::size_t>(rank);
  const bool had_turn = current_ == rank;
  if (state_[r] != st::done) {
    state_[r] = st::done;
    log_locked(rank, killed ? "killed" : "done");
  }
  if (had_turn || killed) pass_locked();
}

}  // namespace troupe::detail
