// pending_handshakes: strangers' handshakes, read by one poll loop
// (transport/pending_handshakes.hpp).

#include "transport/pending_handshakes.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/tcp_stream.hpp"

namespace troupe::detail {

pending_handshakes::pending_handshakes(make_decoder make, done_fn done, refused_fn refused,
                                       std::size_t max_pending, std::chrono::milliseconds deadline)
    : make_(std::move(make)),
      done_(std::move(done)),
      refused_(std::move(refused)),
      max_pending_(max_pending),
      deadline_(deadline) {
  pending_.reserve(max_pending_);
}

pending_handshakes::~pending_handshakes() {
  for (auto& e : pending_) ::close(e.fd);
}

void pending_handshakes::add(int fd) {
  auto peer = tcp_peer_name(fd);
  if (pending_.size() >= max_pending_) {
    ::close(fd);
    refused_(peer,
             "too many connections awaiting authentication (" + std::to_string(max_pending_) + ")");
    return;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  pending_.push_back(entry{fd, std::move(peer), clock::now() + deadline_, make_()});
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

void pending_handshakes::advance(const pollfd* fds, std::size_t n) {
  // The entries poll saw are the first n, in order (add() appends).
  for (std::size_t i = 0; i < n && i < pending_.size(); ++i)
    if (fds[i].revents != 0 && pending_[i].fd == fds[i].fd) read(pending_[i]);
  const auto now = clock::now();
  for (auto& e : pending_)
    if (e.fd >= 0 && now >= e.deadline)
      refuse(e, "no complete handshake within " + std::to_string(deadline_.count()) + " ms");
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](auto& e) { return e.fd < 0; }),
                 pending_.end());
}

int pending_handshakes::timeout_ms() const {
  if (pending_.empty()) return -1;
  auto first = pending_.front().deadline;
  for (const auto& e : pending_) first = std::min(first, e.deadline);
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(first - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 60000));
}

}  // namespace troupe::detail
