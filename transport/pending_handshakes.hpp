#pragma once
// pending_handshakes — accepted connections whose peers have not completed
// their handshake yet, driven by the poll loop of the one thread that accepts
// them: no thread per stranger, a cap on how many may be pending at once
// (more are refused at once), and one deadline for the whole handshake from
// the moment of accept (a peer sending a byte a second gains nothing).
// Used by the data plane (transport/data_plane_accept.cpp) and the store
// gate (store/store_gate.cpp).

#include <poll.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/handshake.hpp"

namespace troupe::detail {

class pending_handshakes {
 public:
  using clock = std::chrono::steady_clock;
  /// The default limits: the store gate's measured ones.
  static constexpr std::size_t default_max_pending = 64;
  static constexpr std::chrono::milliseconds default_deadline{5000};

  using make_decoder = std::function<std::unique_ptr<handshake_decoder>()>;
  /// A complete handshake: the socket (non-blocking, now the callee's), the
  /// peer's address and the decoder holding what it said.
  using done_fn = std::function<void(int fd, const std::string& peer, handshake_decoder& d)>;
  /// A refused connection (already closed): the peer's address and why.
  using refused_fn = std::function<void(const std::string& peer, const std::string& why)>;

  pending_handshakes(make_decoder make, done_fn done, refused_fn refused,
                     std::size_t max_pending = default_max_pending,
                     std::chrono::milliseconds deadline = default_deadline);
  /// Closes every connection still pending.
  ~pending_handshakes();
  pending_handshakes(const pending_handshakes&) = delete;
  pending_handshakes& operator=(const pending_handshakes&) = delete;

  /// Takes a freshly accepted socket (made non-blocking here); when
  /// max_pending are pending already it is refused and closed.
  void add(int fd);
  /// Appends one entry per pending connection to `fds`, in a fixed order.
  void poll_set(std::vector<pollfd>& fds) const;
  /// After poll(): reads what the `n` connections of `fds` (as poll_set
  /// wrote them) have, then refuses every connection past its deadline.
  void advance(const pollfd* fds, std::size_t n);
  /// Milliseconds until the earliest deadline (-1 when none is pending).
  int timeout_ms() const;
  std::size_t size() const noexcept { return pending_.size(); }

 private:
  struct entry {
    int fd;
    std::string peer;
    clock::time_point deadline;
    std::unique_ptr<handshake_decoder> decoder;
  };
  /// Reads what `e` has; false once it left (done or refused).
  bool read(entry& e);
  void refuse(entry& e, const std::string& why);

  make_decoder make_;
  done_fn done_;
  refused_fn refused_;
  std::size_t max_pending_;
  std::chrono::milliseconds deadline_;
  std::vector<entry> pending_;
};

}  // namespace troupe::detail
