#include "fabric/net_medium.hpp"

#include "actors/call.hpp"
#include "transport/data_plane.hpp"
#include "transport/futex.hpp"

namespace troupe::detail {

net_medium::net_medium(std::shared_ptr<data_plane> plane, std::vector<int> global_ranks, int rank,
                       std::string group, std::vector<std::string> names)
    : plane_(std::move(plane)),
      global_ranks_(std::move(global_ranks)),
      rank_(rank),
      group_(std::move(group)),
      names_(std::move(names)) {
  for (int r = 0; r < size(); ++r)
    if (r != rank_) remote_.push_back(global_ranks_[static_cast<std::size_t>(r)]);
}

net_medium::~net_medium() {
  if (auto plane = plane_.lock()) plane->remove_sink(group_);
}

void net_medium::attach() {
  std::weak_ptr<net_medium> self = shared_from_this();
  if (auto plane = plane_.lock())
    plane->add_sink(group_, [self](received_frame& f) {
      if (auto m = self.lock()) m->deliver(f);
    });
}

void net_medium::deliver(received_frame& f) {
  {
    std::lock_guard<std::mutex> g{mtx_};
    inbox_[{f.header.seq, f.header.step, f.header.src}] =
        message{f.header.code, std::move(f.payload)};
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_relaxed) != 0) {
    bell_.fetch_add(1);
    futex_wake(bell_);
  }
}

void net_medium::send(int peer, std::uint64_t op, std::uint32_t step, std::uint8_t code,
                      const tensor& payload, std::chrono::steady_clock::time_point deadline,
                      bool reads) {
  if (auto plane = plane_.lock())
    plane->send_fabric(
        global_ranks_[static_cast<std::size_t>(peer)], group_,
        envelope{op, step, rank_, static_cast<op_code>(code), payload},
        [this, reads] {
          if (reads) pump();
        },
        deadline);
}

bool net_medium::pump() {
  auto plane = plane_.lock();
  bool any = false;
  if (plane)
    for (int w : remote_) any = plane->pump(w) || any;
  return any;
}

void net_medium::pumping(int delta, bool wake) {
  if (auto plane = plane_.lock())
    for (int w : remote_) plane->pumping(w, delta, wake);
}

void net_medium::begin_wait(bool reads) {
  if (reads) pumping(+1, false);
}

void net_medium::end_wait(bool reads) {
  if (reads) pumping(-1, false);
}

void net_medium::sleep(int, std::chrono::nanoseconds max, const std::function<bool()>& recheck,
                       bool reads) {
  // Asleep, this thread reads nothing: the reader threads take over.
  if (reads) pumping(-1, true);
  sleepers_.fetch_add(1);
  const auto seen = bell_.load();
  if (!recheck()) futex_wait(bell_, seen, max);
  sleepers_.fetch_sub(1);
  if (reads) pumping(+1, false);
}

std::string net_medium::lost(std::uint64_t, int blocker) {
  // Only the rank the operation waits for: one that finished its part and
  // left (what it sent came before its goodbye) is not missed.
  auto plane = plane_.lock();
  if (blocker < 0 || blocker == rank_) return {};
  if (!plane) return "the world ended";
  if (auto why = plane->gone_reason(global_ranks_[static_cast<std::size_t>(blocker)]); !why.empty())
    return names_[static_cast<std::size_t>(blocker)] + " left group '" + group_ + "' (" + why + ")";
  return {};
}

void net_medium::wake_all() {
  bell_.fetch_add(1);
  futex_wake(bell_);
}

}  // namespace troupe::detail
