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

void sim_issued(const std::shared_ptr<work_state>& s, const sim_call& c) {
  if (s && timed_here()) here->clock()->issued(here_rank, s, c);
}

void sim_joined(const std::shared_ptr<work_state>& all,
                const std::vector<const work_state*>& parts) {
  if (timed_here()) here->clock()->joined(here_rank, all, parts);
}

sim_conductor::sim_conductor(int n, std::uint64_t seed, std::vector<fault_rule> faults,
                             std::string* log)
    : turn_(static_cast<std::size_t>(n)),
      n_(n),
      seed_(seed),
      rng_(seed),
      faults_(std::move(faults)),
      log_(log),
      state_(static_cast<std::size_t>(n), st::starting),
      live_at_(static_cast<std::size_t>(n), -1),
      calls_(static_cast<std::size_t>(n), 0),
      stalled_(static_cast<std::size_t>(n), false),
      issued_(static_cast<std::size_t>(n), false),
      quiet_in_(static_cast<std::size_t>(n), 0) {
  live_.reserve(static_cast<std::size_t>(n));
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
  ++epoch_;
  quiet_ = 0;
}

bool sim_conductor::quiet_locked(int r) {
  auto& in = quiet_in_[static_cast<std::size_t>(r)];
  if (in != epoch_) {
    in = epoch_;
    ++quiet_;
  }
  return quiet_ == static_cast<int>(live_.size());
}

void sim_conductor::set_state_locked(int r, st s) {
  const auto i = static_cast<std::size_t>(r);
  if (state_[i] == st::live && s != st::live) {
    // Out of the live set: the last one takes its place.
    const int at = live_at_[i];
    live_[static_cast<std::size_t>(at)] = live_.back();
    live_at_[static_cast<std::size_t>(live_.back())] = at;
    live_.pop_back();
    live_at_[i] = -1;
    if (quiet_in_[i] == epoch_) --quiet_;
  }
  state_[i] = s;
}

void sim_conductor::start_locked() {
  // The ranks entered in whatever order their set-up ended: the live set
  // starts in rank order, so the schedule follows from the seed alone.
  for (int r = 0; r < n_; ++r)
    if (state_[static_cast<std::size_t>(r)] == st::live) {
      live_at_[static_cast<std::size_t>(r)] = static_cast<int>(live_.size());
      live_.push_back(r);
    }
  pass_locked();
}

void sim_conductor::pass_locked() {
  if (live_.empty()) {
    // Only frozen ranks are left (or none): they end now.
    releasing_ = true;
    current_ = -1;
    for (int f : frozen_) turn_[static_cast<std::size_t>(f)].notify_one();
    return;
  }
  // The live set's order follows from the seed too (every change to it is
  // made in a turn), so the pick does.
  current_ = live_[static_cast<std::size_t>(next_random() % live_.size())];
  turn_[static_cast<std::size_t>(current_)].notify_one();
}

void sim_conductor::wait_turn(std::unique_lock<std::mutex>& g, int rank) {
  const auto r = static_cast<std::size_t>(rank);
  turn_[r].wait(g, [&] { return current_ == rank || (releasing_ && state_[r] == st::frozen); });
  if (state_[r] == st::frozen) {
    state_[r] = st::done;
    throw sim_stop{false};
  }
}

void sim_conductor::enter(int rank) {
  std::unique_lock<std::mutex> g{mtx_};
  state_[static_cast<std::size_t>(rank)] = st::live;
  if (++entered_ == n_) start_locked();
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
      set_state_locked(rank, st::done);
      killed_.push_back(rank);
      throw sim_stop{true};  // its world goes; leave() passes the turn
    }
    log_locked(rank, std::string("frozen at call ") + std::to_string(k) + " (" + op + ")");
    set_state_locked(rank, st::frozen);
    frozen_.push_back(rank);
    pass_locked();
    wait_turn(g, rank);  // throws once the others are done
  }
  log_locked(rank, op);
  pass_locked();
  wait_turn(g, rank);
  // The call is issued after this, in this turn: what it moves (a post
  // others wait for) counts at the rank's next turn (issued_).
  issued_[r] = true;
}

void sim_conductor::wait(int rank, work_state& s) {
  const auto r = static_cast<std::size_t>(rank);
  for (;;) {
    bool moved = false;
    if (!s.finished.load() && s.driver) {
      // With every other rank parked, a pass moves all that can move now.
      moved = s.driver->poke();
      moved = s.driver->poke() || moved;
    }
    std::unique_lock<std::mutex> g{mtx_};
    if (s.finished.load()) {
      moved_locked();
      return;
    }
    // A pass that moved part of an operation (a chunk of a large message
    // copied) is progress too, and so is the call this rank issued since
    // its last wait turn: the wait is not quiet.
    if (issued_[r]) {
      issued_[r] = false;
      moved = true;
    }
    if (moved) moved_locked();
    // Stalled once every live rank had a turn in a wait that moved nothing
    // since anything last moved (a call, a pass, or a wait that ended).
    if (!moved && quiet_locked(rank) && !stalled_[r]) {
      for (int q : live_) stalled_[static_cast<std::size_t>(q)] = true;
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
  if (state_[r] == st::starting) {
    // Its set-up failed: the others start without it.
    state_[r] = st::done;
    if (++entered_ == n_) start_locked();
    return;
  }
  if (issued_[r]) moved_locked();  // what it issued last may have moved others
  if (state_[r] != st::done) {
    set_state_locked(rank, st::done);
    log_locked(rank, killed ? "killed" : "done");
  }
  if (had_turn || killed) pass_locked();
}

}  // namespace troupe::detail
