// rendezvous: sliced store waits that name missing and gone ranks
// (transport/rendezvous.hpp).

#include "transport/rendezvous.hpp"
#include "base/texts.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "troupe/error.hpp"
#include "troupe/store.hpp"

namespace troupe::detail {

namespace {

std::string this_host() {
  char buf[256] = {};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

bool process_ended(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

}  // namespace

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

rendezvous::rendezvous(store& s, int rank, int world_size, std::chrono::milliseconds timeout,
                       std::string gone_key)
    : store_(s),
      rank_(rank),
      timeout_(timeout),
      deadline_(clock::now() + timeout),
      gone_key_(std::move(gone_key)),
      host_(this_host()),
      known_(static_cast<std::size_t>(world_size)),
      gone_(static_cast<std::size_t>(world_size)) {}

rendezvous::~rendezvous() {
  for (auto& k : known_)
    if (k.pidfd >= 0) ::close(k.pidfd);
}

void rendezvous::learn(int r, const std::string& host, int pid) {
  std::lock_guard<std::mutex> g{mtx_};
  auto& k = known_.at(static_cast<std::size_t>(r));
  k.host = host;
  k.pid = pid;
#ifdef SYS_pidfd_open
  if (k.pidfd < 0 && host == host_ && pid > 0 && pid != ::getpid())
    k.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#endif
}

std::string rendezvous::describe(int r) const {
  // known_[r] changes only in learn(), which runs before any reader of it.
  const auto& k = known_.at(static_cast<std::size_t>(r));
  auto s = "world rank " + std::to_string(r);
  if (k.pid != 0) s += " (host " + k.host + ", pid " + std::to_string(k.pid) + ")";
  return s;
}

void rendezvous::read_gone_key() {
  if (gone_key_.empty() || !store_.check({gone_key_})) return;
  std::istringstream lines(troupe::to_string(store_.get(gone_key_)));
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    int r = -1, pid = 0;
    std::string host;
    if (!(in >> r >> host >> pid) || r < 0 || r >= static_cast<int>(gone_.size())) continue;
    auto& why = gone_[static_cast<std::size_t>(r)];
    if (why.empty())
      why = "world rank " + std::to_string(r) + " (host " + host + ", pid " + std::to_string(pid) +
            ") is gone: its connection to the store ended without a goodbye";
  }
}

std::string rendezvous::gone(int r) {
  std::lock_guard<std::mutex> g{mtx_};
  return gone_locked(r);
}

std::string rendezvous::gone_locked(int r) {
  auto& why = gone_.at(static_cast<std::size_t>(r));
  if (!why.empty()) return why;
  auto& k = known_[static_cast<std::size_t>(r)];
  if (k.pidfd >= 0 && process_ended(k.pidfd)) why = describe(r) + " is gone: its process ended";
  return why;
}

std::string rendezvous::gone_among(const std::vector<int>& ranks) {
  std::lock_guard<std::mutex> g{mtx_};
  read_gone_key();
  std::string why;
  for (int r : ranks)
    if (r != rank_)
      if (auto w = gone_locked(r); !w.empty()) why += (why.empty() ? "" : "; ") + w;
  return why;
}

void rendezvous::check(const std::vector<int>& ranks, const std::string& waiting_for) {
  std::string why;
  try {
    why = gone_among(ranks);
  } catch (const error& e) {
    if (e.code() != errc::store) throw;
    throw error(errc::store, "world: rank " + std::to_string(rank_) +
                                 " lost the store while waiting for " + waiting_for + ": " +
                                 e.what());
  }
  if (!why.empty())
    throw error(errc::peer_failure, "world: rank " + std::to_string(rank_) +
                                        " gave up building its world (waiting for " + waiting_for +
                                        "): " + why);
}

std::vector<int> rendezvous::everyone() const {
  std::vector<int> all(known_.size());
  for (std::size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
  return all;
}

void rendezvous::timed_out(const std::vector<int>& ranks, const std::string& what) const {
  throw error(errc::timeout, "world: rank " + std::to_string(rank_) + ": " +
                                 timeout_after(timeout_) + " waiting for " + rank_list(ranks) +
                                 " to " + what);
}

void rendezvous::wait_for(const std::vector<int>& ranks,
                          const std::function<std::string(int)>& key_of, const std::string& what) {
  std::vector<std::string> keys;
  for (int r : ranks) keys.push_back(key_of(r));
  const auto waiting_for = rank_list(ranks) + " to " + what;
  // The process serving the store (often rank 0) may end: every store call
  // here then says what this rank waited for.
  auto lost_store = [&](const error& e) {
    return error(errc::store, "world: rank " + std::to_string(rank_) +
                                  " lost the store while waiting for " + waiting_for + ": " +
                                  e.what());
  };
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - clock::now());
    try {
      store_.wait(keys, std::clamp(left, std::chrono::milliseconds(0), slice));
      return;
    } catch (const error& e) {
      if (e.code() == errc::store) throw lost_store(e);
      if (e.code() != errc::timeout) throw;
    }
    // Any rank gone dooms the world, not only those waited for here.
    check(everyone(), waiting_for);
    if (clock::now() < deadline_) continue;
    std::vector<int> missing;
    try {
      for (std::size_t i = 0; i < ranks.size(); ++i)
        if (!store_.check({keys[i]})) missing.push_back(ranks[i]);
    } catch (const error& e) {
      if (e.code() == errc::store) throw lost_store(e);
      throw;
    }
    if (missing.empty()) return;  // they came at the last moment
    timed_out(missing, what);
  }
}

}  // namespace troupe::detail
