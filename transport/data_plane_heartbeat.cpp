// data_plane (data_plane.hpp): the failure detector. A process that stops
// (SIGSTOP, a debugger, a frozen VM) or whose host is cut off keeps its
// sockets open: nothing ends, and its peers would wait for it until their
// calls time out, blaming whichever neighbour they wait for. So every
// process tells each peer process that it runs, and fails the ranks of a
// peer process that sent nothing for a while.
//
// Terms: a heartbeat is a frame of its header alone (frame_heartbeat); a
// peer is "heard" when any of its bytes arrive (a frame in progress too:
// a large message on a slow link counts), whoever reads them (its reader
// thread or a thread that waits and reads itself).
// Every heartbeat interval (a sixth of the bound by default), on one thread
// of its own (off the application's threads: a rank busy computing between
// calls keeps beating):
//   1. beat: a heartbeat to every peer process whose connection is free now
//      (a writer that holds it is sending bytes the peer hears anyway) and
//      would take the few bytes without waiting; from the moment this rank
//      connected to it, while it still builds its world;
//   2. listen, once every peer connected to this rank (its world is built):
//      the ranks of a peer process not heard for the bound less two
//      intervals are gone (crashed: what waits for them fails at once,
//      naming them). Its last bytes came at most an interval before it
//      stopped, and the check comes at most an interval after the silence
//      passed: a stopped process is named within the bound. The silence
//      counts from when listening started at the earliest: a peer that
//      connected here early, then waited as this rank did for a rank late
//      to connect (starved on a loaded host), was heard by nobody listening
//      meanwhile, and has beaten since it connected. Before a
//      verdict this thread reads what waits on the peer's connection
//      itself: on a loaded host the reader thread (a ring's runs at the
//      lowest priority) may not have run for that long while the peer's
//      heartbeats sat unread. Where another thread holds the connection,
//      reading it right now, the verdict waits up to two more intervals,
//      and none comes while bytes of the peer wait unread (that thread may
//      be starved of CPU in the middle of a large message: the peer spoke).
// Trade-off: a short bound finds a frozen process soon but may fail one
// that the machine starved of CPU for that long; a long one waits longer.
// The default (3 s, a heartbeat each 0.5 s) is well under an operation's
// timeout and far above the scheduling delays of a loaded host.

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "base/thread_name.hpp"
#include "transport/data_plane.hpp"
#include "transport/data_plane_parts.hpp"

namespace troupe::detail {

bool data_plane::beat(peer& p) {
  std::unique_lock<futex_lock> g{p.out_mtx, std::try_to_lock};
  if (!g.owns_lock() || !p.out || p.gone.load()) return false;
  if (p.out == p.out_link.get()) {
    // A ring says how much it takes; another transport's link is written.
    if (p.out_link->writes_by_copy() && p.out_link->writable() < sizeof(frame_header)) return false;
  } else if (p.out_socket) {
    // POLLOUT: room for far more than a header, so the write cannot wait.
    pollfd pf{p.out_socket->fd(), POLLOUT, 0};
    if (::poll(&pf, 1, 0) <= 0 || !(pf.revents & POLLOUT)) return false;
  }
  return write_heartbeat(*p.out);
}

void data_plane::heartbeat_loop() {
  name_this_thread("trp-heartbeat");
  using clock = std::chrono::steady_clock;
  const auto every = opts_.heartbeat.count() > 0 ? opts_.heartbeat : opts_.unresponsive / 6;
  const auto silence =
      std::chrono::duration_cast<clock::duration>(std::max(opts_.unresponsive - 2 * every, every));
  bool listening = false;
  std::unique_lock<std::mutex> g{heart_mtx_};
  while (!stopping_) {
    heart_cv_.wait_for(g, every);
    if (stopping_) return;
    g.unlock();
    const auto now = clock::now().time_since_epoch().count();
    // Listening starts: a peer's silence counts from now, not from when its
    // connection came (it may have waited for a late rank since, unheard).
    const bool starts = !listening && listening_.load();
    listening = listening || starts;
    for (int r = 0; r < opts_.world_size; ++r) {
      auto& p = at(r);
      if (p.local || p.gone.load()) continue;
      beat(p);
      if (starts) p.heard_ns.store(now, std::memory_order_relaxed);
      auto heard = p.heard_ns.load(std::memory_order_relaxed);
      if (!listening || opts_.unresponsive.count() <= 0 || heard == 0 ||
          now - heard <= silence.count())
        continue;
      // Its bytes may wait unread behind a starved reader thread: read them.
      bool any = false;
      const bool read = try_drain(r, any);
      heard = p.heard_ns.load(std::memory_order_relaxed);
      const auto grace = read ? clock::duration::zero() : clock::duration(2 * every);
      if (p.gone.load() || now - heard <= (silence + grace).count()) continue;
      // Bytes of its wait unread (a reader of this process that holds the
      // connection but the host starves of CPU, a ring it filled): it spoke.
      if (unread_from(r)) continue;
      const auto ms = (now - heard) / 1000000;
      peer_gone(r,
                "it is unresponsive: its process sent nothing for " + std::to_string(ms) +
                    " ms, not even a heartbeat (stopped, frozen or cut off; "
                    "TROUPE_UNRESPONSIVE_MS=" +
                    std::to_string(opts_.unresponsive.count()) + ")",
                true, -1, failure_kind::unresponsive);
    }
    g.lock();
  }
}

}  // namespace troupe::detail
