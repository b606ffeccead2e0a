#pragma once
// rendezvous — a world's ranks meeting through the store while the world is
// built (api/world.cpp, transport/data_plane.cpp), and naming the ranks that
// do not come.
//
// Every wait ends by one deadline for the whole rendezvous (the world's
// timeout from its start), and then names the ranks still missing, not
// store keys. A rank whose process is known to be gone fails the others at
// once, named with its host and pid:
//  - the store server saw its connection end without a goodbye: a rank that
//    reaches the store through tcp_store asks the server to append
//    "rank host pid" to the job's gone key if that happens
//    (tcp_store::append_on_disconnect);
//  - its process ran on this host and has ended (pidfd), once its identity
//    is known (learn);
//  - it gave up building its world for a reason of its own (a rank it saw
//    gone, a setting it rejected; not its timeout, which the others reach
//    by theirs): give_up() appends the reason to the job's gave-up key, and
//    the others quote it. Only reasons a rank found itself are written, not
//    those read from the store, so no chain of quotes forms.
// Waits for missing ranks look for any of these every 100 ms.

#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace troupe {
class store;
}

namespace troupe::detail {

struct rank_places;

class rendezvous {
 public:
  using clock = std::chrono::steady_clock;
  /// `gone_key`: the key the store server appends the gone ranks' lines to
  /// (empty: the store cannot tell); `gave_up_key`: the key ranks that give
  /// up append their reasons to.
  rendezvous(store& s, int rank, int world_size, std::chrono::milliseconds timeout,
             std::string gone_key, std::string gave_up_key);
  ~rendezvous();
  rendezvous(const rendezvous&) = delete;
  rendezvous& operator=(const rendezvous&) = delete;

  /// Waits until `key_of(r)` exists for every world rank r of `ranks`.
  /// Throws errc::peer_failure at once when any rank is known to be gone,
  /// errc::timeout naming the ranks still missing at the deadline. `what`
  /// says what they were to do ("publish their address").
  void wait_for(const std::vector<int>& ranks, const std::function<std::string(int)>& key_of,
                const std::string& what);
  /// This rank wrote `key_of(its rank)`: counts it in under `counter` and
  /// waits until every world rank did. The last to count itself in writes
  /// `counter`/all, the one key every rank waits for (waiting for n keys
  /// each, n ranks would read n^2 keys). Fails as wait_for does, naming the
  /// ranks whose key is missing at the deadline.
  void wait_for_everyone(const std::string& counter, const std::function<std::string(int)>& key_of,
                         const std::string& what);
  /// This rank gives up building its world because of `e`: the others are
  /// told (tell), unless this rank only learned it from the store; they
  /// fail at once by a peer failure quoting it. Never throws.
  void give_up(const std::exception& e) noexcept;
  /// A line of a gave-up key: the world rank that gave up, and why.
  struct gave_up_line {
    int rank = -1;
    std::string reason;
  };
  /// The lines of `key` that other world ranks wrote with tell(); lines
  /// that are not one are ignored (anyone may write to the store). A
  /// group's set-up reads and writes its own key so (api/world.cpp: a
  /// member whose backend failed to start).
  std::vector<gave_up_line> read_gave_up(const std::string& key);
  /// Appends this rank's line to `key`: it gave up because of `e`; not
  /// where `e` is its own timeout (the others reach theirs, naming who is
  /// missing) or a failed store (the write would wait for it). Never throws
  /// (the store may be gone).
  void tell(const std::string& key, const std::exception& e) noexcept;
  /// Records where every world rank runs (its process can then be watched on this host).
  void learn(std::shared_ptr<const rank_places> places);
  /// How errors name world rank r: "world rank 2 (host h, pid 7)" once known.
  std::string describe(int r) const;
  /// Why world rank r is known to be gone ("" while it is not).
  std::string gone(int r);
  /// Why ranks of `ranks` are known to be gone ("" while none is).
  std::string gone_among(const std::vector<int>& ranks);
  /// Throws errc::peer_failure when a rank of `ranks` is known to be gone,
  /// saying what this rank was `waiting_for` ("rank 2 to publish its address").
  void check(const std::vector<int>& ranks, const std::string& waiting_for);
  /// check() of every world rank.
  void check_everyone(const std::string& waiting_for);
  /// Throws errc::timeout: `ranks` did not `what` by the deadline.
  [[noreturn]] void timed_out(const std::vector<int>& ranks, const std::string& what) const;
  clock::time_point deadline() const noexcept { return deadline_; }
  /// How long one look lasts before liveness is checked again.
  static constexpr std::chrono::milliseconds slice{100};

 private:
  /// Reads the gone key and the gave-up key (a store round trip each) into
  /// gone_ (under mtx_).
  void read_store_records();
  /// Polls the watched processes (under mtx_); true when one has ended.
  bool look_at_processes();
  /// Why world rank r is gone, after a look (under mtx_).
  std::string gone_locked(int r);
  /// check() of the ranks `rank_at(i)`, i in [0, count).
  void check_of(int count, const std::function<int(int)>& rank_at, const std::string& waiting_for);
  /// Why ranks are gone, for each r of [0, count) `rank_at(i)` other than
  /// this one, and whether every reason given was read from the store.
  struct gone_reasons {
    std::string why;
    bool from_store = false;
  };
  gone_reasons gone_of(int count, const std::function<int(int)>& rank_at);
  /// Waits for `keys` in slices, checking that nobody is gone; `at_deadline`
  /// runs when the time is up and some are still missing.
  void wait_keys(const std::vector<std::string>& keys, const std::string& waiting_for,
                 const std::function<void()>& at_deadline);

  store& store_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  clock::time_point deadline_;
  std::string gone_key_;
  std::string gave_up_key_;
  std::string host_;
  std::mutex mtx_;  // guards watched_ and gone_ (groups are made from any thread)
  std::shared_ptr<const rank_places> places_;  // set once by learn(), before any reader
  struct watched {
    int process = -1;  // index in places_->processes
    int pidfd = -1;
    bool ended = false;
  };
  std::vector<watched> watched_;     // the job's other processes on this host
  std::map<int, std::string> gone_;  // world rank -> why it is gone
  std::set<int> from_store_;         // ranks whose gone_ was read from the store
  std::set<int> quoted_;             // of those, ranks whose gone_ quotes their own reason
  bool told_by_store_ = false;  // every reason of the failure check() last threw was read there
};

/// "ranks 2, 3" / "rank 2".
std::string rank_list(const std::vector<int>& ranks);

}  // namespace troupe::detail
