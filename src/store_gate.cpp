// store_gate and store_forwarder: the token gate in front of the store's CAF
// endpoint (why: src/store_gate.hpp; sockets and threads: src/gate_io.hpp).
// Threads: one accepting per gate or forwarder, and two per admitted connection
// (one per direction, so that neither side can stall the other).

#include "src/store_gate.hpp"

#include <poll.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "src/gate_io.hpp"
#include "transport/tcp_stream.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

using ms = std::chrono::milliseconds;

namespace {

/// Compares without an early exit, so that timing does not reveal the token's content.
bool same_token(const char* given, std::size_t n, const std::string& expected) {
  if (expected.empty()) return false;
  unsigned diff = n != expected.size();
  for (std::size_t i = 0; i < n; ++i)
    diff |= static_cast<unsigned char>(given[i] ^ expected[i % expected.size()]);
  return diff == 0;
}

const std::string wrong_token = "wrong job token";

}  // namespace

// --- server side -------------------------------------------------------------

store_gate::store_gate(const std::string& bind_address, std::uint16_t port, std::string token)
    : token_(std::move(token)),
      refused_(std::make_shared<std::atomic<std::uint64_t>>(0)),
      workers_(std::make_unique<gate_workers>()) {
  std::string why;
  listen_fd_ = gate_listen(bind_address, port, why);
  if (listen_fd_ < 0)
    throw error(errc::store, "tcp_store_server: cannot listen on " + bind_address + ":" +
                                 std::to_string(port) + ": " + why);
  port_ = tcp_local_port(listen_fd_);
  workers_->add(listen_fd_);
}

store_gate::~store_gate() {
  workers_->stop();
  workers_->close(listen_fd_);
}

void store_gate::start(std::uint16_t inner_port) {
  inner_port_ = inner_port;
  workers_->spawn([this] { accept_loop(); });
}

void store_gate::accept_loop() {
  // Unauthenticated connections hold a thread for at most the handshake timeout; cap them.
  constexpr int max_pending = 64;
  gate_accept(
      *workers_, listen_fd_,
      [this](int fd) {
        if (pending_.fetch_add(1) < max_pending) return true;
        --pending_;
        refuse(tcp_peer_name(fd), "too many connections awaiting authentication");
        ::close(fd);
        return false;
      },
      [this](int fd) { admit(fd, tcp_peer_name(fd)); });
}

void store_gate::refuse(const std::string& peer, const std::string& why) {
  refused_->fetch_add(1);
  std::fprintf(stderr, "[troupe store] refused connection from %s: %s\n", peer.c_str(),
               why.c_str());
}

std::string store_gate::check_preamble(int fd) {
  const auto deadline = gate_clock::now() + gate_handshake_timeout;
  auto short_read = [](const std::string& why, const char* what) {
    if (why == "timed out")
      return std::string("no ") + what + " within " +
             std::to_string(gate_handshake_timeout.count()) + " ms";
    return why == "closed" ? std::string("closed before sending its ") + what : why;
  };
  char magic[sizeof(gate_magic)];
  if (auto why = gate_read(*workers_, fd, magic, sizeof(magic), deadline); !why.empty())
    return short_read(why, "preamble");
  if (std::memcmp(magic, gate_magic, sizeof(magic)) != 0)
    return "not a troupe store client (no TROUPES1 preamble)";
  unsigned char len_be[4];
  if (auto why = gate_read(*workers_, fd, len_be, sizeof(len_be), deadline); !why.empty())
    return short_read(why, "token length");
  const std::uint32_t len = (std::uint32_t{len_be[0]} << 24) | (std::uint32_t{len_be[1]} << 16) |
                            (std::uint32_t{len_be[2]} << 8) | len_be[3];
  if (len == 0 || len > gate_max_token)
    return "announced a token of " + std::to_string(len) + " bytes (1.." +
           std::to_string(gate_max_token) + " allowed)";
  std::array<char, gate_max_token> given;
  if (auto why = gate_read(*workers_, fd, given.data(), len, deadline); !why.empty())
    return short_read(why, "token");
  return same_token(given.data(), len, token_) ? "" : wrong_token;
}

void store_gate::admit(int fd, const std::string& peer) {
  auto why = check_preamble(fd);
  --pending_;
  if (!why.empty()) {
    refuse(peer, why);                                // logged and counted before the client learns
    if (why == wrong_token) gate_write(fd, "\0", 1);  // a well-formed preamble is answered
    workers_->close(fd);
    return;
  }
  int inner = gate_connect(*workers_, "127.0.0.1", inner_port_,
                           gate_clock::now() + gate_handshake_timeout, why);
  if (inner < 0) {
    if (!workers_->stopping())
      std::fprintf(stderr, "[troupe store] cannot reach the store's endpoint for %s: %s\n",
                   peer.c_str(), why.c_str());
    workers_->close(fd);
    return;
  }
  if (gate_write(fd, "\1", 1)) gate_splice(fd, inner);
  workers_->close(inner);
  workers_->close(fd);
}

// --- client side -------------------------------------------------------------

struct store_forwarder::failure {
  std::mutex m;
  std::string why;
};

store_forwarder::store_forwarder(std::string host, std::uint16_t port, std::string token,
                                 std::chrono::milliseconds connect_timeout)
    : host_(std::move(host)),
      remote_port_(port),
      token_(std::move(token)),
      connect_timeout_(std::clamp(connect_timeout, ms(1), ms(std::chrono::hours(24 * 365)))),
      workers_(std::make_unique<gate_workers>()),
      failure_(std::make_unique<failure>()) {
  if (token_.empty() || token_.size() > gate_max_token)
    throw error(errc::invalid_argument, "tcp_store: the job token must have 1.." +
                                            std::to_string(gate_max_token) + " bytes, not " +
                                            std::to_string(token_.size()));
  std::string why;
  listen_fd_ = gate_listen("127.0.0.1", 0, why);
  if (listen_fd_ < 0)
    throw error(errc::store,
                "tcp_store: cannot listen on 127.0.0.1 for the store connection: " + why);
  port_ = tcp_local_port(listen_fd_);
  workers_->add(listen_fd_);
  workers_->spawn([this] { accept_loop(); });
}

store_forwarder::~store_forwarder() {
  workers_->stop();
  workers_->close(listen_fd_);
}

std::string store_forwarder::take_failure() {
  std::lock_guard lock(failure_->m);
  return std::exchange(failure_->why, std::string());
}

void store_forwarder::fail(std::string why) {
  std::lock_guard lock(failure_->m);
  failure_->why = std::move(why);
}

void store_forwarder::accept_loop() {
  gate_accept(
      *workers_, listen_fd_,
      [](int fd) {
        if (gate_peer_is_this_process(fd)) return true;
        ::close(fd);  // someone else on this host: never hand them our token's connection
        return false;
      },
      [this](int fd) { carry(fd); });
}

void store_forwarder::carry(int local) {
  std::string why;
  const std::string where = host_ + ":" + std::to_string(remote_port_);
  int up = gate_connect(*workers_, host_, remote_port_, gate_clock::now() + connect_timeout_, why);
  if (up < 0) {
    fail(why);
    workers_->close(local);
    return;
  }
  std::string preamble(gate_magic, sizeof(gate_magic));
  const auto n = static_cast<std::uint32_t>(token_.size());
  for (int shift : {24, 16, 8, 0}) preamble.push_back(static_cast<char>((n >> shift) & 0xff));
  preamble += token_;
  char ack = 0;
  if (!gate_write(up, preamble.data(), preamble.size())) {
    fail("the store at " + where + " closed the connection before the job token was sent");
  } else if (auto r =
                 gate_read(*workers_, up, &ack, 1, gate_clock::now() + 2 * gate_handshake_timeout);
             !r.empty()) {
    fail("the store at " + where + " did not admit this process (" + r +
         " before answering its job token; is it a troupe store?)");
  } else if (ack != 1) {
    token_refused_ = true;
    fail("the store at " + where + " refused this process's job token");
  } else {
    gate_splice(local, up);
  }
  workers_->close(up);
  workers_->close(local);
}

}  // namespace troupe::detail
