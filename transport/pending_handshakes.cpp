// pending_handshakes: strangers' handshakes, read by one poll loop
// (why and what: transport/pending_handshakes.hpp).

#include "transport/pending_handshakes.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/tcp_stream.hpp"

namespace troupe::detail {

namespace {

/// Seconds a silent connection stays with the kernel (TCP_DEFER_ACCEPT).
constexpr int defer_seconds = 2;

}  // namespace

pending_handshakes::limits pending_handshakes::default_limits() {
  limits l;
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY)
    l.max_pending = std::clamp<std::size_t>(files.rlim_cur / 8, 16, l.max_pending);
  return l;
}

void pending_handshakes::defer_accept(int listen_fd) {
#ifdef TCP_DEFER_ACCEPT
  int seconds = defer_seconds;
  ::setsockopt(listen_fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &seconds, sizeof(seconds));
#else
  (void)listen_fd;
#endif
}

pending_handshakes::pending_handshakes(make_decoder make, done_fn done, refused_fn refused,
                                       limits l)
    : make_(std::move(make)), done_(std::move(done)), refused_(std::move(refused)), limits_(l) {
  pending_.reserve(limits_.max_pending + 1);
}

pending_handshakes::~pending_handshakes() {
  for (auto& e : pending_) ::close(e.fd);
}

void pending_handshakes::add(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  entry e{fd, tcp_peer_name(fd), {}, clock::now(), false, make_()};
  e.source = e.peer.substr(0, e.peer.rfind(':'));
  if (!read(e)) return;  // a real client's handshake is usually all there
  if (pending_.size() >= limits_.max_pending) make_room();
  ++held_[e.source];
  pending_.push_back(std::move(e));
}

void pending_handshakes::make_room() {
  const auto most = std::max_element(held_.begin(), held_.end(), [](auto& a, auto& b) {
                      return a.second < b.second;
                    })->first;
  // Silent before heard, then the oldest (add() appends: the first found).
  auto victim = pending_.end();
  for (auto i = pending_.begin(); i != pending_.end(); ++i)
    if (i->source == most && (victim == pending_.end() || (victim->heard && !i->heard))) {
      victim = i;
      if (!i->heard) break;
    }
  if (victim == pending_.end()) return;  // cannot be: `most` holds one
  ++dropped_;
  refuse(*victim, std::string("dropped to make room for a newer connection (") +
                      std::to_string(limits_.max_pending) + " awaiting authentication, " +
                      std::to_string(held_[most]) + " from " + most + ")");
  sweep();
}

void pending_handshakes::sweep() {
  for (const auto& e : pending_)
    if (e.fd < 0) {
      auto h = held_.find(e.source);
      if (h != held_.end() && --h->second == 0) held_.erase(h);
    }
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](auto& e) { return e.fd < 0; }),
                 pending_.end());
}

void pending_handshakes::poll_set(std::vector<pollfd>& fds) const {
  for (const auto& e : pending_) fds.push_back(pollfd{e.fd, POLLIN, 0});
}

void pending_handshakes::refuse(entry& e, const std::string& why) {
  ::close(e.fd);
  e.fd = -1;
  refused_(e.peer, why);
}

bool pending_handshakes::read(entry& e) {
  char buf[4096];
  for (;;) {
    const auto want = std::min(e.decoder->wanted(), sizeof(buf));
    const auto k = ::recv(e.fd, buf, want, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (k == 0) {
      refuse(e, "closed before completing its handshake");
      return false;
    }
    if (k < 0) {
      refuse(e, std::string("connection broke during its handshake: ") + std::strerror(errno));
      return false;
    }
    e.heard = true;
    switch (e.decoder->take(buf, static_cast<std::size_t>(k))) {
      case handshake_decoder::status::more:
        continue;
      case handshake_decoder::status::bad:
        refuse(e, e.decoder->why());
        return false;
      case handshake_decoder::status::done: {
        const int fd = e.fd;
        e.fd = -1;
        done_(fd, e.peer, *e.decoder);
        return false;
      }
    }
  }
}

pending_handshakes::clock::time_point pending_handshakes::due(const entry& e) const {
  return e.accepted +
         (e.heard ? limits_.deadline : std::min(limits_.first_bytes, limits_.deadline));
}

void pending_handshakes::advance(const pollfd* fds, std::size_t n) {
  // The entries poll saw are the first n, in order (add() appends).
  for (std::size_t i = 0; i < n && i < pending_.size(); ++i)
    if (fds[i].revents != 0 && pending_[i].fd == fds[i].fd) read(pending_[i]);
  const auto now = clock::now();
  for (auto& e : pending_) {
    if (e.fd < 0 || now < due(e)) continue;
    refuse(e, e.heard ? "no complete handshake within " + std::to_string(limits_.deadline.count()) +
                            " ms"
                      : "sent nothing within " + std::to_string(limits_.first_bytes.count()) +
                            " ms of being accepted");
  }
  sweep();
}

int pending_handshakes::timeout_ms() const {
  if (pending_.empty()) return -1;
  auto first = due(pending_.front());
  for (const auto& e : pending_) first = std::min(first, due(e));
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(first - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 60000));
}

}  // namespace troupe::detail
