// data_plane (data_plane.hpp): receiving — each frame's sender admitted
// before its payload is read, frames handed to their group's route (the
// inline engine's sink or the group actor's), connections read by their
// reader thread or by a waiting thread that pumps them, and the routes.

#include "transport/data_plane.hpp"

#include <poll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "memory/peer_memory.hpp"
#include "transport/data_plane_parts.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

std::string data_plane::admit(int r, const frame_header& h, const std::string& group, bool& skip) {
  auto& p = at(r);
  p.current.reset();
  if (h.kind == frame_goodbye) return {};
  // Mostly the group of this peer's last frame, its route unchanged since.
  const auto version = routes_version_.load(std::memory_order_acquire);
  if (p.last_version == version && p.last_group == group) p.current = p.last_route.lock();
  if (!p.current) {
    std::lock_guard<std::mutex> g{mtx_};
    if (auto i = routes_.find(group); i != routes_.end()) p.current = i->second;
    p.last_route = p.current;
    p.last_group = group;
    p.last_version = routes_version_.load(std::memory_order_relaxed);
  }
  const auto* rt = p.current.get();
  // A group that does not exist here (destroyed, or never joined): dropped unread.
  if (!rt || (h.kind == frame_inline ? !rt->sink : !rt->actor.collective)) {
    skip = true;
    return {};
  }
  return check_sender(h, group, rt->members, r);
}

bool data_plane::dispatch(int r, received_frame& f, std::string& refusal) {
  if (f.header.kind == frame_heartbeat) return true;  // its bytes were heard (drain)
  auto& p = at(r);
  if (f.header.kind == frame_goodbye) {
    // A rank that left on purpose: only calls still waiting for it fail
    // (what it sent before it left still counts), naming the rank it blames.
    const int cause = f.header.src;
    const bool blames = cause >= 0 && cause < opts_.world_size && cause != r;
    const auto kind = f.header.code <= static_cast<std::uint8_t>(failure_kind::dropped)
                          ? static_cast<failure_kind>(f.header.code)
                          : failure_kind::failed;
    peer_gone(r,
              blames ? "it left the job after " + describe(cause) + " " + failure_words(kind)
                     : "it left the job",
              false, blames ? cause : -1, kind);
    return false;
  }
  const auto rt = std::move(p.current);  // checked by admit()
  if (!rt) return true;
  if (f.header.kind == frame_inline) {
    refusal = rt->sink(f);
    return refusal.empty();
  }
  if (f.header.kind != frame_collective) note_p2p();
  if (f.header.kind == frame_loan) {
    p2p_envelope env;
    refusal = read_loan(f, env);
    // Only a process that can map this one's memory may lend to it (or ask
    // for help with a loan): another host's pid names some unrelated process here.
    if (refusal.empty() && (env.kind == p2p_envelope::lent || env.kind == p2p_envelope::help) &&
        !shares_memory(r))
      refusal = "a loan of its memory, which this rank cannot map (no shared memory between them)";
    if (!refusal.empty()) return false;
    if (rt->actor.loan)
      rt->actor.loan(std::move(env));
    else if (env.kind == p2p_envelope::lent)
      take_loan(r, f.group, *rt, std::move(env));
    return true;
  }
  if (f.header.kind == frame_collective)
    rt->actor.collective(envelope{f.header.seq, f.header.step, f.header.src,
                                  static_cast<op_code>(f.header.code), std::move(f.payload),
                                  std::move(f.fp)});
  else
    rt->actor.p2p(p2p_envelope{f.header.src, f.header.tag, std::move(f.payload)});
  return true;
}

bool data_plane::drain(int r, bool& any) {
  auto& p = at(r);
  if (p.over) return false;
  std::string refusal, why;
  try {
    // One reference captured (the frame reader takes std::functions: a
    // lambda of more than two references each call would be allocated).
    struct reading {
      data_plane& plane;
      int r;
      bool& any;
      std::string& refusal;
    } rd{*this, r, any, refusal};
    auto on_frame = [&rd](received_frame& f) {
      rd.any = rd.any || f.header.kind != frame_heartbeat;
      return rd.plane.dispatch(rd.r, f, rd.refusal);
    };
    auto admit_frame = [&](const frame_header& h, const std::string& group, bool& skip) {
      return admit(r, h, group, skip);
    };
    // Inline and point-to-point payloads may go where a receive was posted for them.
    auto place = [&](const frame_header& h, const std::string&) {
      const auto& rt = p.current;
      if (!rt) return posted_receive{};
      if (h.kind == frame_inline) return rt->place ? rt->place(h) : posted_receive{};
      if (h.kind == frame_p2p && rt->actor.p2p_place) return rt->actor.p2p_place(h);
      return posted_receive{};
    };
    const auto before = p.reader.bytes_read();
    if (p.in_link) {
      why = p.reader.drain([&](void* d, std::size_t n) { return p.in_link->read_some(d, n); },
                           on_frame, place, admit_frame);
      p.in_link->publish_read();  // once for the frames read: they are delivered
    } else {
      why = p.reader.drain(p.in_socket->fd(), on_frame, place, admit_frame);
    }
    // Anything from the peer, a frame in progress too, says its process runs.
    if (p.reader.bytes_read() != before)
      p.heard_ns.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                       std::memory_order_relaxed);
  } catch (const std::exception& e) {
    why = std::string("reading its frames failed: ") + e.what();
  } catch (...) {
    why = "reading its frames failed: an unknown exception";
  }
  if (why.empty()) return true;
  p.over = true;
  p.current.reset();
  if (why == "stopped" && refusal.empty()) return false;  // a goodbye, already handled
  if (!refusal.empty()) why = refusal;
  if (why == "connection closed" || why.rfind("connection broke", 0) == 0) {
    // A live rank that closed it said why (data_plane_peers.cpp): it left
    // this connection, not the world, and is not this rank's culprit.
    if (const auto note = read_note(r); !note.empty())
      peer_gone(r,
                "it closed its connection to this rank, its process alive (as it saw this rank: " +
                    note + ")",
                false);
    else
      peer_gone(r, "its process died or its connection broke (" + why + ")", true, -1,
                failure_kind::died);
    return false;
  }
  reject(r, why);  // a frame broke the rules: the peer fails, the process goes on
  return false;
}

std::chrono::nanoseconds data_plane::parked_for(const peer& p) {
  if (p.pumpers.load() > 0) return std::chrono::milliseconds(2);
  const auto stopped = p.pumped_ns.load(std::memory_order_relaxed);
  if (stopped == 0) return {};
  const auto since =
      std::chrono::steady_clock::now().time_since_epoch() - std::chrono::nanoseconds(stopped);
  return since < reading_linger ? reading_linger - since : std::chrono::nanoseconds{};
}

void data_plane::reader_loop(int r) {
  auto& p = at(r);
  // A shared-memory ring's reader thread runs at the lowest priority: the
  // rank's own threads read its ring while they wait (pump), and a woken
  // reader on the rank's CPU would only take that CPU from the waiting
  // thread (troupe-run binds a rank's threads to one CPU). It still delivers
  // when nobody waits: the waiting thread yields, then sleeps. Socket
  // readers keep their priority (TCP's large messages are read by them
  // while the waiting thread sends).
  if (p.in_link) ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
  // Waits up to 100 ms for bytes; false once nothing more can come.
  auto wait = [&]() -> bool {
    if (p.in_link) return p.in_link->wait_readable(std::chrono::milliseconds(100), ring_linger_);
    pollfd pf{p.in_socket->fd(), POLLIN, 0};
    return ::poll(&pf, 1, 100) >= 0 || errno == EINTR;
  };
  for (;;) {
    {
      // A socket's reader parks while a waiting thread reads the socket
      // itself, and for reading_linger after the last one stopped without
      // handing the socket over (its call completed: in a loop of calls the
      // next one reads again at once). Parked, it is off the socket's wait
      // queue: the peer's bytes wake no thread to take the CPU from the one
      // that reads them (a context switch and a lock hand-off per message
      // on a rank's CPU). It looks again every 2 ms; a pumper that hands
      // over (it goes to sleep still waiting) resumes it at once.
      // A ring's reader sleeps on the ring instead: its writer does not wake
      // it while a thread here polls (shm_ring::polling), and the last
      // poller to stop wakes it when bytes wait, so a waiting thread that
      // comes and goes costs no wake-up (else a park and a wake per peer
      // and step).
      std::unique_lock<std::mutex> g{p.in_mtx};
      if (p.over || stopping_) return;
      if (!p.in_link) {
        if (const auto rest = parked_for(p); rest.count() > 0) {
          p.park.wait_for(g, rest);
          continue;
        }
      }
    }
    const bool open = wait();
    if (stopping_) return;
    // Woken by bytes that a thread which began pumping meanwhile reads.
    if (open && !p.in_link && p.pumpers.load() > 0) continue;
    std::lock_guard<std::mutex> g{p.in_mtx};
    bool any = false;
    if (!drain(r, any) || (!open && !any)) return;
  }
}

bool data_plane::reads_socket(int r) const {
  auto& p = at(r);
  return p.in_socket && !p.in_link;
}

bool data_plane::pumpable(int r) const {
  auto& p = at(r);
  return p.in_socket || p.in_link;
}

bool data_plane::pump(int r) {
  auto& p = at(r);
  if (!p.in_socket && !p.in_link) return false;
  // An empty ring has nothing to read (its end is the reader thread's to
  // see): no lock taken, as a waiting thread asks at every turn.
  if (p.in_link && !p.in_link->readable()) return false;
  bool any = false;
  try_drain(r, any);
  return any;
}

bool data_plane::pump_all(const std::vector<int>& ranks) {
  // The sockets to ask, on this call's stack (up to 64; beyond, on the
  // heap): a frame's callback may wait for another call and pump again on
  // this thread, so nothing here may be shared between calls.
  constexpr std::size_t on_stack = 64;
  pollfd stack_fds[on_stack];
  int stack_whose[on_stack];
  std::vector<pollfd> heap_fds;
  std::vector<int> heap_whose;
  pollfd* fds = stack_fds;
  int* whose = stack_whose;
  if (ranks.size() > on_stack) {
    heap_fds.resize(ranks.size());
    heap_whose.resize(ranks.size());
    fds = heap_fds.data();
    whose = heap_whose.data();
  }
  std::size_t n = 0;
  bool any = false;
  for (int r : ranks) {
    auto& p = at(r);
    if (p.in_link) {
      any = pump(r) || any;
    } else if (p.in_socket) {
      fds[n] = pollfd{p.in_socket->fd(), POLLIN, 0};
      whose[n++] = r;
    }
  }
  // One socket: reading it is the one system call either way.
  if (n == 1) return pump(whose[0]) || any;
  if (n == 0 || ::poll(fds, n, 0) <= 0) return any;
  for (std::size_t i = 0; i < n; ++i)
    if (fds[i].revents != 0) any = pump(whose[i]) || any;
  return any;
}

bool data_plane::try_drain(int r, bool& any) {
  auto& p = at(r);
  std::unique_lock<std::mutex> g{p.in_mtx, std::try_to_lock};
  if (!g.owns_lock()) return false;
  if (p.in_socket || p.in_link) drain(r, any);  // what waits, without waiting
  return true;
}

std::unique_lock<std::mutex> data_plane::hold_reading(int r) {
  return std::unique_lock<std::mutex>{at(r).in_mtx};
}

bool data_plane::unread_from(int r) {
  auto& p = at(r);
  if (p.in_link) return p.in_link->readable();
  if (!p.in_socket) return false;
  int waiting = 0;
  return ::ioctl(p.in_socket->fd(), FIONREAD, &waiting) == 0 && waiting > 0;
}

void data_plane::pumping(int r, int delta, bool wake) {
  auto& p = at(r);
  // The last poller of a ring to stop reads what came while it polled
  // (those writers woke nobody) instead of waking the reader thread for it:
  // a system call and a thread that takes the CPU (4 processes on 2 CPUs,
  // halo exchange). Where another thread holds the ring meanwhile (it may
  // have looked before the bytes came), the reader is woken.
  if (p.in_link && p.in_link->polling(delta) && !pump(r) && p.in_link->readable())
    p.in_link->wake_reader();
  if (p.pumpers.fetch_add(delta) + delta != 0) return;
  // The last pumper stopped: handing the socket over (`wake`), the reader
  // resumes now; else it lingers parked (reading_linger).
  if (!p.in_link)
    p.pumped_ns.store(wake ? 0 : std::chrono::steady_clock::now().time_since_epoch().count(),
                      std::memory_order_relaxed);
  if (wake) {
    // The caller may be the thread that reads r's frames right now (a
    // callback of a call that a frame completed waits for another one):
    // then the reader sees the change at its next look (2 ms at most).
    std::unique_lock<std::mutex> g{p.in_mtx, std::try_to_lock};
    p.park.notify_all();
  }
}

void data_plane::set_route(const std::string& group, const std::function<void(route&)>& change) {
  std::lock_guard<std::mutex> g{mtx_};
  auto i = routes_.find(group);
  auto next = std::make_shared<route>(i == routes_.end() ? route{} : *i->second);
  change(*next);
  if (!next->actor.collective && !next->sink)
    routes_.erase(group);
  else
    routes_[group] = std::move(next);
  routes_version_.fetch_add(1, std::memory_order_release);
}

void data_plane::add_sink(const std::string& group, const std::vector<int>& members,
                          inline_sink sink, inline_place place) {
  set_route(group, [&](route& rt) {
    rt.members = members;
    rt.sink = std::move(sink);
    rt.place = std::move(place);
  });
}

void data_plane::remove_sink(const std::string& group) {
  set_route(group, [](route& rt) {
    rt.sink = nullptr;
    rt.place = nullptr;
  });
}

void data_plane::add_group(const std::string& group, const std::vector<int>& members,
                           group_sink sink) {
  const auto gone = sink.gone;
  set_route(group, [&](route& rt) {
    rt.members = members;
    rt.actor = std::move(sink);
  });
  // Peers gone before the group existed fail its calls as well.
  for (int r = 0; r < opts_.world_size; ++r) {
    auto& p = at(r);
    if (!p.gone.load()) continue;
    std::string why;
    bool crashed = false;
    {
      std::lock_guard<std::mutex> g{mtx_};
      why = p.gone_why;
      crashed = p.crashed;
    }
    if (gone) gone(r, why, crashed);
  }
}

void data_plane::map_lent(int r, const p2p_loan& l, const char* op,
                          const std::function<void(std::byte*)>& use) {
  std::lock_guard<std::mutex> g{lent_mtx_};  // also keeps the mapping while `use` runs
  if (!lent_) lent_ = std::make_unique<peer_memory>();
  use(lent_->map(pid_of(r),
                 peer_buffer{l.share_fd, l.share_id, l.share_size, l.share_offset, l.nbytes}, op,
                 describe(r)));
}

void data_plane::take_loan(int r, const std::string& group, const route& rt, p2p_envelope env) {
  const auto me = std::find(rt.members.begin(), rt.members.end(), opts_.rank);
  const auto& l = env.loan;
  tensor copy;
  std::string why;
  try {
    const auto type = static_cast<dtype>(l.dtype);
    copy = tensor::empty({static_cast<std::int64_t>(l.nbytes / element_size(type))}, type);
    map_lent(r, l, "recv",
             [&](const std::byte* from) { std::memcpy(copy.data(), from, l.nbytes); });
  } catch (const std::exception& e) {
    why = e.what();
    copy = {};
  }
  // From the reader thread, which must not wait.
  send_soon(r, group, loan_answer(static_cast<std::int32_t>(me - rt.members.begin()), l.id, why));
  if (copy.defined() && rt.actor.p2p) rt.actor.p2p(p2p_envelope{env.src, env.tag, std::move(copy)});
}

void data_plane::remove_group(const std::string& group) {
  set_route(group, [](route& rt) { rt.actor = {}; });
}

}  // namespace troupe::detail
