// store_gate: the store server's door and wire, one poll loop
// (why and what: store/store_gate.hpp).

#include "store/store_gate.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "store/gate_io.hpp"
#include "transport/pending_handshakes.hpp"
#include "transport/tcp_stream.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

namespace {

/// Unwritten answers a connection may hold before it is closed.
constexpr std::size_t max_outbox = std::size_t{2} * max_store_message;

}  // namespace

struct store_gate::impl {
  /// Answers not yet written to a connection; shared with its session's callbacks.
  struct outbox {
    std::mutex m;
    int fd = -1;
    std::string bytes;
    bool closed = false;
    bool overflow = false;  // the client reads nothing while its answers pile up
  };

  /// One accepted connection, owned by the loop.
  struct session {
    int fd = -1;
    std::string peer;
    store_message_reader reader;
    std::shared_ptr<outbox> out;
    caf::actor actor;
    std::vector<std::pair<std::string, bytes>> watches;  // appended if it dies
    bool goodbye = false;
  };

  std::string token;
  std::string welcome;  // byte 1, then who serves (u8 length + text)
  int listen_fd = -1;
  std::uint16_t port = 0;
  int wake[2] = {-1, -1};
  std::atomic<bool> stopping{false};
  std::atomic<std::uint64_t> refused{0};
  std::atomic<std::size_t> open{0};
  caf::actor_system* sys = nullptr;
  store_actor server;
  std::thread loop;
  std::vector<session> sessions;  // the loop's own
  // Refusals logged per second at most (a flood must not flood stderr too).
  gate_clock::time_point log_window{};
  int logged = 0;
  std::uint64_t unlogged = 0;

  void refuse(const std::string& peer, const std::string& why) {
    ++refused;
    const auto now = gate_clock::now();
    if (now - log_window >= std::chrono::seconds(1)) {
      if (unlogged > 0)
        std::fprintf(stderr, "[troupe store] refused %llu more connections\n",
                     static_cast<unsigned long long>(unlogged));
      log_window = now;
      logged = 0;
      unlogged = 0;
    }
    if (logged++ < 10)
      std::fprintf(stderr, "[troupe store] refused connection from %s: %s\n", peer.c_str(),
                   why.c_str());
    else
      ++unlogged;
  }

  void poke() { poke(wake[1]); }
  static void poke(int fd) { [[maybe_unused]] auto n = ::write(fd, "x", 1); }

  /// Writes what fits now (the caller holds o.m).
  static void flush(outbox& o) {
    while (!o.bytes.empty()) {
      const auto k = ::send(o.fd, o.bytes.data(), o.bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) {
        o.bytes.erase(0, static_cast<std::size_t>(k));
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      o.bytes.clear();  // broken: the loop notices the end when reading
      return;
    }
  }

  /// Queues an answer and writes what fits; the loop (woken through
  /// `wake_fd`) writes the rest. Runs on a session's thread: once the loop
  /// closed the connection (and before the gate goes), it does nothing.
  static void answer(const std::shared_ptr<outbox>& o, int wake_fd, std::string msg) {
    std::lock_guard<std::mutex> g{o->m};
    if (o->closed) return;
    if (o->bytes.size() + msg.size() > max_outbox) {
      o->overflow = true;
      poke(wake_fd);
      return;
    }
    o->bytes += msg;
    flush(*o);
    if (!o->bytes.empty()) poke(wake_fd);
  }

  void admit(int fd, const std::string& peer, handshake_decoder& d) {
    if (!same_token(static_cast<preamble_decoder&>(d).token(), token)) {
      refuse(peer, "wrong job token");  // logged and counted before the client learns
      [[maybe_unused]] auto n = ::send(fd, "\0", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(fd);
      return;
    }
    if (::send(fd, welcome.data(), welcome.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
        static_cast<ssize_t>(welcome.size())) {
      ::close(fd);
      return;
    }
    session s;
    s.fd = fd;
    s.peer = peer;
    s.out = std::make_shared<outbox>();
    s.out->fd = fd;
    s.actor = spawn_store_session(*sys, server, token);
    sessions.push_back(std::move(s));
    ++open;
  }

  /// Ends a connection; a watched one that died gets its values appended.
  void close(session& s, const std::string& why) {
    {
      std::lock_guard<std::mutex> g{s.out->m};
      s.out->closed = true;
      ::close(s.fd);
    }
    s.fd = -1;
    --open;
    caf::anon_send_exit(s.actor, caf::exit_reason::user_shutdown);  // its waiters are dropped
    if (!why.empty())
      std::fprintf(stderr, "[troupe store] dropping connection from %s: %s\n", s.peer.c_str(),
                   why.c_str());
    if (s.goodbye || stopping) return;
    for (auto& [key, value] : s.watches)
      caf::anon_send(server, kv_append_atom::value, token, key, value);
  }

  void handle(session& s, const std::string& body) {
    std::uint64_t id = 0;
    std::string why;
    auto req = decode_request(body, id, why);
    if (!req) return close(s, "it sent " + why);
    switch (req->op) {
      case store_op::watch:
        s.watches.emplace_back(req->keys.front(), req->values.front());
        return answer(s.out, wake[1], encode_reply(id, req->op, store_reply{}));
      case store_op::goodbye:
        s.goodbye = true;
        return;
      default:
        break;
    }
    const auto op = req->op;
    auto call = std::make_shared<store_call>();
    call->request = std::move(*req);
    call->done = [o = s.out, fd = wake[1], id, op](store_reply r) {
      answer(o, fd, encode_reply(id, op, r));
    };
    caf::anon_send(s.actor, std::move(call));
  }

  /// Reads what the connection has; false once it ended.
  bool read(session& s) {
    char buf[64 << 10];
    for (int round = 0; round < 16; ++round) {  // then the others get their turn
      const auto k = ::recv(s.fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (k <= 0) {
        close(s, "");
        return false;
      }
      for (std::size_t at = 0; at < static_cast<std::size_t>(k);) {
        at += s.reader.feed(buf + at, static_cast<std::size_t>(k) - at);
        if (s.reader.bad()) {
          close(s, "it sent " + s.reader.why());
          return false;
        }
        if (s.reader.ready()) {
          handle(s, s.reader.take());
          if (s.fd < 0) return false;
        }
      }
    }
    return true;
  }

  void run() {
    pending_handshakes pending(
        [] { return std::make_unique<preamble_decoder>(); },
        [this](int fd, const std::string& peer, handshake_decoder& d) { admit(fd, peer, d); },
        [this](const std::string& peer, const std::string& why) { refuse(peer, why); });
    std::vector<pollfd> fds;
    while (!stopping) {
      fds.assign({pollfd{listen_fd, POLLIN, 0}, pollfd{wake[0], POLLIN, 0}});
      pending.poll_set(fds);
      const auto first_session = fds.size();
      for (auto& s : sessions) {
        short events = POLLIN;
        {
          std::lock_guard<std::mutex> g{s.out->m};
          if (!s.out->bytes.empty()) events |= POLLOUT;
        }
        fds.push_back(pollfd{s.fd, events, 0});
      }
      const int n = ::poll(fds.data(), fds.size(), pending.timeout_ms());
      if (stopping) break;
      if (n < 0 && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (fds[1].revents) {
        char drain[64];
        while (::read(wake[0], drain, sizeof(drain)) > 0) {
        }
      }
      pending.advance(fds.data() + 2, first_session - 2);
      const auto polled = fds.size() - first_session;
      for (std::size_t i = 0; i < sessions.size(); ++i) {
        auto& s = sessions[i];
        bool overflow = false;
        {
          std::lock_guard<std::mutex> g{s.out->m};
          flush(*s.out);
          overflow = s.out->overflow;
        }
        if (overflow) {
          close(s, "its answers piled up unread");
          continue;
        }
        if (i < polled && fds[first_session + i].revents & (POLLIN | POLLHUP | POLLERR)) read(s);
      }
      std::erase_if(sessions, [](const session& s) { return s.fd < 0; });
      if (n > 0 && (fds[0].revents & POLLIN))
        for (int i = 0; i < 256; ++i) {  // at most 256 per round: handshakes keep moving
          const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
          if (fd >= 0) {
            // Answers to requests of several threads sharing a client leave
            // back to back: without this, one waits for the client's delayed
            // acknowledgement of the other (40 ms).
            tcp_set_no_delay(fd);
            pending.add(fd);
            continue;
          }
          if (errno == EINTR) continue;
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          break;
        }
    }
    for (auto& s : sessions) close(s, "");
    sessions.clear();
  }
};

store_gate::store_gate(const std::string& bind_address, std::uint16_t port, std::string token,
                       std::string served_by)
    : impl_(std::make_unique<impl>()) {
  impl_->token = std::move(token);
  served_by.resize(std::min<std::size_t>(served_by.size(), 255));
  impl_->welcome = std::string(1, '\1') + static_cast<char>(served_by.size()) + served_by;
  std::string why;
  impl_->listen_fd = gate_listen(bind_address, port, why);
  if (impl_->listen_fd < 0)
    throw error(errc::store, "tcp_store_server: cannot listen on " + bind_address + ":" +
                                 std::to_string(port) + ": " + why);
  impl_->port = tcp_local_port(impl_->listen_fd);
  pending_handshakes::defer_accept(impl_->listen_fd);
  if (::pipe2(impl_->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(impl_->listen_fd);
    throw error(errc::store, std::string("tcp_store_server: pipe: ") + std::strerror(errno));
  }
}

store_gate::~store_gate() {
  impl_->stopping = true;
  impl_->poke();
  if (impl_->loop.joinable()) impl_->loop.join();
  ::close(impl_->listen_fd);
  for (int fd : impl_->wake) ::close(fd);
}

void store_gate::start(caf::actor_system& sys, store_actor server) {
  impl_->sys = &sys;
  impl_->server = std::move(server);
  impl_->loop = std::thread([this] {
    try {
      impl_->run();
    } catch (const std::exception& e) {
      if (!impl_->stopping)
        std::fprintf(stderr, "[troupe store] the store stopped serving: %s\n", e.what());
    }
  });
}

std::uint16_t store_gate::port() const noexcept {
  return impl_->port;
}

std::uint64_t store_gate::refused() const noexcept {
  return impl_->refused.load();
}

std::size_t store_gate::connections() const noexcept {
  return impl_->open.load();
}

}  // namespace troupe::detail
