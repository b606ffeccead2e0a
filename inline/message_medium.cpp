#include "inline/message_medium.hpp"

#include "algorithms/cost_model.hpp"
#include "base/call.hpp"
#include "base/futex.hpp"
#include "base/gone_peers.hpp"
#include "base/process_directory.hpp"
#include "base/texts.hpp"
#include "inline/engine.hpp"
#include "transport/data_plane.hpp"

namespace troupe::detail {

message_medium::message_medium(std::shared_ptr<data_plane> plane, std::string key,
                               std::vector<bool> local, std::vector<int> global_ranks, int rank,
                               std::string group, rank_names names)
    : plane_(std::move(plane)),
      key_(std::move(key)),
      local_(std::move(local)),
      peers_(local_.size()),
      global_ranks_(std::move(global_ranks)),
      rank_(rank),
      group_(std::move(group)),
      names_(std::move(names)),
      ringed_(global_ranks_.size()),
      waiting_(global_ranks_.size()) {
  auto shared = plane_.lock();
  for (int r = 0; r < size(); ++r) {
    if (r == rank_ || is_local(r)) continue;
    const int w = global_ranks_[static_cast<std::size_t>(r)];
    remote_.push_back(w);
    if (shared && shared->shares_memory(w)) {
      ring_peers_.push_back(w);
      ringed_[static_cast<std::size_t>(r)] = true;
    }
  }
  if (auto p = shared) {
    crashes_ = p->crashed();
    p2p_seen_ = p->carried_p2p();
    std::vector<std::string> hosts;
    for (int w : global_ranks_) hosts.push_back(p->host_of(w));
    // A group in more than one process: every rank has a peer in another.
    topology_ =
        group_topology::of_hosts(hosts, cost_model::of_measured(p->link_costs()), !remote_.empty());
    own_cpus_ = p->cpu_per_rank();
  } else {
    topology_ = group_topology::flat(size());
  }
}

message_medium::~message_medium() {
  leave();
  if (auto plane = plane_.lock()) plane->remove_sink(group_);
}

void message_medium::attach() {
  std::weak_ptr<message_medium> self = shared_from_this();
  process_directory::instance().put(key_ + std::to_string(rank_), self);
  if (auto plane = plane_.lock(); plane && !remote_.empty())
    plane->add_sink(
        group_, global_ranks_,
        [self](received_frame& f) {
          auto m = self.lock();
          return m ? m->deliver(f) : std::string();
        },
        [self](const frame_header& h) {
          auto m = self.lock();
          return m ? m->placement(h) : posted_receive{};
        });
}

void message_medium::leave() {
  // Only this medium's own entry (a newer group may use the key already).
  process_directory::instance().erase(key_ + std::to_string(rank_), [this](const std::any& v) {
    const auto* w = std::any_cast<std::weak_ptr<message_medium>>(&v);
    return !w || w->expired() || w->lock().get() == this;
  });
}

std::shared_ptr<message_medium> message_medium::local_peer(int r) {
  auto& slot = peers_[static_cast<std::size_t>(r)];
  if (auto p = slot.lock()) return p;
  const auto found = process_directory::instance().find(key_ + std::to_string(r));
  const auto* w = std::any_cast<std::weak_ptr<message_medium>>(&found);
  if (!w) return nullptr;
  slot = *w;
  return slot.lock();
}

std::string message_medium::deliver(received_frame& f) {
  return deliver(f.header.seq, f.header.step, f.header.src,
                 message{f.header.code, std::move(f.payload), false, nullptr, std::move(f.fp)});
}

std::string message_medium::count(std::uint64_t op, int src, message& m) {
  auto& w = waiting_[static_cast<std::size_t>(src)];
  const auto bytes = m.payload.defined() ? m.payload.nbytes() : 0;
  const bool early = op > ended_ + 1;
  if (!is_local(src)) {  // ranks of this process are trusted
    if (w.messages >= max_waiting_messages)
      return "more than " + std::to_string(max_waiting_messages) + " messages for group '" +
             group_ + "' that this rank has not taken yet";
    if (early && w.early + bytes > max_early_bytes)
      return "more than " + std::to_string(max_early_bytes) + " bytes for operations of group '" +
             group_ + "' after the next one (operation " + std::to_string(op) +
             "; this rank finished operation " + std::to_string(ended_) + ")";
  }
  ++w.messages;
  m.early = early ? bytes : 0;
  w.early += m.early;
  return {};
}

void message_medium::uncount(int src, const message& m) {
  auto& w = waiting_[static_cast<std::size_t>(src)];
  --w.messages;
  w.early -= m.early;
}

std::string message_medium::deliver(std::uint64_t op, std::uint32_t step, int src, message m) {
  const key k{op, step, src};
  arrival_fn fn;
  {
    std::lock_guard<std::mutex> g{mtx_};
    // A late message of an operation that ended (failed) is dropped: kept,
    // it would hold its payload (perhaps the caller's output, received in
    // place) until the group ends.
    if (op <= ended_) return {};
    auto h = handlers_.find(k);
    if (h != handlers_.end() && h->second.first == m.code) {
      fn = std::move(h->second.second);
      handlers_.erase(h);
      running_.insert(op);
    } else {
      if (auto old = inbox_.find(k); old != inbox_.end()) {  // sent twice: the last one counts
        uncount(src, old->second);
        inbox_.erase(old);
      }
      if (auto why = count(op, src, m); !why.empty()) return why;
      inbox_[k] = std::move(m);
    }
  }
  if (fn) {
    // On this (receiving) thread, outside the lock; end_op waits for it.
    if (auto* c = inline_counting()) c->consumed.fetch_add(1, std::memory_order_relaxed);
    message done{m.code, {}, true, nullptr, std::move(m.fp)};
    try {
      fn(m.payload);
    } catch (...) {
      done.error = std::current_exception();
    }
    m.payload = tensor{};
    std::lock_guard<std::mutex> g{mtx_};
    ++waiting_[static_cast<std::size_t>(src)].messages;  // a marker, no payload
    inbox_[k] = std::move(done);
    running_.erase(running_.find(op));
    idle_.notify_all();
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_relaxed) != 0) {
    bell_.fetch_add(1);
    futex_wake(bell_);
  }
  return {};
}

bool message_medium::on_arrival(std::uint64_t op, std::uint32_t step, int src, std::uint8_t code,
                                arrival_fn fn) {
  const key k{op, step, src};
  std::lock_guard<std::mutex> g{mtx_};
  if (inbox_.count(k) != 0) return false;
  handlers_[k] = {code, std::move(fn)};
  return true;
}

void message_medium::post_receive(std::uint64_t op, std::uint32_t step, int src, std::uint8_t code,
                                  const tensor& into) {
  if (is_local(src) || !into.defined() || !into.is_cpu() || !into.is_contiguous() ||
      into.nbytes() == 0)
    return;
  std::lock_guard<std::mutex> g{mtx_};
  posted_[{op, step, src}] = posted{code, {into, std::make_shared<receive_guard>()}};
}

posted_receive message_medium::placement(const frame_header& h) {
  std::lock_guard<std::mutex> g{mtx_};
  auto i = posted_.find({h.seq, h.step, h.src});
  if (i == posted_.end() || i->second.handed_out || i->second.code != h.code) return {};
  i->second.handed_out = true;
  return i->second.where;
}

void message_medium::end_op(std::uint64_t op) {
  std::unique_lock<std::mutex> g{mtx_};
  ended_ = std::max(ended_, op);  // operations end in the order they were issued
  // Revoked before the caller hears: a frame read at this moment writes
  // its remaining bytes elsewhere.
  for (auto i = posted_.lower_bound({op, 0, 0}); i != posted_.end() && std::get<0>(i->first) == op;
       i = posted_.erase(i)) {
    std::lock_guard<std::mutex> r{i->second.where.guard->mtx};
    i->second.where.guard->revoked = true;
  }
  handlers_.erase(handlers_.lower_bound({op, 0, 0}), handlers_.lower_bound({op + 1, 0, 0}));
  idle_.wait(g, [&] { return running_.count(op) == 0; });
  // What a finished handler left, or a failed operation never took.
  const auto next = inbox_.lower_bound({op + 1, 0, 0});
  for (auto i = inbox_.lower_bound({op, 0, 0}); i != next;) {
    uncount(std::get<2>(i->first), i->second);
    i = inbox_.erase(i);
  }
  // The next operation's messages are no longer early.
  for (auto i = next; i != inbox_.end() && std::get<0>(i->first) <= ended_ + 1; ++i) {
    waiting_[static_cast<std::size_t>(std::get<2>(i->first))].early -= i->second.early;
    i->second.early = 0;
  }
}

std::string message_medium::send(int peer, std::uint64_t op, std::uint32_t step, std::uint8_t code,
                                 const tensor& payload,
                                 std::chrono::steady_clock::time_point deadline, reading reads,
                                 const fingerprint_ptr& fp, const write_stall* stall) {
  if (is_local(peer)) {
    // Handed over as is: the algorithms never write a payload after sending.
    if (auto p = local_peer(peer))
      p->deliver(op, step, rank_, message{code, payload, false, nullptr, fp});
    return {};
  }
  auto plane = plane_.lock();
  return plane ? plane->send_inline(
                     global_ranks_[static_cast<std::size_t>(peer)], group_,
                     envelope{op, step, rank_, static_cast<op_code>(code), payload, fp},
                     [this, reads] { pump(reads); }, deadline, stall)
               : std::string{};
}

/// The world ranks a thread that reads `what` pumps (null: none).
const std::vector<int>* message_medium::pumped(reading what) const {
  if (what == reading::none) return nullptr;
  return what == reading::all ? &remote_ : &ring_peers_;
}

bool message_medium::pump(reading what) {
  const auto* ranks = pumped(what);
  auto plane = ranks ? plane_.lock() : nullptr;
  return plane && plane->pump_all(*ranks);
}

void message_medium::pumping(int delta, bool wake, reading what) {
  const auto* ranks = pumped(what);
  if (auto plane = ranks ? plane_.lock() : nullptr)
    for (int w : *ranks) plane->pumping(w, delta, wake);
}

void message_medium::begin_wait(reading reads) {
  pumping(+1, false, reads);
}

void message_medium::end_wait(reading reads) {
  pumping(-1, false, reads);
}

void message_medium::sleep(int, std::chrono::nanoseconds max, const std::function<bool()>& recheck,
                           reading reads) {
  // Asleep, this thread reads nothing: the reader threads take over.
  pumping(-1, true, reads);
  sleepers_.fetch_add(1);
  const auto seen = bell_.load();
  if (!recheck()) futex_wait(bell_, seen, max);
  sleepers_.fetch_sub(1);
  pumping(+1, false, reads);
}

std::string message_medium::crashed_members() {
  auto plane = plane_.lock();
  if (!plane) return {};
  const auto seen = crashes_->load();
  std::string why;
  for (int r = 0; r < size(); ++r) {
    if (r == rank_ || is_local(r)) continue;
    if (auto c = plane->crash_reason(global_ranks_[static_cast<std::size_t>(r)]); !c.empty())
      why += (why.empty() ? "" : "; ") + names_[static_cast<std::size_t>(r)] + " left group '" +
             group_ + "' (" + c + ")";
  }
  if (why.empty()) crashes_seen_.store(seen, std::memory_order_relaxed);  // ranks outside it
  return why;
}

bool message_medium::crash_settled(std::chrono::steady_clock::time_point now) {
  const auto at = now.time_since_epoch().count();
  std::int64_t found = 0;
  if (crash_found_ns_.compare_exchange_strong(found, at)) found = at;  // the first look
  return at - found >=
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(crash_grace).count();
}

std::string message_medium::lost(std::uint64_t, int blocker,
                                 std::chrono::steady_clock::time_point now) {
  // A member whose process died (or was dropped for bad frames) fails every
  // operation, whichever rank it waits for: one load while no peer failed.
  // Named once the members that died with it were found too (crash_settled).
  if (auto why = crashed(); !why.empty()) return crash_settled(now) ? why : std::string{};
  // A member that left on purpose: only the rank the operation waits for.
  // One that finished its part and left (what it sent came before it left)
  // is not missed.
  if (blocker < 0 || blocker == rank_) return {};
  // The peer's name is made only for a peer that left (this runs at every
  // look of a waiting operation).
  const auto b = static_cast<std::size_t>(blocker);
  if (is_local(blocker))
    return local_peer(blocker) ? std::string{} : names_[b] + " left group '" + group_ + "'";
  auto plane = plane_.lock();
  if (!plane) return "the world ended";
  if (auto why = plane->gone_reason(global_ranks_[b]); !why.empty())
    return left_group(names_[b], group_, why);
  return {};
}

std::string message_medium::left_reason(int r) {
  auto plane = plane_.lock();
  return plane ? plane->gone_reason(global_ranks_[static_cast<std::size_t>(r)]) : std::string();
}

void message_medium::wake_all() {
  bell_.fetch_add(1);
  futex_wake(bell_);
}

}  // namespace troupe::detail
