// The device exchange (see backends/device_exchange.hpp): rounds of posts,
// shares and finishes, one round per sequence number, chained by events and
// device-actor jobs; a watchdog thread fails rounds that a rank never joins.

#include "backends/device_exchange.hpp"
#include "base/texts.hpp"

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "backends/direct_plan.hpp"
#include "cuda/device_ops.hpp"
#include "cuda/device_queue.hpp"
#include "troupe/error.hpp"

namespace troupe::detail::gpu {

namespace {

using clock = std::chrono::steady_clock;

/// One collective across the ranks (one sequence number).
struct round {
  std::vector<call_ptr> calls;  // by rank; null until the rank posted
  std::vector<std::shared_ptr<device_queue>> queues;
  std::vector<event_t> ready, done;
  int posted = 0, readied = 0, shared = 0, finishing = 0;
  clock::time_point deadline = clock::time_point::max();
  bool failed = false;
  errc code = errc::backend;
  std::string failure;
};

class exchange_impl final : public device_exchange,
                            public std::enable_shared_from_this<exchange_impl> {
 public:
  exchange_impl(int size, device_ops& ops) : size_(size), ops_(ops) {}

  ~exchange_impl() override {
    // The watchdog may be the thread that lets go of the exchange last (a
    // callback of a failed work destroyed the group): it is told, not joined.
    {
      std::lock_guard<std::mutex> g{watch_->mtx};
      watch_->stop = true;
    }
    watch_->cv.notify_all();
    for (auto& kv : rounds_) release_events(kv.second);
  }

  void post(int rank, const call_ptr& c, std::shared_ptr<device_queue> queue) override {
    const auto seq = c->seq;
    if (needs_snapshot(*c)) snapshot_input(*c, *queue);
    {
      std::unique_lock<std::mutex> g{mtx_};
      auto& rd = get(seq);
      if (!aborted_.empty() || rd.failed) {
        auto e =
            error(aborted_.empty() ? rd.code : errc::aborted,
                  aborted_.empty() ? rd.failure : std::string(c->name) + " failed: " + aborted_);
        if (rd.failed && ++rd.posted == size_) {
          release_events(rd);
          rounds_.erase(seq);
        }
        g.unlock();
        c->handle.fail(std::make_exception_ptr(e));
        return;
      }
      rd.calls[static_cast<std::size_t>(rank)] = c;
      rd.queues[static_cast<std::size_t>(rank)] = queue;
      ++rd.posted;
      if (!left_.empty()) {
        g.unlock();
        fail_round(seq, errc::peer_failure, left_message(c->name));
        return;
      }
      if (c->timeout.count() > 0) rd.deadline = std::min(rd.deadline, clock::now() + c->timeout);
      // The watchdog starts with the first call (most groups never see a cuda tensor).
      if (!watching_) {
        watching_ = true;
        std::thread([w = weak_from_this(), st = watch_] { watch(w, st); }).detach();
      }
    }
    poke_watchdog();
    // Stage 1: mark everything this rank issued so far.
    device_job j;
    j.name = c->name;
    j.enqueue = [self = shared_from_this(), seq, rank, dev = queue->device(),
                 name = c->name](stream_t s) {
      self->readied(seq, rank, dev, self->ops_.record_event(name, dev, s));
    };
    j.on_failure = failer(seq);
    queue->submit(std::move(j));
  }

  void leave(int rank, const std::string& reason) override {
    std::vector<std::uint64_t> waiting;
    std::string why;
    {
      std::lock_guard<std::mutex> g{mtx_};
      left_ += (left_.empty() ? "rank " : ", rank ") + std::to_string(rank) + " (" + reason + ")";
      for (auto& [seq, rd] : rounds_)
        if (!rd.failed && !rd.calls[static_cast<std::size_t>(rank)]) waiting.push_back(seq);
    }
    for (auto seq : waiting) {
      std::string name;
      {
        std::lock_guard<std::mutex> g{mtx_};
        auto i = rounds_.find(seq);
        if (i == rounds_.end()) continue;
        for (auto& c : i->second.calls)
          if (c) name = c->name;
      }
      fail_round(seq, errc::peer_failure, left_message(name));
    }
  }

  void abort(const std::string& reason) override {
    std::vector<std::pair<std::uint64_t, std::string>> open;
    {
      std::lock_guard<std::mutex> g{mtx_};
      if (aborted_.empty()) aborted_ = reason;
      for (auto& kv : rounds_) open.emplace_back(kv.first, reason);
    }
    for (auto& [seq, why] : open) fail_round(seq, errc::aborted, why);
  }

 private:
  /// Replaces the call's input by a copy of it, made on the rank's stream
  /// before anything the exchange issues there (so before the rank's ready
  /// event, and before any peer may write into the original).
  void snapshot_input(collective_call& c, device_queue& queue) {
    auto copy = tensor::empty(c.input.shape(), c.input.scalar_type(), c.input.get_device());
    reduce_args a;
    a.type = c.input.scalar_type();
    a.count = static_cast<std::size_t>(c.input.numel());
    a.srcs.push_back(c.input.data());
    a.dsts.push_back(copy.data());
    device_job j;
    j.name = c.name;
    j.enqueue = [self = shared_from_this(), a, dev = queue.device(), name = c.name](stream_t s) {
      self->ops_.reduce(name, dev, a, s);
    };
    j.on_failure = failer(c.seq);
    queue.submit(std::move(j));
    c.input = std::move(copy);
  }

  round& get(std::uint64_t seq) {
    auto& rd = rounds_[seq];
    if (rd.calls.empty()) {
      rd.calls.resize(static_cast<std::size_t>(size_));
      rd.queues.resize(static_cast<std::size_t>(size_));
      rd.ready.resize(static_cast<std::size_t>(size_));
      rd.done.resize(static_cast<std::size_t>(size_));
    }
    return rd;
  }

  /// Round `seq`, or null when it already ended (it failed): then event `e`,
  /// recorded for it on device `dev`, is released at once.
  round* find_or_drop(std::uint64_t seq, int dev, event_t e) {
    auto i = rounds_.find(seq);
    if (i != rounds_.end()) return &i->second;
    ops_.destroy_event(dev, e);
    return nullptr;
  }

  void poke_watchdog() {
    {
      std::lock_guard<std::mutex> g{watch_->mtx};
      watch_->poked = true;
    }
    watch_->cv.notify_all();
  }

  std::function<void(errc, const std::string&)> failer(std::uint64_t seq) {
    return [w = weak_from_this(), seq](errc code, const std::string& why) {
      if (auto self = w.lock()) self->fail_round(seq, code, why);
    };
  }

  /// Stage 1 done on `rank`: once every rank is, check the calls and start the shares.
  void readied(std::uint64_t seq, int rank, int dev, event_t e) {
    std::vector<const collective_call*> calls;
    std::vector<call_ptr> keep;  // the buffers the shares read and write
    std::vector<std::shared_ptr<device_queue>> queues;
    std::vector<event_t> ready;
    {
      std::lock_guard<std::mutex> g{mtx_};
      auto* rd = find_or_drop(seq, dev, e);
      if (!rd) return;
      rd->ready[static_cast<std::size_t>(rank)] = e;
      if (rd->failed || ++rd->readied < size_) return;
      keep = rd->calls;
      for (auto& c : rd->calls) calls.push_back(c.get());
      queues = rd->queues;
      ready = rd->ready;
    }
    std::vector<std::vector<plan_step>> plans;
    try {
      check_calls_agree(calls);
      check_devices(*calls.front(), queues);
      for (int r = 0; r < size_; ++r) plans.push_back(direct_plan(calls, r));
    } catch (const error& x) {
      fail_round(seq, x.code(), x.what());
      return;
    }
    // Stage 2: every rank's share, after everything every rank issued before.
    for (int r = 0; r < size_; ++r) {
      auto& q = queues[static_cast<std::size_t>(r)];
      device_job j;
      j.name = calls[static_cast<std::size_t>(r)]->name;
      j.timeout = calls[static_cast<std::size_t>(r)]->timeout;
      // The job keeps every rank's call (its buffers) alive: when the round
      // fails on another rank, that rank's caller may drop its tensors while
      // this job is still queued (seen: a freed buffer read by a share).
      // A round that failed before the job starts writes nothing more.
      j.enqueue = [self = shared_from_this(), seq, r, dev = q->device(), ready, name = j.name, keep,
                   steps = std::move(plans[static_cast<std::size_t>(r)])](stream_t s) {
        const char* op = name.c_str();
        for (auto ev : ready) self->ops_.wait_event(op, dev, s, ev);
        if (!self->round_failed(seq))
          for (auto& st : steps) self->ops_.reduce(op, dev, st, s);
        self->shared(seq, r, dev, self->ops_.record_event(op, dev, s));
      };
      j.on_failure = failer(seq);
      q->submit(std::move(j));
    }
  }

  /// Every rank's tensors must be reachable from every rank's device.
  void check_devices(const collective_call& c,
                     const std::vector<std::shared_ptr<device_queue>>& queues) {
    for (auto& a : queues)
      for (auto& b : queues)
        if (a->device() != b->device()) ops_.connect(c.name, a->device(), b->device());
  }

  /// Stage 2 done on `rank`: once every rank is, every rank finishes.
  void shared(std::uint64_t seq, int rank, int dev, event_t e) {
    std::vector<call_ptr> calls;
    std::vector<std::shared_ptr<device_queue>> queues;
    std::vector<event_t> done;
    {
      std::lock_guard<std::mutex> g{mtx_};
      auto* rd = find_or_drop(seq, dev, e);
      if (!rd) return;
      rd->done[static_cast<std::size_t>(rank)] = e;
      if (rd->failed || ++rd->shared < size_) return;
      calls = rd->calls;
      queues = rd->queues;
      done = rd->done;
    }
    // Stage 3: wait for every share (peers wrote into this rank's buffers).
    for (int r = 0; r < size_; ++r) {
      auto& c = calls[static_cast<std::size_t>(r)];
      auto& q = queues[static_cast<std::size_t>(r)];
      device_job j;
      j.name = c->name;
      j.timeout = c->timeout;
      j.handle = c->handle;
      j.outputs = c->result();
      j.after = c->on_success;
      j.enqueue = [self = shared_from_this(), seq, dev = q->device(), done,
                   name = c->name](stream_t s) {
        for (auto ev : done) self->ops_.wait_event(name, dev, s, ev);
        self->finishing(seq);
      };
      j.on_failure = failer(seq);
      q->submit(std::move(j));
    }
  }

  /// Stage 3 issued on one more rank: after the last, the round's events go.
  void finishing(std::uint64_t seq) {
    std::lock_guard<std::mutex> g{mtx_};
    auto i = rounds_.find(seq);
    if (i == rounds_.end() || ++i->second.finishing < size_) return;
    release_events(i->second);
    rounds_.erase(i);
  }

  void release_events(round& rd) {
    for (int r = 0; r < size_; ++r) {
      auto& q = rd.queues[static_cast<std::size_t>(r)];
      const int dev = q ? q->device() : 0;
      ops_.destroy_event(dev, rd.ready[static_cast<std::size_t>(r)]);
      ops_.destroy_event(dev, rd.done[static_cast<std::size_t>(r)]);
      rd.ready[static_cast<std::size_t>(r)] = rd.done[static_cast<std::size_t>(r)] = nullptr;
    }
  }

  /// Fails every posted call of round `seq` (later posts fail too).
  /// Whether round `seq` failed (or is gone: it failed and every rank posted).
  bool round_failed(std::uint64_t seq) {
    std::lock_guard<std::mutex> g{mtx_};
    auto i = rounds_.find(seq);
    return i == rounds_.end() || i->second.failed;
  }

  void fail_round(std::uint64_t seq, errc code, const std::string& why) {
    std::vector<call_ptr> calls;
    {
      std::lock_guard<std::mutex> g{mtx_};
      auto i = rounds_.find(seq);
      if (i == rounds_.end() || i->second.failed) return;
      auto& rd = i->second;
      rd.failed = true;
      rd.code = code;
      rd.failure = why;
      calls = rd.calls;
      if (rd.posted == size_) {
        release_events(rd);
        rounds_.erase(i);
      }
    }
    for (auto& c : calls)
      if (c) c->handle.fail(std::make_exception_ptr(error(code, why)));
  }

  /// What the watchdog thread shares with the exchange (it outlives it).
  struct watch_state {
    std::mutex mtx;
    std::condition_variable cv;
    bool stop = false;
    bool poked = false;
  };

  /// The watchdog: fails every round whose deadline passed while a rank had
  /// not posted, then sleeps until the next deadline or a new post.
  static void watch(std::weak_ptr<exchange_impl> weak, std::shared_ptr<watch_state> st) {
    for (;;) {
      auto next = clock::time_point::max();
      {
        auto self = weak.lock();
        if (!self) return;
        next = self->fail_late_rounds();
      }  // the last owner may let go here: the exchange then only sets st->stop
      std::unique_lock<std::mutex> g{st->mtx};
      st->cv.wait_until(g, next, [&] { return st->stop || st->poked; });
      if (st->stop) return;
      st->poked = false;
    }
  }

  /// Fails the rounds past their deadline; returns the next deadline.
  clock::time_point fail_late_rounds() {
    std::vector<std::pair<std::uint64_t, std::string>> late;
    auto next = clock::time_point::max();
    {
      std::lock_guard<std::mutex> g{mtx_};
      const auto now = clock::now();
      for (auto& [seq, rd] : rounds_) {
        if (rd.failed || rd.posted == size_) continue;
        if (rd.deadline <= now)
          late.emplace_back(seq, timeout_message(rd, seq));
        else
          next = std::min(next, rd.deadline);
      }
    }
    for (auto& [seq, why] : late) fail_round(seq, errc::timeout, why);
    return next;
  }

  std::string left_message(const std::string& name) const {
    return name + " failed: a rank of the group left: " + left_;
  }

  std::string timeout_message(const round& rd, std::uint64_t seq) const {
    const collective_call* any = nullptr;
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      auto& c = rd.calls[static_cast<std::size_t>(r)];
      if (c)
        any = c.get();
      else
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    return std::string(any->name) + ": " + detail::timeout_after(any->timeout) +
           " waiting for rank " + missing + " to join (cuda, sequence number " +
           std::to_string(seq) + ")";
  }

  const int size_;
  device_ops& ops_;
  std::mutex mtx_;
  std::map<std::uint64_t, round> rounds_;
  std::string aborted_;
  std::string left_;  // the ranks that left, with their reasons
  bool watching_ = false;
  std::shared_ptr<watch_state> watch_ = std::make_shared<watch_state>();
};

struct directory {
  std::mutex mtx;
  std::map<std::string, std::weak_ptr<exchange_impl>> open;
};

directory& the_directory() {
  static directory* d = new directory;  // never destroyed: exchanges may outlive statics
  return *d;
}

}  // namespace

std::shared_ptr<device_exchange> device_exchange::open(const std::string& key, int size,
                                                       device_ops& ops) {
  auto& d = the_directory();
  std::lock_guard<std::mutex> g{d.mtx};
  if (auto x = d.open[key].lock()) return x;
  auto x = std::make_shared<exchange_impl>(size, ops);
  d.open[key] = x;
  std::erase_if(d.open, [](auto& kv) { return kv.second.expired(); });
  return x;
}

}  // namespace troupe::detail::gpu
