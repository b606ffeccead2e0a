#pragma once
// pending_handshakes — accepted connections whose peers have not completed
// their handshake yet, driven by the poll loop of the one thread that accepts
// them. Used by the data plane (transport/data_plane_accept.cpp) and the
// store gate (store/store_gate.cpp).
//
// A process without the job's token must not keep the job from starting,
// however many connections it opens and holds, at whatever rate. What a
// stranger can take is bounded; what a real client needs is never refused:
//  - the kernel hands a connection over only once it has sent something
//    (TCP_DEFER_ACCEPT, defer_accept()): a real client sends its handshake
//    at once, an idle stranger never reaches this process while it is silent;
//  - an accepted connection is read at once: a real client's handshake,
//    one small segment, is usually complete before it was ever pending;
//  - no thread per stranger, and a cap on how many may be pending at once;
//    when the cap is reached the newcomer is not refused (a real client
//    would then wait for the strangers' deadlines): the oldest pending
//    connection of the source that holds the most is dropped instead,
//    silent ones first (as OpenSSH's MaxStartups drops early, and per
//    source, so that one address cannot crowd out the others);
//  - a connection that has sent nothing gets a short deadline for its first
//    bytes, and one deadline covers the whole handshake from the accept (a
//    peer sending a byte a second gains nothing).
// The store's client tries again within its timeout when its connection
// was dropped before it was answered (store/store_client.cpp); a rank's
// data-plane connect does not, and relies on its hello being read at once.
//
// For connections within one host a Unix socket would tell the peer's pid
// and uid (SO_PEERCRED), but a stranger of the same user passes that test,
// so it would bound nothing more than the token does.

#include <poll.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/handshake.hpp"

namespace troupe::detail {

class pending_handshakes {
 public:
  using clock = std::chrono::steady_clock;

  /// What strangers may take of one listening port.
  struct limits {
    /// Connections pending at once: 256, fewer when this process may open
    /// few descriptors (an eighth of RLIMIT_NOFILE, at least 16).
    std::size_t max_pending = 256;
    /// How long an accepted connection may stay silent.
    std::chrono::milliseconds first_bytes{500};
    /// How long the whole handshake may take from the accept.
    std::chrono::milliseconds deadline{2000};
  };
  /// The limits above, max_pending from this process's descriptor limit.
  static limits default_limits();

  /// Asks the kernel to hand connections of `listen_fd` to accept() only once
  /// they have sent data (TCP_DEFER_ACCEPT, Linux; elsewhere nothing). A
  /// connection silent that long is handed over anyway and meets first_bytes.
  static void defer_accept(int listen_fd);

  using make_decoder = std::function<std::unique_ptr<handshake_decoder>()>;
  /// A complete handshake: the socket (non-blocking, now the callee's), the
  /// peer's address and the decoder holding what it said.
  using done_fn = std::function<void(int fd, const std::string& peer, handshake_decoder& d)>;
  /// A refused or dropped connection (already closed): the peer's address and why.
  using refused_fn = std::function<void(const std::string& peer, const std::string& why)>;

  pending_handshakes(make_decoder make, done_fn done, refused_fn refused,
                     limits l = default_limits());
  /// Closes every connection still pending.
  ~pending_handshakes();
  pending_handshakes(const pending_handshakes&) = delete;
  pending_handshakes& operator=(const pending_handshakes&) = delete;

  /// Takes a freshly accepted socket (made non-blocking here) and reads what
  /// it sent; when it is still pending and max_pending are pending already,
  /// drops another one to make room (see above).
  void add(int fd);
  /// Appends one entry per pending connection to `fds`, in a fixed order.
  void poll_set(std::vector<pollfd>& fds) const;
  /// After poll(): reads what the `n` connections of `fds` (as poll_set
  /// wrote them) have, then refuses every connection past a deadline.
  void advance(const pollfd* fds, std::size_t n);
  /// Milliseconds until the earliest deadline (-1 when none is pending).
  int timeout_ms() const;
  std::size_t size() const noexcept { return pending_.size(); }
  /// Connections dropped so far to make room for newer ones.
  std::size_t dropped() const noexcept { return dropped_; }

 private:
  struct entry {
    int fd;
    std::string peer;    // address:port
    std::string source;  // address
    clock::time_point accepted;
    bool heard = false;  // it sent at least one byte
    std::unique_ptr<handshake_decoder> decoder;
  };
  /// Reads what `e` has; false once it left (done or refused).
  bool read(entry& e);
  void refuse(entry& e, const std::string& why);
  /// When `e` must have finished what it is at (its first bytes or its handshake).
  clock::time_point due(const entry& e) const;
  /// Drops one pending connection: the oldest of the source holding the most, silent first.
  void make_room();
  /// Removes the entries that left (fd < 0), keeping the others' order.
  void sweep();

  make_decoder make_;
  done_fn done_;
  refused_fn refused_;
  limits limits_;
  std::vector<entry> pending_;
  std::unordered_map<std::string, std::size_t> held_;  // pending connections per source
  std::size_t dropped_ = 0;
};

}  // namespace troupe::detail
