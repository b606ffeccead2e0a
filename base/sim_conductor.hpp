#pragma once
// sim_conductor — the turn scheduler of troupe::testing::simulate
// (include/troupe/simulation.hpp). One rank runs at a time; at every troupe
// call and every turn of a wait the running rank hands the turn to one that
// a seeded generator picks. A wait whose work cannot progress hands the
// turn on; when every live rank waits and a whole round of turns moved
// nothing, the waits fail (virtual time ran out, or a fault caused it).

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace troupe::detail {

struct work_state;

/// One call as a timed simulation's clock sees it (api/virtual_clock.cpp):
/// the group, this rank in it, the bytes of the tensors the call was given,
/// the peer of a point-to-point call (a group rank; -1: none or any).
struct sim_call {
  const char* op;
  const std::string& group;
  const std::vector<int>& members;  ///< the group's ranks in the world, by group rank
  int group_rank;
  std::uint64_t bytes;
  int peer;
  /// batch_isend_irecv's operations: whether each sends, its peer, its bytes.
  struct part {
    bool send;
    int peer;
    std::uint64_t bytes;
  };
  std::vector<part> parts;
};

/// The virtual time of a timed simulation (simulation_options::timing): told
/// of each call a rank issues and of each wait that returned. Only the rank
/// holding the turn calls it.
class sim_clock {
 public:
  virtual ~sim_clock() = default;
  virtual void issued(int rank, const std::shared_ptr<work_state>& s, const sim_call& c) = 0;
  virtual void waited(int rank, const work_state& s) = 0;
  /// `all` completes once each of `parts` did (work::when_all, a coalesced
  /// batch): waiting for it waits for them.
  virtual void joined(int rank, const std::shared_ptr<work_state>& all,
                      const std::vector<const work_state*>& parts) = 0;
  /// Rank `rank`'s clock, in virtual seconds since the start.
  virtual double now(int rank) = 0;
  /// Rank `rank` computes for `seconds`: its clock moves on.
  virtual void compute(int rank, double seconds) = 0;
};

/// Thrown on a rank that a fault kills or frees from its freeze at the end.
struct sim_stop {
  bool killed = false;
};

class sim_conductor {
 public:
  struct fault_rule {
    bool kill = true;  // else freeze
    int rank = 0;
    int at_call = 1;
  };
  sim_conductor(int n, std::uint64_t seed, std::vector<fault_rule> faults, std::string* log);
  ~sim_conductor();
  sim_conductor(const sim_conductor&) = delete;
  sim_conductor& operator=(const sim_conductor&) = delete;

  /// The rank's thread starts: waits for its first turn (once all entered).
  void enter(int rank);
  /// At a troupe call: counts it, applies a fault (throws sim_stop), then
  /// hands the turn on.
  void call(int rank, const char* op);
  /// wait() in a simulation: turns until `s` finished; throws when the
  /// ranks stalled (timeout or the injected fault's error).
  void wait(int rank, work_state& s);
  /// The rank's function ended (or it was killed): the turn goes on.
  void leave(int rank, bool killed);
  std::uint64_t seed() const noexcept { return seed_; }
  /// The virtual clock of a timed simulation (null: untimed).
  sim_clock* clock() const noexcept { return clock_; }
  void set_clock(sim_clock* c) noexcept { clock_ = c; }

 private:
  enum class st { starting, live, frozen, done };
  void log_locked(int rank, const std::string& what);
  /// Hands the turn to a live rank the generator picks (the caller holds
  /// mtx_) and wakes that rank alone: a turn costs the same at 16 ranks as
  /// at 16,384.
  void pass_locked();
  /// Every rank entered (or failed before): the first turn.
  void start_locked();
  void wait_turn(std::unique_lock<std::mutex>& g, int rank);
  std::uint64_t next_random();
  /// Rank r's state becomes `s` (frozen or done): it leaves the live set.
  void set_state_locked(int r, st s);
  /// Something moved: every rank's quiet turn is forgotten (a new epoch).
  void moved_locked();
  /// Rank r had a wait turn that moved nothing; whether every live rank
  /// now had one since anything last moved.
  bool quiet_locked(int r);

  std::mutex mtx_;
  std::vector<std::condition_variable> turn_;  // one per rank: its turn came
  int n_;
  std::uint64_t seed_, rng_;
  std::vector<fault_rule> faults_;
  std::string* log_;
  std::vector<st> state_;
  std::vector<int> live_;     // the live ranks, in no order
  std::vector<int> live_at_;  // rank -> its index in live_ (-1: not live)
  std::vector<int> calls_;
  std::vector<bool> stalled_;  // the rank's current wait fails at its next turn
  std::vector<bool> issued_;   // the rank issued a call since its last wait turn
  int entered_ = 0;
  int current_ = -1;
  // Quiet ranks (a wait turn that moved nothing since anything moved): the
  // epoch each last went quiet in, and how many live ones did in this one.
  std::uint64_t epoch_ = 1;
  std::vector<std::uint64_t> quiet_in_;
  int quiet_ = 0;
  std::vector<int> killed_, frozen_;
  bool releasing_ = false;  // only frozen ranks are left: they end
  sim_clock* clock_ = nullptr;
};

/// The conductor of the simulation this thread is a rank of (null: none).
sim_conductor* sim_here() noexcept;
/// Whether this thread is a rank of a simulation, cheaply: one relaxed load
/// while no simulation runs in the process (hot loops may ask it).
bool in_simulation() noexcept;
int sim_rank_here() noexcept;
void set_sim_here(sim_conductor* c, int rank) noexcept;
/// Whether this thread is a rank of a timed simulation (a clock to tell).
inline bool timed_here() noexcept {
  return in_simulation() && sim_here()->clock() != nullptr;
}
/// Tells a timed simulation's clock of a call this rank issued.
void sim_issued(const std::shared_ptr<work_state>& s, const sim_call& c);
/// Tells a timed simulation's clock that `all` joins `parts`.
void sim_joined(const std::shared_ptr<work_state>& all,
                const std::vector<const work_state*>& parts);

}  // namespace troupe::detail
