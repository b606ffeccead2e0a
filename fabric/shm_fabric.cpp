#include "fabric/shm_fabric.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "fabric/segment.hpp"
#include "src/wait_policy.hpp"
#include "src/work_state.hpp"
#include "transport/futex.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

namespace {

using namespace std::chrono_literals;

/// The longest single sleep: peers' liveness and deadlines are re-checked this often.
constexpr auto max_sleep = 2ms;
/// How often a blocked operation checks that the peer's process is alive.
constexpr auto liveness_period = 5ms;

bool process_gone(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

}  // namespace

fabric_counters& fabric_stats() noexcept {
  static fabric_counters counters;
  return counters;
}

shm_fabric::shm_fabric(std::unique_ptr<segment> seg, int rank, std::string group,
                       std::vector<std::string> names, bool allow_direct)
    : seg_(std::move(seg)), rank_(rank), group_(std::move(group)), names_(std::move(names)) {
  one_process_ = allow_direct;
  for (int r = 0; r < size(); ++r)
    one_process_ = one_process_ && seg_->identity(r).pid.load() == ::getpid();
  pidfds_.assign(static_cast<std::size_t>(size()), -1);
  watchdog_ = std::thread([this] { watch(); });
}

shm_fabric::~shm_fabric() {
  stopping_.store(true);
  watch_word_.fetch_add(1);
  futex_wake(watch_word_);
  watchdog_.join();
  abort("the group was destroyed");
  seg_->identity(rank_).left.store(1);
  seg_->wake_all();
  for (int fd : pidfds_)
    if (fd >= 0) ::close(fd);
}

int shm_fabric::size() const noexcept {
  return seg_->shape().size;
}

void shm_fabric::announce(std::uint64_t seq, std::uint8_t code) {
  seg_->announced(rank_, seq).store(seq << 8 | code, std::memory_order_release);
}

int shm_fabric::announced(int r, std::uint64_t seq) noexcept {
  const auto a = seg_->announced(r, seq).load(std::memory_order_acquire);
  return a >> 8 == seq ? static_cast<int>(a & 0xff) : -1;
}

work shm_fabric::submit(std::unique_ptr<fabric_op> op) {
  auto w = op->handle;
  op->deadline = fabric_clock::now() + op->timeout;
  std::weak_ptr<shm_fabric> self = weak_from_this();
  auto& s = *w.state();
  s.drive = [self](work_state& st, fabric_clock::time_point until) {
    if (auto f = self.lock()) f->drive(st, until);
  };
  s.poke = [self] {
    if (auto f = self.lock()) f->poke();
  };
  {
    std::lock_guard<std::mutex> g{engine_};
    queue_.push_back(std::move(op));
  }
  pass(true);
  if (!s.finished.load() && watch_idle_.exchange(false)) {
    watch_word_.fetch_add(1);
    futex_wake(watch_word_);
  }
  return w;
}

void shm_fabric::drive(work_state& s, fabric_clock::time_point until) {
  const auto& policy = wait_policy::get();
  waiters_.fetch_add(1);
  auto polling_since = fabric_clock::now();
  while (!s.finished.load(std::memory_order_acquire)) {
    const bool moved = pass(true);
    if (s.finished.load(std::memory_order_acquire)) break;
    const auto now = fabric_clock::now();
    if (now >= until) break;
    if (moved) {
      polling_since = now;
      continue;
    }
    if (policy.poll_step(now - polling_since)) continue;
    const auto nap = std::min<fabric_clock::duration>(until - now, max_sleep);
    seg_->sleep(blocker(), nap, [&] { return pass(true) || s.finished.load(); });
    polling_since = fabric_clock::now();
  }
  waiters_.fetch_sub(1);
}

void shm_fabric::poke() {
  if (waiters_.load() == 0) pass(false);
}

void shm_fabric::watch() {
  auto queue_empty = [this] {
    std::lock_guard<std::mutex> g{engine_};
    return queue_.empty();
  };
  while (!stopping_.load()) {
    const auto seen = watch_word_.load();
    if (queue_empty()) {
      watch_idle_.store(true);
      // Checked again: a submit after this check finds watch_idle_ set and wakes us.
      if (queue_empty() && !stopping_.load()) futex_wait(watch_word_, seen, std::chrono::hours(1));
      watch_idle_.store(false);
    } else {
      futex_wait(watch_word_, seen, std::chrono::milliseconds(1));
      poke();
    }
  }
}

int shm_fabric::blocker() {
  std::lock_guard<std::mutex> g{engine_};
  const int r = queue_.empty() ? -1 : queue_.front()->blocker().first;
  return r < 0 ? rank_ : r;
}

void shm_fabric::abort(const std::string& reason) {
  std::vector<finished> out;
  {
    std::lock_guard<std::mutex> g{engine_};
    stop(reason);
    step_head(out);
  }
  for (auto& f : out) f.op->handle.fail(f.error);
  seg_->wake_all();  // threads of this rank sleeping on a peer's bell
}

void shm_fabric::stop(const std::string& reason) {
  if (stopped_.empty()) stopped_ = reason;
}

bool shm_fabric::pass(bool block_on_lock) {
  std::vector<finished> out;
  bool moved = false;
  {
    std::unique_lock<std::mutex> g{engine_, std::defer_lock};
    if (block_on_lock)
      g.lock();
    else if (!g.try_lock())
      return false;
    moved = step_head(out);
  }
  // Outside the lock: a callback may issue the next collective.
  for (auto& f : out) {
    if (f.error)
      f.op->handle.fail(f.error);
    else
      f.op->handle.complete(std::move(f.op->outputs));
  }
  return moved || !out.empty();
}

std::string shm_fabric::lost(std::uint64_t op) {
  const auto now = fabric_clock::now();
  const bool check_processes = now >= next_liveness_check_;
  if (check_processes) next_liveness_check_ = now + liveness_period;
  for (int r = 0; r < size(); ++r) {
    // A rank that finished this operation owes nothing more to it.
    if (r == rank_ || seg_->progress(r).done.load(std::memory_order_acquire) >= op) continue;
    auto& id = seg_->identity(r);
    const auto& name = names_[static_cast<std::size_t>(r)];
    if (id.left.load(std::memory_order_acquire)) return name + " left group '" + group_ + "'";
    const auto pid = id.pid.load();
    if (!check_processes || pid == 0 || pid == ::getpid()) continue;
    auto& fd = pidfds_[static_cast<std::size_t>(r)];
#ifdef SYS_pidfd_open
    if (fd < 0) fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#endif
    if (fd < 0 ? ::kill(pid, 0) != 0 && errno == ESRCH : process_gone(fd))
      return name + " left group '" + group_ + "' (its process is gone)";
  }
  return {};
}

bool shm_fabric::step_head(std::vector<finished>& out) {
  fabric_context ctx{*this, *seg_, rank_, size(), names_, chunks_, one_process_};
  bool moved = false;
  auto where = [&](const fabric_op& op) {
    return op.name + " on group '" + group_ + "' (rank " + std::to_string(rank_) + ", seq " +
           std::to_string(op.seq) + ")";
  };
  auto fail = [&](errc code, const std::string& cause) {
    auto op = std::move(queue_.front());
    queue_.pop_front();
    auto msg = where(*op) + " failed: " + cause;
    out.push_back({std::move(op), std::make_exception_ptr(error(code, msg))});
    return msg;
  };
  while (!queue_.empty()) {
    auto& op = *queue_.front();
    if (!stopped_.empty()) {
      fail(errc::aborted,
           "the group's shared-memory collectives stopped after an earlier failure: " + stopped_);
      continue;
    }
    bool finished_now = false;
    auto attempt = [&]() -> bool {  // false: the operation failed (and left the queue)
      try {
        bool m = false;
        finished_now = op.step(ctx, m);
        moved |= m;
        return true;
      } catch (const error& e) {
        moved = true;
        // A size mismatch is seen alike by every rank, which all step past
        // the operation; anything else leaves the protocol state unknown.
        const auto msg = fail(e.code(), e.what());
        if (e.code() != errc::invalid_argument) stop(msg);
        return false;
      }
    };
    if (!attempt()) continue;
    if (finished_now) {
      out.push_back({std::move(queue_.front()), nullptr});
      queue_.pop_front();
      continue;
    }
    const auto [peer, what] = op.blocker();
    if (auto why = lost(op.op); !why.empty()) {
      // What the peer published before it left still counts: one more try.
      if (!attempt()) continue;
      if (finished_now) {
        out.push_back({std::move(queue_.front()), nullptr});
        queue_.pop_front();
        continue;
      }
      stop(fail(errc::peer_failure, why + " before finishing this " + op.name));
      continue;
    }
    if (fabric_clock::now() >= op.deadline) {
      stop(fail(errc::timeout, "Timeout after " + std::to_string(op.timeout.count()) +
                                   " ms waiting for " + names_[static_cast<std::size_t>(peer)] +
                                   " to " + what));
      continue;
    }
    break;
  }
  return moved;
}

}  // namespace troupe::detail
