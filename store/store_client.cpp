// store_client: requests over the gate's wire, answers by a reader thread
// (store/store_client.hpp).

#include "store/store_client.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "store/gate_io.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

using ms = std::chrono::milliseconds;

namespace {

/// Longest deadline handed to the socket helpers (about ten years).
constexpr ms max_wait{315360000000};

gate_clock::time_point after(ms t) {
  return gate_clock::now() + std::clamp(t, ms(0), max_wait);
}

}  // namespace

store_client::store_client(std::string host, std::uint16_t port, std::string token,
                           std::chrono::milliseconds timeout)
    : where_(host + ":" + std::to_string(port)) {
  const auto deadline = after(timeout);
  std::string preamble = "TROUPES2";
  const auto n = static_cast<std::uint32_t>(token.size());
  for (int shift : {24, 16, 8, 0}) preamble.push_back(static_cast<char>((n >> shift) & 0xff));
  preamble += token;
  // One attempt on a connected socket: true once admitted (who serves read).
  auto admitted = [&](int fd, std::string& why) {
    // The gate answers a well-formed preamble as soon as it has read it.
    const auto answer = std::min(deadline, gate_clock::now() + ms(10000));
    if (!gate_write(fd, preamble.data(), preamble.size(), deadline)) {
      why = "the store at " + where_ + " closed the connection before the job token was sent";
      return false;
    }
    unsigned char ack = 0;
    // A store flooded by strangers may drop a connection to make room: it is tried again.
    if (auto r = gate_read(fd, &ack, 1, answer); !r.empty()) {
      why = "the store at " + where_ + " did not admit this process (" + r +
            " before answering its job token; is it a troupe store?)";
      return false;
    }
    if (ack != 1) {
      ::close(fd);
      throw error(errc::store, "tcp_store: the store at " + where_ +
                                   " refused this process's job token (TROUPE_JOB_TOKEN is "
                                   "not the one the store expects)");
    }
    unsigned char len = 0;
    auto r = gate_read(fd, &len, 1, answer);
    if (r.empty()) {
      served_by_.assign(len, '\0');
      r = gate_read(fd, served_by_.data(), served_by_.size(), answer);
    }
    if (!r.empty())
      why = "the store at " + where_ + " admitted this process but did not say who serves (" + r +
            ")";
    return r.empty();
  };
  std::string reason = "no attempt within the timeout";
  for (auto pause = ms(10); gate_clock::now() < deadline; pause = std::min(pause * 2, ms(200))) {
    std::string why;
    if (const int fd = gate_connect(host, port, deadline, why); fd >= 0) {
      if (admitted(fd, why)) {
        fd_ = fd;
        reader_ = std::thread([this] { read_loop(); });
        return;
      }
      ::close(fd);
    }
    reason = why;
    const auto left = std::chrono::duration_cast<ms>(deadline - gate_clock::now());
    std::this_thread::sleep_for(std::clamp(left, ms(0), pause));
  }
  throw error(errc::store, "tcp_store: cannot reach store at " + where_ + " within " +
                               std::to_string(timeout.count()) + " ms: " + reason);
}

store_client::~store_client() {
  const auto bye = encode_request(0, store_request{store_op::goodbye, {}, {}, 0, false});
  {
    std::lock_guard<std::mutex> g{write_mtx_};
    gate_write(fd_, bye.data(), bye.size(), gate_clock::now() + ms(100));
  }
  ::shutdown(fd_, SHUT_RDWR);
  reader_.join();
  ::close(fd_);
}

void store_client::lose(const std::string& why) {
  std::lock_guard<std::mutex> g{mtx_};
  if (lost_.empty()) lost_ = why;
  answered_.notify_all();
}

void store_client::read_loop() {
  store_message_reader reader;
  char buf[64 << 10];
  for (;;) {
    const auto k = ::recv(fd_, buf, sizeof(buf), 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return lose(k == 0 ? "the connection closed"
                         : std::string("the connection broke: ") + std::strerror(errno));
    for (std::size_t at = 0; at < static_cast<std::size_t>(k);) {
      at += reader.feed(buf + at, static_cast<std::size_t>(k) - at);
      if (reader.bad()) return lose("the store sent " + reader.why());
      if (!reader.ready()) continue;
      const auto body = reader.take();
      std::lock_guard<std::mutex> g{mtx_};
      auto i = open_.find(message_id(body));
      if (i == open_.end()) continue;  // its caller gave up
      std::string why;
      auto reply = decode_reply(body, i->second->op, why);
      if (!reply) {
        if (lost_.empty()) lost_ = "the store sent " + why;
        answered_.notify_all();
        return;
      }
      i->second->reply = std::move(*reply);
      i->second->done = true;
      open_.erase(i);
      answered_.notify_all();
    }
  }
}

store_client::outcome store_client::call(const store_request& r, std::chrono::milliseconds limit) {
  const auto deadline = after(limit);
  auto s = std::make_shared<slot>();
  s->op = r.op;
  std::uint64_t id = 0;
  {
    std::lock_guard<std::mutex> g{mtx_};
    if (!lost_.empty()) return {outcome::lost, {}, lost_};
    id = next_++;
    open_[id] = s;
  }
  const auto msg = encode_request(id, r);
  bool sent = false;
  {
    std::lock_guard<std::mutex> g{write_mtx_};
    sent = gate_write(fd_, msg.data(), msg.size(), deadline);
  }
  std::unique_lock<std::mutex> g{mtx_};
  if (!sent && lost_.empty()) {
    // A request cut off mid-way leaves the stream unusable: end it.
    ::shutdown(fd_, SHUT_RDWR);
    lost_ = gate_clock::now() >= deadline ? "a request could not be sent in time"
                                          : "the connection broke while sending";
  }
  answered_.wait_until(g, deadline, [&] { return s->done || !lost_.empty(); });
  open_.erase(id);
  if (s->done) return {outcome::answered, std::move(s->reply), {}};
  if (!lost_.empty()) return {outcome::lost, {}, lost_};
  return {outcome::timed_out, {}, {}};
}

}  // namespace troupe::detail
