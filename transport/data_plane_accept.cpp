// The data plane's door: strangers' connections are accepted and their
// hellos read by one thread's poll loop (transport/pending_handshakes.hpp);
// a peer that proved the job's token gets a reader thread, joined as soon as
// its connection ends. Nothing thrown here ends the process: a failure to
// accept or to start a thread refuses that one connection.

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "base/thread_name.hpp"
#include "transport/data_plane_parts.hpp"
#include "transport/handshake.hpp"
#include "transport/pending_handshakes.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

namespace {

/// Accepted per round of the loop at most, so pending handshakes keep moving during a flood.
constexpr int accepts_per_round = 256;

}  // namespace

void data_plane::refuse(const std::string& who, const std::string& why) {
  ++refused_;
  // At most 10 lines a second: a flood of strangers must not flood stderr as well.
  const auto now = std::chrono::steady_clock::now();
  if (now - log_window_ >= std::chrono::seconds(1)) {
    if (unlogged_ > 0)
      std::fprintf(stderr, "[troupe rank %d] refused %llu more data-plane connections\n",
                   opts_.rank, static_cast<unsigned long long>(unlogged_));
    log_window_ = now;
    logged_ = 0;
    unlogged_ = 0;
  }
  if (logged_++ < 10)
    std::fprintf(stderr, "[troupe rank %d] refused data-plane connection from %s: %s\n", opts_.rank,
                 who.c_str(), why.c_str());
  else
    ++unlogged_;
}

void data_plane::accept_loop() {
  name_this_thread("trp-accept");
  try {
    pending_handshakes::defer_accept(listen_fd_);
    pending_handshakes pending(
        [] { return std::make_unique<hello_decoder>(); },
        [this](int fd, const std::string& who, handshake_decoder& d) {
          adopt(fd, who, static_cast<hello_decoder&>(d).result());
        },
        [this](const std::string& who, const std::string& why) { refuse(who, why); });
    std::vector<pollfd> fds;
    while (!stopping_) {
      fds.assign({pollfd{listen_fd_, POLLIN, 0}, pollfd{wake_[0], POLLIN, 0}});
      pending.poll_set(fds);
      // Wakes at least once a second to join the threads of ended connections.
      int timeout = pending.timeout_ms();
      if (timeout < 0 || timeout > 1000) timeout = 1000;
      const int n = ::poll(fds.data(), fds.size(), timeout);
      if (stopping_) break;
      if (n < 0 && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      reclaim_threads();
      pending.advance(fds.data() + 2, fds.size() - 2);  // before accepting: same order
      if (n <= 0 || !(fds[0].revents & POLLIN)) continue;
      for (int i = 0; i < accepts_per_round; ++i) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
          pending.add(fd);
          continue;
        }
        if (errno == EINTR) continue;
        // Out of descriptors or memory: the connection waits in the backlog;
        // do not spin on it.
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        break;
      }
    }
  } catch (const std::exception& e) {
    if (!stopping_)
      std::fprintf(stderr, "[troupe rank %d] the data plane stopped accepting connections: %s\n",
                   opts_.rank, e.what());
  } catch (...) {
  }
}

void data_plane::adopt(int fd, const std::string& who, const hello& h) {
  auto refuse_fd = [&](const std::string& why) {
    ::close(fd);
    refuse(who, why);
  };
  if (!same_token(h.token, opts_.token)) return refuse_fd("wrong job token");
  if (h.job != opts_.job) return refuse_fd("wrong job");
  const int r = h.rank;
  if (r < 0 || r >= opts_.world_size || at(r).local)
    return refuse_fd("bad rank " + std::to_string(r));
  auto& p = at(r);
  {
    std::lock_guard<std::mutex> g{mtx_};
    if (p.in_socket) return refuse_fd("rank " + std::to_string(r) + " is already connected");
  }
  // The link it offers (transport/link.hpp: "NAME ADDRESS"); when this
  // process cannot open it (a transport it lacks; for shared memory, a peer
  // process that is not dumpable keeps its /proc/PID/fd to itself), its
  // frames come over the socket instead, and the answer (2) tells it so.
  std::unique_ptr<link_in> in_link;
  std::string no_link;
  bool memory_link = false;
  if (!h.link.empty()) {
    const auto space = h.link.find(' ');
    const auto name = h.link.substr(0, space);
    try {
      const auto* kind = find_transport(name);
      if (!kind) throw error(errc::backend, "no transport '" + name + "' in this process");
      memory_link = kind->maps_memory;
      in_link = kind->open_in(space == std::string::npos ? std::string() : h.link.substr(space + 1),
                              {r, opts_.rank, p.same_host, h.pid});
    } catch (const std::exception& e) {
      no_link = e.what();
    }
  }
  // From here on it is a peer: blocking reads in its reader, no delay on its frames.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  tcp_set_no_delay(fd);
  auto sock = std::make_unique<tcp_stream>(fd);
  tcp_set_read_timeout(fd, std::chrono::milliseconds(0));
  char ack = no_link.empty() ? 1 : 2;
  if (!no_link.empty() && memory_link) p.memory_closed = true;  // before it hears so
  if (!sock->write(&ack, 1)) return;
  if (!no_link.empty())
    std::fprintf(stderr, "[troupe rank %d] reading %s over its socket, not its link: %s\n",
                 opts_.rank, describe(r).c_str(), no_link.c_str());
  auto* raw = sock.get();
  {
    std::lock_guard<std::mutex> g{mtx_};
    if (stopping_ || p.in_socket) return;  // the socket closes with `sock`
    p.in_socket = std::move(sock);
    p.in_link = std::move(in_link);
    p.heard_ns.store(std::chrono::steady_clock::now().time_since_epoch().count());
    ++connected_;
  }
  connected_cv_.notify_all();
  bool started = spawn("trp-read-" + std::to_string(r), [this, r] { reader_loop(r); });
  if (started && p.in_link)
    // Data comes through the link; the socket only tells when the peer is gone.
    started = spawn("trp-gone-" + std::to_string(r), [this, r, raw] {
      char byte;
      while (raw->read(&byte, 1)) {
      }
      // The peer closes its socket after its last frames and its goodbye
      // went into the link: read them before the link closes (closing first
      // lost them, and the goodbye made a rank that left look crashed).
      auto& pr = at(r);
      {
        std::lock_guard<std::mutex> g{pr.in_mtx};
        bool any = false;
        if (pr.in_link && !pr.over) drain(r, any);
      }
      if (pr.in_link) pr.in_link->close();
    });
  if (!started) {
    std::fprintf(stderr, "[troupe rank %d] cannot start a reader thread for %s\n", opts_.rank,
                 describe(r).c_str());
    peer_gone(r, "this rank could not start a thread to read its connection", true);
    raw->close();
    if (p.in_link) p.in_link->close();
  }
}

namespace {

/// The plane whose reader this thread is, and where it keeps the plane
/// alive once the plane was closed from it (and detached it).
struct reader_thread {
  const data_plane* plane = nullptr;
  std::shared_ptr<data_plane>* keep = nullptr;
  bool detached = false;
};
thread_local reader_thread reader_of;

}  // namespace

std::shared_ptr<data_plane>* data_plane::detach_reader(const data_plane* plane) {
  if (reader_of.plane != plane) return nullptr;
  reader_of.detached = true;
  return reader_of.keep;
}

bool data_plane::spawn(const std::string& name, std::function<void()> f) {
  std::lock_guard<std::mutex> g{mtx_};
  if (stopping_) return false;
  const auto id = next_reader_++;
  try {
    readers_[id] = std::thread([this, id, f = std::move(f)] {
      std::shared_ptr<data_plane> keep;  // set by a close() on this thread
      reader_of = {this, &keep, false};
      try {
        f();
      } catch (...) {  // a peer's failure never ends the process
      }
      const bool detached = reader_of.detached;
      reader_of = {};
      if (detached) return;  // by that close(); the plane may end with `keep`
      std::lock_guard<std::mutex> l{mtx_};
      finished_.push_back(id);
    });
    name_thread(readers_[id], name);
  } catch (const std::exception&) {
    readers_.erase(id);
    return false;
  }
  return true;
}

void data_plane::reclaim_threads() {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> g{mtx_};
    for (auto id : finished_) {
      done.push_back(std::move(readers_.at(id)));
      readers_.erase(id);
    }
    finished_.clear();
  }
  for (auto& t : done) t.join();  // they have ended: joining is immediate
}

std::size_t data_plane::reader_threads() {
  std::lock_guard<std::mutex> g{mtx_};
  return readers_.size() - finished_.size();
}

}  // namespace troupe::detail
