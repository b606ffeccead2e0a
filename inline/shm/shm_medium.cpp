#include "inline/shm/shm_medium.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "base/texts.hpp"
#include "inline/shm/segment.hpp"

namespace troupe::detail {

namespace {

/// How often a blocked operation checks that the peers' processes are alive.
constexpr auto liveness_period = std::chrono::milliseconds(5);
/// How often it reads every rank's counters to see who left: the scan costs
/// a cache line per rank, and every polling step of every waiting rank asks
/// (a simulation of 512 ranks in one process would spend most of its time there).
constexpr auto scan_period = std::chrono::milliseconds(1);
/// How long a rank that left waits to be named while no process is gone.
constexpr auto left_grace = std::chrono::milliseconds(20);
/// ... and while its goodbye through the data plane, which says why it
/// left, has not come: its flag in the segment is seen at once, its goodbye
/// once a reader thread read it (7 ranks over TCP on a loaded machine: a
/// survivor named the rank that left after finding another unresponsive,
/// not the unresponsive one, 20 ms after the flag).
constexpr auto left_reason_grace = std::chrono::milliseconds(1000);

bool process_gone(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

}  // namespace

shm_medium::shm_medium(std::unique_ptr<segment> seg, int rank, std::string group, rank_names names,
                       bool allow_direct)
    : seg_(std::move(seg)), rank_(rank), group_(std::move(group)), names_(std::move(names)) {
  my_pid_ = static_cast<std::int32_t>(::getpid());
  one_process_ = allow_direct;
  for (int r = 0; r < size(); ++r)
    one_process_ = one_process_ && seg_->identity(r).pid.load() == my_pid_;
  pidfds_.assign(static_cast<std::size_t>(size()), -1);
  if (allow_direct && !one_process_) peers_ = std::make_unique<peer_memory>();
}

shm_medium::~shm_medium() {
  for (int fd : pidfds_)
    if (fd >= 0) ::close(fd);
}

int shm_medium::size() const noexcept {
  return seg_->shape().size;
}

void shm_medium::sleep(int r, std::chrono::nanoseconds max, const std::function<bool()>& recheck,
                       reading reads) {
  // Asleep, this thread reads no ring: the reader threads take over.
  if (reads != reading::none) rings_->pumping(-1, true, reads);
  seg_->sleep(r, max, recheck);
  if (reads != reading::none) rings_->pumping(+1, false, reads);
}

void shm_medium::announce(std::uint64_t seq, std::uint8_t code) {
  seg_->announced(rank_, seq).store(seq << 8 | code, std::memory_order_release);
}

int shm_medium::announced(int r, std::uint64_t seq) {
  const auto a = seg_->announced(r, seq).load(std::memory_order_acquire);
  return a >> 8 == seq ? static_cast<int>(a & 0xff) : -1;
}

void shm_medium::wake_all() {
  seg_->wake_all();
}

void shm_medium::leave() {
  seg_->identity(rank_).left.store(1);
  seg_->departures().fetch_add(1);
  seg_->wake_all();
}

std::string shm_medium::lost(std::uint64_t op, int, inline_clock::time_point now) {
  // A member the data plane found crashed or unresponsive (a stopped
  // process is alive to its pidfd: its heartbeats tell).
  if (rings_)
    if (auto why = rings_->crashed(); !why.empty() && rings_->crash_settled(now)) return why;
  // Any rank that has not finished the operation: its done counter says so.
  // A rank whose process is gone is the cause and is named alone (every one,
  // when several are gone: which went first is unknown); a rank that left
  // the group is named only when no process is gone, and only after a short
  // grace (it may have left because another rank died, which the pidfds
  // show a moment later than that rank saw it).
  if (now < next_scan_) return {};
  next_scan_ = now + scan_period;
  // Nobody left and no process to look at: nothing to read (every waiting
  // rank reading every rank's line each period made thousands of ranks in
  // one process spend most of their time here).
  const bool liveness_due = !one_process_ && now >= next_liveness_check_;
  if (seg_->departures().load(std::memory_order_acquire) == 0 && !liveness_due) {
    left_seen_.reset();
    return {};
  }
  std::string left, gone;
  bool reasonless = false;  // a rank that left whose goodbye has not come
  auto add = [](std::string& to, const std::string& s) { to += (to.empty() ? "" : "; ") + s; };
  unfinished_.clear();  // and still in the group: their processes are watched
  for (int r = 0; r < size(); ++r) {
    // A rank that finished this operation owes nothing more to it.
    if (r == rank_ || seg_->progress(r).done.load(std::memory_order_acquire) >= op) continue;
    // One that left said goodbye: that its process ended since is no crash.
    // Its goodbye to the data plane says why, e.g. after which rank failed.
    if (seg_->identity(r).left.load(std::memory_order_acquire)) {
      const auto why = rings_ ? rings_->left_reason(r) : std::string();
      reasonless = reasonless || (rings_ && why.empty());
      add(left, left_group(names_[static_cast<std::size_t>(r)], group_, why));
    } else
      unfinished_.push_back(r);
  }
  const bool check_processes = !one_process_ && (now >= next_liveness_check_ || !left.empty());
  if (check_processes) {
    next_liveness_check_ = now + liveness_period;
    for (int r : unfinished_) {
      const auto pid = seg_->identity(r).pid.load();
      if (pid == 0 || pid == my_pid_) continue;
      auto& fd = pidfds_[static_cast<std::size_t>(r)];
#ifdef SYS_pidfd_open
      if (fd < 0) fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#endif
      if (fd < 0 ? ::kill(pid, 0) != 0 && errno == ESRCH : process_gone(fd))
        add(gone, names_[static_cast<std::size_t>(r)] + " left group '" + group_ +
                      "' (its process is gone)");
    }
  }
  if (!gone.empty()) return gone;
  if (left.empty()) {
    left_seen_.reset();
    return {};
  }
  if (!left_seen_) left_seen_ = now;
  return now - *left_seen_ >= (reasonless ? left_reason_grace : left_grace) ? left : std::string();
}

}  // namespace troupe::detail
