// rendezvous: sliced store waits that name missing and gone ranks
// (transport/rendezvous.hpp).

#include "transport/rendezvous.hpp"

#include "base/texts.hpp"
#include "transport/data_plane.hpp"
#include "transport/rank_places.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "troupe/error.hpp"
#include "troupe/store.hpp"

namespace troupe::detail {

namespace {

/// The longest reason a rank that gave up writes, and another quotes (each
/// rank reads every line; a reason may name many ranks).
constexpr std::size_t longest_reason = 2000;

std::string cut(const std::string& why) {
  if (why.size() <= longest_reason) return why;
  std::string shorter;
  shorter.reserve(longest_reason + 4);  // (GCC 12 warns falsely where it starts short)
  shorter.append(why, 0, longest_reason).append(" ...");
  return shorter;
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
                       std::string gone_key, std::string gave_up_key)
    : store_(s),
      rank_(rank),
      world_size_(world_size),
      timeout_(timeout),
      deadline_(clock::now() + timeout),
      gone_key_(std::move(gone_key)),
      gave_up_key_(std::move(gave_up_key)),
      host_(host_name()) {}

rendezvous::~rendezvous() {
  for (auto& w : watched_)
    if (w.pidfd >= 0) ::close(w.pidfd);
}

void rendezvous::learn(std::shared_ptr<const rank_places> places) {
  std::lock_guard<std::mutex> g{mtx_};
  places_ = std::move(places);
  // One pidfd per process of the job on this host, not per rank.
  for (std::size_t i = 0; i < places_->processes.size(); ++i) {
    const auto& p = places_->processes[i];
    if (static_cast<int>(i) == places_->here || p.host != host_ || p.pid <= 0 ||
        p.pid == ::getpid())
      continue;
#ifdef SYS_pidfd_open
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, p.pid, 0));
    if (fd >= 0) watched_.push_back({static_cast<int>(i), fd, false});
#endif
  }
}

std::string rendezvous::describe(int r) const {
  // places_ is set only in learn(), which runs before any reader of it.
  auto s = "world rank " + std::to_string(r);
  if (places_ && r >= 0 && r < places_->size()) {
    const auto& p = places_->of(r);
    if (p.pid != 0) s += " (host " + p.host + ", pid " + std::to_string(p.pid) + ")";
  }
  return s;
}

void rendezvous::read_store_records() {
  if (!gone_key_.empty() && store_.check({gone_key_})) {
    std::istringstream lines(troupe::to_string(store_.get(gone_key_)));
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream in(line);
      int r = -1, pid = 0;
      std::string host;
      if (!(in >> r >> host >> pid) || r < 0 || r >= world_size_) continue;
      auto& why = gone_[r];
      if (!why.empty()) continue;
      why = "world rank " + std::to_string(r) + " (host " + host + ", pid " + std::to_string(pid) +
            ") is gone: its connection to the store ended without a goodbye";
      from_store_.insert(r);
    }
  }
  if (gave_up_key_.empty()) return;
  for (auto& l : read_gave_up(gave_up_key_)) {
    // A rank gone for a reason seen here (its process ended) may have
    // given up first: its own reason says more.
    if (quoted_.count(l.rank)) continue;
    gone_[l.rank] = describe(l.rank) + " gave up building its world: " + l.reason;
    from_store_.insert(l.rank);
    quoted_.insert(l.rank);
  }
}

std::vector<rendezvous::gave_up_line> rendezvous::read_gave_up(const std::string& key) {
  std::vector<gave_up_line> found;
  if (!store_.check({key})) return found;
  std::istringstream lines(troupe::to_string(store_.get(key)));
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    gave_up_line l;
    std::string kind;
    if (!(in >> l.rank >> kind) || l.rank < 0 || l.rank >= world_size_ || l.rank == rank_ ||
        kind != "failure")
      continue;
    std::getline(in >> std::ws, l.reason);
    l.reason = cut(l.reason);
    found.push_back(std::move(l));
  }
  return found;
}

void rendezvous::tell(const std::string& key, const std::exception& e) noexcept {
  if (const auto* te = dynamic_cast<const error*>(&e))
    if (te->code() == errc::timeout || te->code() == errc::store) return;
  try {
    auto line = cut(e.what());
    std::replace(line.begin(), line.end(), '\n', ' ');  // one line
    store_.append(key, to_bytes(std::to_string(rank_) + " failure " + line + "\n"));
  } catch (...) {  // the store may be gone with the process serving it
  }
}

bool rendezvous::look_at_processes() {
  bool any = false;
  for (auto& w : watched_) {
    if (!w.ended) w.ended = process_ended(w.pidfd);
    any = any || w.ended;
  }
  return any;
}

std::string rendezvous::gone(int r) {
  std::lock_guard<std::mutex> g{mtx_};
  look_at_processes();
  return gone_locked(r);
}

std::string rendezvous::gone_locked(int r) {
  if (auto i = gone_.find(r); i != gone_.end()) return i->second;
  if (!places_ || r < 0 || r >= places_->size()) return {};
  const int proc = places_->process_of[static_cast<std::size_t>(r)];
  for (auto& w : watched_)
    if (w.process == proc && w.ended) return gone_[r] = describe(r) + " is gone: its process ended";
  return {};
}

rendezvous::gone_reasons rendezvous::gone_of(int count, const std::function<int(int)>& rank_at) {
  std::lock_guard<std::mutex> g{mtx_};
  // Processes first: one that ended wrote its reason before it did.
  const bool ended = look_at_processes();
  read_store_records();
  // Nobody gone (the common case): no rank to look at.
  if (!ended && gone_.empty()) return {};
  // The ranks gone for reasons of their own are named; the reason of one
  // that gave up is quoted only where no such rank is known (every rank
  // that gave up because of the same one would be quoted too).
  std::string why, quote;
  bool from_store = true;
  for (int i = 0; i < count; ++i) {
    const int r = rank_at(i);
    if (r == rank_) continue;
    auto w = gone_locked(r);
    if (w.empty()) continue;
    if (quoted_.count(r)) {
      if (quote.empty()) quote = std::move(w);
      continue;
    }
    why += (why.empty() ? "" : "; ") + w;
    from_store = from_store && from_store_.count(r) != 0;
  }
  if (why.empty()) return {quote, true};
  return {why, from_store};
}

std::string rendezvous::gone_among(const std::vector<int>& ranks) {
  return gone_of(static_cast<int>(ranks.size()),
                 [&](int i) { return ranks[static_cast<std::size_t>(i)]; })
      .why;
}

void rendezvous::check(const std::vector<int>& ranks, const std::string& waiting_for) {
  check_of(
      static_cast<int>(ranks.size()), [&](int i) { return ranks[static_cast<std::size_t>(i)]; },
      waiting_for);
}

void rendezvous::check_everyone(const std::string& waiting_for) {
  check_of(
      world_size_, [](int i) { return i; }, waiting_for);
}

void rendezvous::check_of(int count, const std::function<int(int)>& rank_at,
                          const std::string& waiting_for) {
  gone_reasons gone;
  try {
    gone = gone_of(count, rank_at);
  } catch (const error& e) {
    if (e.code() != errc::store) throw;
    throw error(errc::store, "world: rank " + std::to_string(rank_) +
                                 " lost the store while waiting for " + waiting_for + ": " +
                                 e.what());
  }
  if (gone.why.empty()) return;
  {
    std::lock_guard<std::mutex> g{mtx_};
    told_by_store_ = gone.from_store;
  }
  throw error(errc::peer_failure, "world: rank " + std::to_string(rank_) +
                                      " gave up building its world (waiting for " + waiting_for +
                                      "): " + gone.why);
}

void rendezvous::give_up(const std::exception& e) noexcept {
  {
    std::lock_guard<std::mutex> g{mtx_};
    if (gave_up_key_.empty() || told_by_store_) return;  // everyone reads what the store said
  }
  tell(gave_up_key_, e);
}

void rendezvous::timed_out(const std::vector<int>& ranks, const std::string& what) const {
  throw error(errc::timeout, "world: rank " + std::to_string(rank_) + ": " +
                                 timeout_after(timeout_) + " waiting for " + rank_list(ranks) +
                                 " to " + what);
}

void rendezvous::wait_keys(const std::vector<std::string>& keys, const std::string& waiting_for,
                           const std::function<void()>& at_deadline) {
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
    check_everyone(waiting_for);
    if (clock::now() < deadline_) continue;
    try {
      at_deadline();
    } catch (const error& e) {
      if (e.code() == errc::store) throw lost_store(e);
      throw;
    }
    return;  // they came at the last moment
  }
}

void rendezvous::wait_for(const std::vector<int>& ranks,
                          const std::function<std::string(int)>& key_of, const std::string& what) {
  std::vector<std::string> keys;
  for (int r : ranks) keys.push_back(key_of(r));
  wait_keys(keys, rank_list(ranks) + " to " + what, [&] {
    std::vector<int> missing;
    for (std::size_t i = 0; i < ranks.size(); ++i)
      if (!store_.check({keys[i]})) missing.push_back(ranks[i]);
    if (!missing.empty()) timed_out(missing, what);
  });
}

void rendezvous::wait_for_everyone(const std::string& counter,
                                   const std::function<std::string(int)>& key_of,
                                   const std::string& what) {
  const auto all_key = counter + "/all";
  const auto waiting_for = "every rank to " + what;
  try {
    if (store_.add(counter, 1) == world_size_) store_.set(all_key, to_bytes("1"));
  } catch (const error& e) {
    if (e.code() != errc::store) throw;
    throw error(errc::store, "world: rank " + std::to_string(rank_) +
                                 " lost the store while waiting for " + waiting_for + ": " +
                                 e.what());
  }
  wait_keys({all_key}, waiting_for, [&] {
    std::vector<int> missing;
    for (int r = 0; r < world_size_; ++r)
      if (!store_.check({key_of(r)})) missing.push_back(r);
    // Every key there (the last to count itself in may not have written
    // all_key yet): what the caller reads is there.
    if (!missing.empty()) timed_out(missing, what);
  });
}

}  // namespace troupe::detail
