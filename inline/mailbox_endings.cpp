// mailbox's endings other than by data (inline/mailbox.hpp): a peer that
// left or crashed, the group aborted or left, and deadlines — the process's
// one deadline timer, and what a mailbox fails when it fires.

#include <condition_variable>
#include <map>
#include <thread>

#include "base/group_ranks.hpp"
#include "base/process_directory.hpp"
#include "base/texts.hpp"
#include "base/thread_name.hpp"
#include "base/work_state.hpp"
#include "inline/mailbox.hpp"

namespace troupe::detail {

namespace {

/// The process's one timer for point-to-point deadlines: a thread that
/// sleeps until the earliest deadline a mailbox armed and then tells it.
/// Started when first needed; a mailbox arms it only when its own earliest
/// deadline moves earlier (receives share their timeout, so about once per
/// timeout period), never per message.
class deadline_timer {
 public:
  static deadline_timer& instance() {
    static deadline_timer t;
    return t;
  }
  void arm(mailbox::clock::time_point when, std::weak_ptr<mailbox> who) {
    {
      std::lock_guard<std::mutex> g{mtx_};
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
      due_.emplace(when, std::move(who));
    }
    cv_.notify_one();
  }
  ~deadline_timer() {
    {
      std::lock_guard<std::mutex> g{mtx_};
      stopping_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    name_this_thread("trp-deadlines");
    std::unique_lock<std::mutex> g{mtx_};
    while (!stopping_) {
      if (due_.empty()) {
        cv_.wait(g);
        continue;
      }
      const auto next = due_.begin()->first;
      if (mailbox::clock::now() < next) {
        cv_.wait_until(g, next);
        continue;
      }
      auto who = std::move(due_.begin()->second);
      due_.erase(due_.begin());
      g.unlock();
      if (auto m = who.lock()) m->expire();
      g.lock();
    }
  }
  std::mutex mtx_;
  std::condition_variable cv_;
  std::multimap<mailbox::clock::time_point, std::weak_ptr<mailbox>> due_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace

void mailbox::fail_into(finishes& done, receive r, errc code, const std::string& cause) const {
  auto e = std::make_exception_ptr(error(code, where(r.call.name) + " failed: " + cause));
  done.push_back({std::move(r), std::nullopt, std::move(e)});
}

void mailbox::fail_all(errc code, const std::string& reason, finishes& done) {
  for (auto& r : receives_) {
    fail_into(done, std::move(r), code, reason);
  }
  receives_.clear();
  for (auto& p : placed_)
    if (p)
      if (auto r = revoke(*p)) fail_into(done, std::move(*r), code, reason);
  // Messages lent by ranks of this process: their sends fail as sends to a
  // rank that left.
  const auto left = names_[static_cast<std::size_t>(rank_)] + " left group '" + group_ +
                    "' before receiving it (" + reason + ")";
  for (auto& m : messages_)
    if (m.sender.valid() || m.loan)
      done.push_back(
          {std::nullopt, std::move(m), std::make_exception_ptr(error(errc::peer_failure, left))});
  messages_.clear();
  // Lent messages being copied with their lender: the receives fail, and
  // the lenders hear why.
  for (auto& sp : splits_) {
    fail_into(done, std::move(sp.r), code, reason);
    done.push_back({std::nullopt, std::move(sp.m), std::make_exception_ptr(error(code, left))});
  }
  splits_.clear();
  // This rank's loans: their sends fail, and the loans are withdrawn.
  for (auto& l : lent_) {
    auto e = std::make_exception_ptr(error(code, where(l.call.name) + " failed: " + reason));
    done.push_back(finish{std::move(l), std::move(e), true});
  }
  lent_.clear();
  for (auto& a : waiting_) a = {};
}

std::string mailbox::left_text(int peer, const std::string& why) const {
  return left_group(names_[static_cast<std::size_t>(peer)], group_, why);
}

void mailbox::gone(int world_rank, const std::string& why, bool crashed) {
  const int peer = group_rank_of(global_ranks_, ranks_sorted_, world_rank);
  if (peer < 0) return;
  finishes done;
  {
    std::lock_guard<spin_lock> g{mtx_};
    if (crashed) {
      const auto reason = left_text(peer, why);
      if (!stopped_) stopped_ = std::make_pair(errc::peer_failure, reason);
      fail_all(errc::peer_failure, reason, done);
    } else if (gone_.add(peer, static_cast<int>(global_ranks_.size()), why)) {
      // Only a call that needs it makes the text naming it.
      const bool needed = !receives_.empty() || !splits_.empty() || !lent_.empty();
      const auto reason = needed ? left_text(peer, why) : std::string();
      for (auto r = receives_.begin(); r != receives_.end();) {
        if (r->call.kind == p2p_call::recv && r->call.peer == peer) {
          fail_into(done, std::move(*r), errc::peer_failure, reason);
          r = receives_.erase(r);
        } else {
          ++r;
        }
      }
      // Messages it was copying with this rank: it will not now.
      for (auto sp = splits_.begin(); sp != splits_.end();) {
        if (sp->m.src == peer && !sp->helped) {
          fail_into(done, std::move(sp->r), errc::peer_failure, reason);
          sp = splits_.erase(sp);
        } else {
          ++sp;
        }
      }
      // Loans to it never come back.
      for (auto l = lent_.begin(); l != lent_.end();) {
        if (l->call.peer == peer) {
          auto e = std::make_exception_ptr(
              error(errc::peer_failure,
                    where(l->call.name) + " failed: " + reason + " before receiving it"));
          done.push_back(finish{std::move(*l), std::move(e), false});
          l = lent_.erase(l);
        } else {
          ++l;
        }
      }
    }
  }
  settle(done);
}

void mailbox::abort(errc code, const std::string& reason) {
  finishes done;
  {
    std::lock_guard<spin_lock> g{mtx_};
    if (!stopped_) stopped_ = std::make_pair(code, reason);
    fail_all(code, reason, done);
  }
  settle(done);
}

void mailbox::leave(const std::string& reason) {
  abort(errc::aborted, reason);
  if (attached_) {
    process_directory::instance().erase(key_ + std::to_string(rank_));
    attached_ = false;
  }
  // The peers of this process learn it at once (those elsewhere by the data
  // plane's goodbye).
  const int me = global_ranks_[static_cast<std::size_t>(rank_)];
  for (std::size_t r = 0; r < local_.size(); ++r)
    if (local_[r] && static_cast<int>(r) != rank_)
      if (auto p = local_peer(static_cast<int>(r))) p->gone(me, "it destroyed the group", false);
}

void mailbox::arm(clock::time_point deadline) {
  if (deadline >= armed_) return;
  armed_ = deadline;
  deadline_timer::instance().arm(deadline, weak_from_this());
}

std::exception_ptr mailbox::timed_out(const p2p_call& c) const {
  const auto from = c.kind == p2p_call::recv_any ? std::string("any rank")
                                                 : names_[static_cast<std::size_t>(c.peer)];
  return std::make_exception_ptr(error(errc::timeout, where(c.name) +
                                                          " failed: " + timeout_after(c.timeout) +
                                                          " waiting for a message from " + from +
                                                          " with tag " + std::to_string(c.tag)));
}

void mailbox::expire() {
  finishes done;
  std::vector<std::pair<int, std::uint64_t>> withdrawals;  // (peer, loan), sent after the lock
  const auto now = clock::now();
  {
    std::lock_guard<spin_lock> g{mtx_};
    armed_ = clock::time_point::max();
    auto next = clock::time_point::max();
    for (auto r = receives_.begin(); r != receives_.end();) {
      if (r->deadline > now) {
        next = std::min(next, r->deadline);
        ++r;
        continue;
      }
      auto e = timed_out(r->call);
      done.push_back({std::move(*r), std::nullopt, e});
      r = receives_.erase(r);
    }
    for (auto& slot : placed_) {
      if (!slot || !slot->r) continue;
      auto& p = *slot;
      if (p.r->deadline > now) {
        next = std::min(next, p.r->deadline);
        continue;
      }
      auto r = revoke(p);
      auto e = timed_out(r->call);
      done.push_back({std::move(*r), std::nullopt, e});
    }
    for (auto m = messages_.begin(); m != messages_.end();) {
      if (!m->sender.valid()) {
        ++m;
      } else if (m->lent->deadline > now) {
        next = std::min(next, m->lent->deadline);
        ++m;
      } else {
        auto e = std::make_exception_ptr(error(
            errc::timeout, timeout_after(m->lent->timeout) + " waiting for " + m->lent->waits_for));
        done.push_back({std::nullopt, std::move(*m), e});
        m = messages_.erase(m);
      }
    }
    for (auto sp = splits_.begin(); sp != splits_.end();) {
      if (sp->r.deadline > now) {
        next = std::min(next, sp->r.deadline);
        ++sp;
        continue;
      }
      // The lender did not answer: both fail (its send hears why).
      auto e = std::make_exception_ptr(error(
          errc::timeout, where(sp->r.call.name) + " failed: " + timeout_after(sp->r.call.timeout) +
                             " waiting for " + names_[static_cast<std::size_t>(sp->m.src)] +
                             " to copy its half of the message (tag " + std::to_string(sp->m.tag) +
                             ")"));
      done.push_back({std::move(sp->r), std::nullopt, e});
      done.push_back({std::nullopt, std::move(sp->m), e});
      sp = splits_.erase(sp);
    }
    for (auto l = lent_.begin(); l != lent_.end();) {
      if (l->deadline > now) {
        next = std::min(next, l->deadline);
        ++l;
        continue;
      }
      if (l->withdrawn) {  // the receiver did not answer the withdrawal either
        auto e = l->withdrawn;
        done.push_back(finish{std::move(*l), std::move(e), false});
        l = lent_.erase(l);
        continue;
      }
      l->withdrawn = std::make_exception_ptr(error(
          errc::timeout, where(l->call.name) + " failed: " + timeout_after(l->call.timeout) +
                             " waiting for " + names_[static_cast<std::size_t>(l->call.peer)] +
                             " to receive it (tag " + std::to_string(l->call.tag) + ")"));
      l->deadline = now + std::max<clock::duration>(l->call.timeout, std::chrono::seconds(1));
      next = std::min(next, l->deadline);
      withdrawals.emplace_back(l->call.peer, l->id);
      ++l;
    }
    if (next != clock::time_point::max()) arm(next);
  }
  for (const auto& [peer, id] : withdrawals) withdraw(peer, id);
  settle(done);
}

}  // namespace troupe::detail
