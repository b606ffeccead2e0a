// mailbox's loans (inline/mailbox.hpp): large messages between processes of
// one host lent instead of copied through the connection — the lender's side
// (lend, the answers it gets, help with a split) and the receiver's (take,
// the answers it sends, copying a very large message with its lender).

#include "inline/mailbox.hpp"

#include <algorithm>
#include <cstring>

#include "base/callback_pool.hpp"
#include "inline/engine.hpp"
#include "kernels/stream_copy.hpp"
#include "memory/host_memory.hpp"
#include "transport/data_plane.hpp"
#include "transport/frame.hpp"

namespace troupe::detail {

namespace {

/// Where `nbytes` of `type` lie in shared allocation `r`, `from` bytes into
/// the range: what a loan (or a request for help) tells its peer.
p2p_loan loan_of(const shared_range& r, std::size_t from, std::size_t nbytes, dtype type) {
  p2p_loan l;
  l.share_fd = r.fd;
  l.share_id = r.id;
  l.share_size = r.size;
  l.share_offset = r.offset + from;
  l.nbytes = nbytes;
  l.dtype = static_cast<std::uint8_t>(type);
  return l;
}

}  // namespace

bool mailbox::lend(p2p_call& c, data_plane& plane) {
  const auto n = bytes_of(c.buffer);
  const int to = global_ranks_[static_cast<std::size_t>(c.peer)];
  if (n < lend_bytes || !c.buffer.is_cpu() || !c.buffer.is_contiguous() || !plane.shares_memory(to))
    return false;
  const auto range = find_or_share(c.buffer.data(), n);
  if (!range) return false;
  p2p_envelope env{rank_, c.tag, {}, p2p_envelope::lent};
  env.loan = loan_of(*range, 0, n, c.buffer.scalar_type());
  // The waiting thread reads the receiver's connection for the loan's return.
  drive_by_pumping(c.handle, c.peer);
  {
    std::unique_lock<spin_lock> g{mtx_};
    // Checked under the lock that gone() and abort() take: either they come
    // first, or they find the loan and fail it.
    std::string why;
    errc code = errc::peer_failure;
    if (stopped_) {
      code = stopped_->first;
      why = stopped_->second;
    } else if (const auto* left = gone_.why(c.peer)) {
      why = left_text(c.peer, *left);
    }
    if (!why.empty()) {
      g.unlock();
      c.handle.fail(std::make_exception_ptr(error(code, where(c.name) + " failed: " + why)));
      return true;
    }
    env.loan.id = ++loans_;
    lent_.push_back({env.loan.id, c, clock::now() + c.timeout, nullptr});
    arm(lent_.back().deadline);
  }
  plane.send(to, group_, env);
  return true;
}

void mailbox::loan(p2p_envelope env) {
  if (env.src < 0 || env.src >= static_cast<int>(local_.size())) return;
  if (env.kind == p2p_envelope::lent) {
    message m;
    m.src = env.src;
    m.tag = env.tag;
    m.remote = true;
    m.loan = env.loan;
    return accept(std::move(m));
  }
  if (env.kind == p2p_envelope::help) return help(env);
  if (env.kind == p2p_envelope::helped)
    return split_step(env.src, env.loan.id,
                      [why = loan_refusal(env)](split& s) { s.helped = why; });
  if (env.kind == p2p_envelope::withdrawn) {
    // Not taken yet: dropped, so that no receive takes it now (its send
    // fails); being copied with its lender: that receive fails; taken: the
    // sender heard so already.
    bool dropped = false;
    {
      std::lock_guard<spin_lock> g{mtx_};
      auto i = std::find_if(messages_.begin(), messages_.end(), [&](const message& m) {
        return m.loan && m.src == env.src && m.loan->id == env.loan.id;
      });
      if (i != messages_.end()) {
        --waiting_[static_cast<std::size_t>(i->src)].messages;
        messages_.erase(i);
        dropped = true;
      }
    }
    if (dropped) return answer(env.src, env.loan.id, "withdrawn by its sender");
    return split_step(env.src, env.loan.id, [](split& s) { s.withdrawn = true; });
  }
  // Returned: the send completes, or fails with the receiver's reason.
  std::optional<lent_send> done;
  {
    std::lock_guard<spin_lock> g{mtx_};
    auto i = std::find_if(lent_.begin(), lent_.end(), [&](const lent_send& l) {
      return l.id == env.loan.id && l.call.peer == env.src;
    });
    if (i == lent_.end()) return;  // failed meanwhile (deadline, abort)
    done = std::move(*i);
    lent_.erase(i);
  }
  auto& c = done->call;
  const auto why = loan_refusal(env);
  if (why.empty()) return complete_in_pool(c.handle, c.buffer);
  if (done->withdrawn) return fail_in_pool(c.handle, done->withdrawn);
  fail_in_pool(c.handle, std::make_exception_ptr(error(
                             errc::peer_failure, where(c.name) + " failed: " + name_of(c.peer) +
                                                     " could not take the message: " + why)));
}

void mailbox::answer(int src, std::uint64_t id, const std::string& why) const {
  // Often from the thread that reads the lender's frames, which must not
  // wait for room on the connection back.
  if (auto plane = plane_.lock())
    plane->send_soon(global_ranks_[static_cast<std::size_t>(src)], group_,
                     loan_answer(rank_, id, why));
}

void mailbox::withdraw(int peer, std::uint64_t id) const {
  p2p_envelope w{rank_, 0, {}, p2p_envelope::withdrawn};
  w.loan.id = id;
  if (auto plane = plane_.lock())
    plane->send(global_ranks_[static_cast<std::size_t>(peer)], group_, w);
}

void mailbox::take(int src, const p2p_loan& l, const tensor& buf, std::size_t from,
                   std::size_t count) const {
  auto plane = plane_.lock();
  if (!plane) throw error(errc::aborted, "the world ended");
  auto part = l;
  part.share_offset += from;
  part.nbytes = count;
  plane->map_lent(global_ranks_[static_cast<std::size_t>(src)], part, "recv",
                  [&](std::byte* bytes) {
                    // Large copies stream their stores (kernels/stream_copy.hpp): into the
                    // memfd pages of a receive from another process, streaming is about
                    // twice as fast as memcpy.
                    if (buf.is_contiguous()) {
                      auto* to = static_cast<std::byte*>(buf.data()) + from;
                      if (4 * l.nbytes >= stream_threshold()) {
                        stream_copy(to, bytes, count);
                        stream_fence();
                      } else {
                        std::memcpy(to, bytes, count);
                      }
                      return;
                    }
                    // A strided receive buffer takes the message whole.
                    tensor{buf}.copy_from(tensor::from_blob(bytes, buf.shape(), buf.scalar_type()));
                  });
}

bool mailbox::start_split(receive& r, message& m) {
  const tensor buf = r.call.buffer;  // a handle: `r` moves into splits_
  const auto n = m.loan->nbytes;
  if (!may_split_ || n < split_bytes || !buf.is_cpu() || !buf.is_contiguous()) return false;
  const auto range = find_or_share(buf.data(), n);
  auto plane = plane_.lock();
  if (!range || !plane) return false;
  // Halves on a page boundary (a multiple of every element's size).
  const std::size_t at = (n / 2) & ~std::size_t{4095};
  p2p_envelope ask{rank_, m.tag, {}, p2p_envelope::help};
  ask.loan = loan_of(*range, at, n - at, static_cast<dtype>(m.loan->dtype));
  ask.loan.id = m.loan->id;
  const int src = m.src;
  const auto loan = *m.loan;
  const auto timeout = r.call.timeout;
  {
    std::lock_guard<spin_lock> g{mtx_};
    if (stopped_) return false;
    r.deadline = clock::now() + timeout;
    arm(r.deadline);
    auto& sp = splits_.emplace_back();
    sp.r = std::move(r);
    sp.m = std::move(m);
    sp.at = at;
  }
  // From a thread that may be the one reading the lender's frames.
  plane->send_soon(global_ranks_[static_cast<std::size_t>(src)], group_, ask);
  if (auto* stats = inline_counting()) {
    stats->loans_taken.fetch_add(1, std::memory_order_relaxed);
    stats->loans_split.fetch_add(1, std::memory_order_relaxed);
  }
  std::exception_ptr failed;
  try {
    take(src, loan, buf, 0, at);
  } catch (...) {
    failed = std::current_exception();
  }
  split_step(src, loan.id, [&](split& s) {
    s.own_done = true;
    s.own_error = failed;
  });
  return true;
}

void mailbox::split_step(int src, std::uint64_t id, const std::function<void(split&)>& change) {
  std::optional<split> ended;
  {
    std::lock_guard<spin_lock> g{mtx_};
    auto i = std::find_if(splits_.begin(), splits_.end(),
                          [&](const split& s) { return s.m.src == src && s.m.loan->id == id; });
    if (i == splits_.end()) return;  // ended meanwhile (deadline, abort, the lender's death)
    change(*i);
    if (!i->own_done || (!i->own_error && !i->helped && !i->withdrawn)) return;
    ended = std::move(*i);
    splits_.erase(i);
  }
  end_split(*ended);
}

void mailbox::end_split(split& s) {
  const auto& l = *s.m.loan;
  const auto& buf = s.r.call.buffer;
  auto e = s.own_error;
  if (!e && s.withdrawn)
    e = std::make_exception_ptr(
        error(errc::peer_failure, where(s.r.call.name) + " failed: " + name_of(s.m.src) +
                                      " withdrew the message (tag " + std::to_string(s.m.tag) +
                                      ") while it was being copied: its send failed"));
  if (!e && s.helped && !s.helped->empty()) {
    // The lender could not write into this rank's buffer: the rest is copied here.
    try {
      take(s.m.src, l, buf, s.at, l.nbytes - s.at);
    } catch (...) {
      e = std::current_exception();
    }
  }
  if (e) {
    fail_in_pool(s.r.call.handle, e);
    answer(s.m.src, l.id, text_of(e));
    return;
  }
  answer(s.m.src, l.id, {});
  received(s.r.call, buf, s.m.src);
}

void mailbox::help(const p2p_envelope& h) {
  tensor buf;
  {
    std::lock_guard<spin_lock> g{mtx_};
    auto i = std::find_if(lent_.begin(), lent_.end(), [&](const lent_send& l) {
      return l.id == h.loan.id && l.call.peer == h.src;
    });
    // Failed or withdrawn meanwhile: the withdrawal tells the receiver.
    if (i == lent_.end() || i->withdrawn) return;
    buf = i->call.buffer;
  }
  auto plane = plane_.lock();
  if (!plane) return;
  const auto n = bytes_of(buf);
  const auto& l = h.loan;
  std::string why;
  if (l.nbytes > n || l.dtype != static_cast<std::uint8_t>(buf.scalar_type())) {
    why = "it asked for the last " + std::to_string(l.nbytes) + " bytes of " +
          std::string(to_string(static_cast<dtype>(l.dtype))) + " of a message of " +
          std::to_string(n) + " bytes of " + std::string(to_string(buf.scalar_type()));
  } else {
    try {
      plane->map_lent(
          global_ranks_[static_cast<std::size_t>(h.src)], l, "send", [&](std::byte* to) {
            stream_copy(to, static_cast<const std::byte*>(buf.data()) + (n - l.nbytes), l.nbytes);
            stream_fence();
          });
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  // Often from the thread that reads the receiver's frames: it must not wait.
  plane->send_soon(global_ranks_[static_cast<std::size_t>(h.src)], group_,
                   loan_answer(rank_, l.id, why, p2p_envelope::helped));
}

}  // namespace troupe::detail
