// mailbox (inline/mailbox.hpp): point to point on the inline engine —
// posting sends and receives, what arrives and whom it matches, copies
// between ranks of this process. Its loans between processes of a host are
// in mailbox_loans.cpp, its endings other than by data (peers gone, aborts,
// deadlines) in mailbox_endings.cpp.

#include "inline/mailbox.hpp"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <thread>

#include "base/callback_pool.hpp"
#include "base/group_ranks.hpp"
#include "base/process_directory.hpp"
#include "base/texts.hpp"
#include "base/wait_policy.hpp"
#include "base/work_state.hpp"
#include "inline/engine.hpp"
#include "kernels/shared_copy.hpp"
#include "memory/recycled.hpp"
#include "transport/data_plane.hpp"
#include "transport/frame.hpp"

namespace troupe::detail {

namespace {

/// Copies message `got` between ranks of this process into `buf`: from
/// mailbox::split_bytes, between contiguous buffers, together with the
/// threads waiting for its receive `recv` and its send `send` (they wait for
/// this copy anyway), else alone. Unlike the split between processes, also
/// with more ranks than CPUs: nothing waits for a helper that has no CPU.
void copy_between_ranks(const tensor& buf, const tensor& got, const work& recv, const work& send) {
  const auto n = buf.nbytes();
  if (n < mailbox::split_bytes || !buf.is_contiguous() || !got.is_contiguous() || !buf.is_cpu() ||
      !got.is_cpu()) {
    tensor{buf}.copy_from(got);
    return;
  }
  auto c = std::make_shared<shared_copy>(buf.data(), got.data(), n);
  offer_help(recv, c);
  if (send.valid()) offer_help(send, c);
  c->take_part();
  c->wait_whole();
  withdraw_help(recv, c.get());
  if (send.valid()) withdraw_help(send, c.get());
}

bool matches(const p2p_call& c, int src, int tag) {
  return tag == c.tag && (c.kind == p2p_call::recv_any || src == c.peer);
}

}  // namespace

std::size_t mailbox::bytes_of(const tensor& t) {
  return t.defined() ? t.nbytes() : 0;
}

std::string mailbox::text_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an unknown exception";
  }
}

mailbox::mailbox(std::string key, std::string group, int rank, std::vector<int> global_ranks,
                 std::shared_ptr<data_plane> plane)
    : key_(std::move(key)),
      group_(std::move(group)),
      rank_(rank),
      global_ranks_(std::move(global_ranks)),
      plane_(plane) {
  const auto n = global_ranks_.size();
  ranks_sorted_ = std::is_sorted(global_ranks_.begin(), global_ranks_.end());
  for (int w : global_ranks_) local_.push_back(!plane || plane->is_local(w));
  peers_.resize(n);
  waiting_.resize(n);
  // Only a sender in another process places frames (a record per local
  // rank would cost each of n ranks of a simulation n records).
  for (std::size_t r = 0; r < n; ++r)
    placed_.push_back(local_[r] ? nullptr : std::make_unique<placed>());
  names_ = rank_names(static_cast<int>(n));
  may_split_ = plane && plane->cpu_per_rank();
}

mailbox::~mailbox() {
  if (attached_)
    process_directory::instance().erase(key_ + std::to_string(rank_), [this](const std::any& v) {
      const auto* w = std::any_cast<std::weak_ptr<mailbox>>(&v);
      return w && w->expired();
    });
}

void mailbox::attach() {
  process_directory::instance().put(key_ + std::to_string(rank_), weak_from_this());
  attached_ = true;
}

void mailbox::set_names(rank_names names) {
  std::lock_guard<spin_lock> g{mtx_};
  if (names.size() == names_.size()) names_ = std::move(names);
}

std::string mailbox::where(const std::string& op) const {
  return call_location(op, group_, rank_);
}

std::string mailbox::name_of(int r) {
  std::lock_guard<spin_lock> g{mtx_};
  return names_[static_cast<std::size_t>(r)];
}

std::shared_ptr<mailbox> mailbox::local_peer(int r) {
  std::lock_guard<spin_lock> g{mtx_};
  return local_peer_locked(r);
}

std::shared_ptr<mailbox> mailbox::local_peer_locked(int r) {
  auto& slot = peers_[static_cast<std::size_t>(r)];
  if (auto p = slot.lock()) return p;
  const auto found = process_directory::instance().find(key_ + std::to_string(r));
  const auto* w = std::any_cast<std::weak_ptr<mailbox>>(&found);
  if (!w) return nullptr;
  slot = *w;
  return slot.lock();
}

bool mailbox::send_now(const p2p_call& c, std::exception_ptr& failed, std::size_t below) {
  const auto peer = static_cast<std::size_t>(c.peer);
  if (local_[peer] || bytes_of(c.buffer) >= below) return false;
  auto fail_with = [&](errc code, const std::string& why) {
    failed = std::make_exception_ptr(error(code, where(c.name) + " failed: " + why));
    return true;
  };
  {
    std::lock_guard<spin_lock> g{mtx_};
    if (stopped_) return fail_with(stopped_->first, stopped_->second);
    if (const auto* why = gone_.why(c.peer))
      return fail_with(errc::peer_failure, left_text(c.peer, *why));
  }
  try {
    auto plane = plane_.lock();
    if (!plane) return fail_with(errc::aborted, "the world ended");
    const auto why = plane->send(global_ranks_[peer], group_, p2p_envelope{rank_, c.tag, c.buffer},
                                 std::chrono::steady_clock::now() + c.timeout);
    if (!why.empty()) return fail_with(errc::peer_failure, left_text(c.peer, why));
  } catch (const error& e) {
    return fail_with(e.code(), e.what());
  } catch (const std::exception& e) {
    return fail_with(errc::internal, e.what());
  }
  return true;
}

void mailbox::issuing(int delta) {
  auto plane = plane_.lock();
  if (!plane) return;
  for (std::size_t r = 0; r < local_.size(); ++r) {
    const int g = global_ranks_[r];
    if (!local_[r] && plane->pumpable(g) && !plane->reads_socket(g))
      plane->pumping(g, delta, false);
  }
}

void mailbox::post(p2p_call c) {
  const auto peer = static_cast<std::size_t>(c.peer);
  auto fail_now = [&](errc code, const std::string& why) {
    c.handle.fail(std::make_exception_ptr(error(code, where(c.name) + " failed: " + why)));
  };
  if (c.kind == p2p_call::send) {
    // Eager to a rank of another process: the frame is written before send
    // returns (a large one unless it is lent, below).
    auto send_eager = [&](std::size_t below) {
      std::exception_ptr failed;
      if (!send_now(c, failed, below)) return false;
      if (failed)
        c.handle.fail(failed);
      else
        complete_with_one(c.handle, std::move(c.buffer));
      return true;
    };
    if (send_eager(lend_bytes)) return;
    std::string why;
    errc code = errc::peer_failure;
    std::shared_ptr<mailbox> to;
    {
      std::lock_guard<spin_lock> g{mtx_};
      if (stopped_) {
        code = stopped_->first;
        why = stopped_->second;
      } else if (const auto* left = gone_.why(c.peer)) {
        why = left_text(c.peer, *left);
      } else if (local_[peer]) {
        to = local_peer_locked(c.peer);
      }
    }
    if (!why.empty()) return fail_now(code, why);
    if (!local_[peer]) {
      try {
        auto plane = plane_.lock();
        if (!plane) return fail_now(errc::aborted, "the world ended");
        if (lend(c, *plane)) return;
      } catch (const error& e) {
        return fail_now(e.code(), e.what());
      } catch (const std::exception& e) {
        return fail_now(errc::internal, e.what());
      }
      send_eager(std::numeric_limits<std::size_t>::max());
      return;
    }
    if (!to) return fail_now(errc::peer_failure, name_of(c.peer) + " left group '" + group_ + "'");
    message m;
    m.src = rank_;
    m.tag = c.tag;
    m.payload = c.buffer;
    if (bytes_of(c.buffer) <= eager_bytes && to->accept_eager(m)) {
      complete_with_one(c.handle, std::move(c.buffer));
      return;
    }
    // Lent: large, or the receiver holds the bound from this rank already.
    m.sender = c.handle;
    m.lent = std::make_unique<message::lender>(message::lender{
        where(c.name), name_of(c.peer) + " to receive it (tag " + std::to_string(c.tag) + ")",
        c.timeout, clock::now() + c.timeout});
    to->accept(std::move(m));
    return;
  }
  // A receive. When it may come from another process, the waiting thread
  // reads the sender's connection itself (a socket read about 3 µs, against
  // 20 µs for the reader thread woken by the kernel), and every peer's
  // shared-memory ring besides (an empty one costs two loads): a thread
  // waiting for several receives (batch_isend_irecv) drives one at a time,
  // and the others' messages then need no reader thread either.
  // (A batch's receives share their work: it pumps every peer, set by the
  // first of them.)
  if (!c.count || !c.handle.state()->driver)
    drive_by_pumping(c.handle, c.kind == p2p_call::recv_any || c.count ? -1 : c.peer);
  // The first waiting message that matches (filled once the lock is
  // released), else posted.
  std::optional<message> got;
  {
    std::unique_lock<spin_lock> g{mtx_};
    if (stopped_) {
      const auto s = *stopped_;
      g.unlock();
      return fail_now(s.first, s.second);
    }
    for (auto i = messages_.begin(); i != messages_.end(); ++i) {
      if (!matches(c, i->src, i->tag)) continue;
      if (i->sender.valid() && i->sender.state()->finished.load()) continue;  // failed meanwhile
      if (i->counted) {  // before the message moves out
        auto& a = waiting_[static_cast<std::size_t>(i->src)];
        --a.messages;
        a.bytes -= bytes_of(i->payload);
      }
      got.emplace(std::move(*i));
      messages_.erase(i);
      break;
    }
    if (!got) {
      if (c.kind == p2p_call::recv) {
        if (const auto* left = gone_.why(c.peer)) {
          const auto why = left_text(c.peer, *left);
          g.unlock();
          return fail_now(errc::peer_failure, why);
        }
      }
      const auto deadline = clock::now() + c.timeout;
      receives_.push_back(receive{std::move(c), deadline});
      arm(receives_.back().deadline);
      return;
    }
  }
  receive r{std::move(c), {}};
  fill(r, *got);
}

void mailbox::drive_by_pumping(const work& w, int peer) {
  const auto at = static_cast<std::size_t>(peer < 0 ? static_cast<int>(local_.size()) : peer);
  std::shared_ptr<const pumping_plan> plan;
  {
    std::lock_guard<spin_lock> g{mtx_};
    if (plans_.empty()) plans_.resize(local_.size() + 1);
    plan = plans_[at];
  }
  if (!plan) {
    auto made = std::make_shared<pumping_plan>();
    made->self = weak_from_this();
    auto plane = plane_.lock();
    for (std::size_t r = 0; plane && r < local_.size(); ++r) {
      if (local_[r] || !plane->pumpable(global_ranks_[r])) continue;
      const bool sender = peer < 0 || static_cast<int>(r) == peer;
      if (sender || !plane->reads_socket(global_ranks_[r]))
        made->connections.push_back(global_ranks_[r]);
    }
    plan = made;
    std::lock_guard<spin_lock> g{mtx_};
    plans_[at] = plan;
  }
  if (plan->connections.empty()) return;
  // The plan drives the receive (kept by the mailbox too, for the next
  // receive from the same peers: setting it allocates nothing).
  w.state()->driver = plan;
}

void mailbox::pumping_plan::drive(work_state& s, clock::time_point until) const {
  if (auto m = self.lock()) m->pump_for(s, until, connections);
}

void mailbox::pump_for(work_state& s, clock::time_point until, const std::vector<int>& peers) {
  auto plane = plane_.lock();
  if (!plane) return;
  const auto& policy = wait_policy::get();
  for (int p : peers) plane->pumping(p, +1, false);
  auto since = clock::now();
  const shared_task* helped = nullptr;
  while (!s.finished.load(std::memory_order_acquire)) {
    bool any = s.helpable.load(std::memory_order_acquire) && lend_a_hand(s, helped);
    for (int p : peers) any |= plane->pump(p);
    const auto now = clock::now();
    if (now >= until) break;
    if (any) {
      since = now;
      continue;
    }
    // Then the reader threads take over, and the waiter sleeps on the work.
    if (!policy.poll_step(now - since)) break;
  }
  // Still waiting: the reader threads take over now; done: they may linger.
  const bool waits = !s.finished.load(std::memory_order_acquire);
  for (int p : peers) plane->pumping(p, -1, waits);
}

arrival_queue<mailbox::receive>::iterator mailbox::first_receive(int src, int tag) {
  return std::find_if(receives_.begin(), receives_.end(),
                      [&](const receive& x) { return matches(x.call, src, tag); });
}

posted_receive mailbox::place(const frame_header& h) {
  std::lock_guard<spin_lock> g{mtx_};
  if (stopped_ || h.src < 0 || h.src >= static_cast<int>(placed_.size()) ||
      !placed_[static_cast<std::size_t>(h.src)])
    return {};
  auto r = first_receive(h.src, h.tag);
  if (r == receives_.end()) return {};
  const auto& buf = r->call.buffer;
  if (!buf.defined() || !buf.is_cpu() || buf.nbytes() != h.payload_bytes ||
      static_cast<std::uint8_t>(buf.scalar_type()) != h.dtype)
    return {};
  auto& p = *placed_[static_cast<std::size_t>(h.src)];
  p.r = std::move(*r);
  receives_.erase(r);
  p.guard = std::allocate_shared<receive_guard>(recycling_allocator<receive_guard>{});
  return posted_receive{p.r->call.buffer, p.guard};
}

std::optional<mailbox::receive> mailbox::revoke(placed& p) {
  if (!p.r) return std::nullopt;
  {
    std::lock_guard<std::mutex> g{p.guard->mtx};
    p.guard->revoked = true;
  }
  p.guard.reset();
  p.drop = true;
  auto r = std::move(p.r);
  p.r.reset();
  return r;
}

void mailbox::arrive(p2p_envelope env) {
  if (env.src >= 0 && env.src < static_cast<int>(placed_.size()) &&
      placed_[static_cast<std::size_t>(env.src)]) {
    std::optional<receive> r;
    {
      std::lock_guard<spin_lock> g{mtx_};
      auto& p = *placed_[static_cast<std::size_t>(env.src)];
      if (p.drop) {  // its receive failed while the frame was read
        p.drop = false;
        return;
      }
      if (p.r) {
        r = std::move(p.r);
        p.r.reset();
        p.guard.reset();
      }
    }
    if (r) {  // read straight into the receive's buffer
      received(r->call, r->call.buffer, env.src);
      return;
    }
  }
  message m;
  m.src = env.src;
  m.tag = env.tag;
  m.payload = std::move(env.payload);
  m.remote = true;
  accept(std::move(m));
}

bool mailbox::accept_eager(message& m) {
  finishes done;
  {
    std::lock_guard<spin_lock> g{mtx_};
    auto r = first_receive(m.src, m.tag);
    if (r != receives_.end() && !stopped_) {
      done.emplace_back(std::move(*r), std::move(m));
      receives_.erase(r);
    } else if (!stopped_) {
      const auto& a = waiting_[static_cast<std::size_t>(m.src)];
      if (a.messages >= max_waiting_messages || a.bytes + bytes_of(m.payload) > max_early_bytes)
        return false;
    }
  }
  if (!done.empty()) {
    settle(done);
    return true;
  }
  // Copied outside the lock; a receive posted meanwhile is found by accept.
  // Threads of one rank sending at once may pass the bound by one message each.
  m.payload = m.payload.clone();
  m.counted = true;
  accept(std::move(m));
  return true;
}

void mailbox::accept(message m) {
  finishes done;
  std::string refused;
  {
    std::lock_guard<spin_lock> g{mtx_};
    if (stopped_ || gone_.why(m.src)) {
      // Nobody will receive it: a lent send fails now.
      if (m.sender.valid() || m.loan)
        done.push_back(
            {std::nullopt, std::move(m),
             std::make_exception_ptr(error(stopped_ ? stopped_->first : errc::peer_failure,
                                           "rank " + std::to_string(rank_) + " left group '" +
                                               group_ + "' before receiving it"))});
    } else {
      auto r = first_receive(m.src, m.tag);
      if (r != receives_.end()) {
        done.emplace_back(std::move(*r), std::move(m));
        receives_.erase(r);
      } else if (m.remote) {
        auto& a = waiting_[static_cast<std::size_t>(m.src)];
        const auto n = bytes_of(m.payload);
        if (a.messages >= max_waiting_messages || a.bytes + n > max_early_bytes) {
          refused = "more than " + std::to_string(max_waiting_messages) + " messages or " +
                    std::to_string(max_early_bytes) + " bytes to group '" + group_ +
                    "' that no receive matched yet";
        } else {
          ++a.messages;
          a.bytes += n;
          m.counted = true;
          messages_.push_back(std::move(m));
        }
      } else {
        if (m.counted) {
          auto& a = waiting_[static_cast<std::size_t>(m.src)];
          ++a.messages;
          a.bytes += bytes_of(m.payload);
        }
        if (m.sender.valid()) arm(m.lent->deadline);
        messages_.push_back(std::move(m));
      }
    }
  }
  if (!refused.empty()) {
    if (auto plane = plane_.lock())
      plane->reject(global_ranks_[static_cast<std::size_t>(m.src)], refused);
    return;
  }
  settle(done);
}

void mailbox::fill(receive& r, message& m) {
  const auto& buf = r.call.buffer;
  const auto& got = m.payload;
  // What the message holds: a lent buffer (its bytes stay in its sender's
  // buffer), or its payload.
  const bool typed = m.loan || got.defined();
  const auto bytes = m.loan ? m.loan->nbytes : bytes_of(got);
  const auto type = m.loan ? static_cast<dtype>(m.loan->dtype)
                           : (got.defined() ? got.scalar_type() : buf.scalar_type());
  // The sender of a message handed over (lent: its loan is returned)
  // completes, or fails with `e`.
  auto release = [&](const std::exception_ptr& e) {
    if (m.loan)
      answer(m.src, m.loan->id, e ? text_of(e) : std::string{});
    else if (m.sender.valid() && e)
      fail_in_pool(m.sender, e);
    else if (m.sender.valid())
      complete_in_pool(m.sender, got);
  };
  if (bytes != bytes_of(buf) || (typed && type != buf.scalar_type())) {
    const auto what = typed ? std::to_string(bytes) + " bytes of " + std::string(to_string(type))
                            : std::string("no tensor");
    fail_in_pool(r.call.handle,
                 std::make_exception_ptr(
                     error(errc::invalid_argument,
                           where(r.call.name) + " failed: rank " + std::to_string(m.src) +
                               " sent " + what + " with tag " + std::to_string(m.tag) +
                               ", but the receive buffer holds " + std::to_string(buf.nbytes()) +
                               " bytes of " + std::string(to_string(buf.scalar_type())))));
    release(nullptr);  // taken, though it did not fit: the send completes
    return;
  }
  if (m.loan && start_split(r, m)) return;
  try {
    if (m.loan) {
      take(m.src, *m.loan, buf, 0, bytes);
      if (auto* stats = inline_counting())
        stats->loans_taken.fetch_add(1, std::memory_order_relaxed);
    } else if (bytes_of(buf) > 0) {
      copy_between_ranks(buf, got, r.call.handle, m.sender);
    }
  } catch (...) {
    fail_in_pool(r.call.handle, std::current_exception());
    release(std::current_exception());
    return;
  }
  release(nullptr);
  received(r.call, buf, m.src);
}

void mailbox::received(p2p_call& c, const tensor& buf, int src) {
  if (!c.count) return complete_in_pool(c.handle, buf, src);
  // The last of the batch's receives; after a failure of one, finish() keeps
  // the work failed.
  if (c.count->left.fetch_sub(1, std::memory_order_acq_rel) == 1)
    complete_in_pool(c.handle, std::move(c.count->outputs));
}

void mailbox::settle(finishes& done) {
  done.for_each([this](finish& f) {
    if (f.lent) {
      auto& c = f.lent->call;
      if (f.withdraw) withdraw(c.peer, f.lent->id);
      if (f.error)
        fail_in_pool(c.handle, f.error);
      else
        complete_in_pool(c.handle, c.buffer);
    } else if (f.r && f.m) {
      fill(*f.r, *f.m);
    } else if (f.r) {
      fail_in_pool(f.r->call.handle, f.error);
    } else if (f.m && f.m->loan) {
      // Nobody here will take it: its lender's send fails with why.
      answer(f.m->src, f.m->loan->id, text_of(f.error));
    } else if (f.m && f.m->sender.valid()) {
      // The text of the sender's side.
      try {
        std::rethrow_exception(f.error);
      } catch (const error& e) {
        fail_in_pool(f.m->sender, std::make_exception_ptr(
                                      error(e.code(), f.m->lent->where + " failed: " + e.what())));
        return;
      } catch (...) {
      }
      fail_in_pool(f.m->sender, f.error);
    }
  });
}

}  // namespace troupe::detail
