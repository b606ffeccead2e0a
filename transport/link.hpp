#pragma once
// link — the one interface a transport implements, and where transports are
// registered.
//
// Every pair of ranks in different processes keeps a TCP connection (the
// data plane's): it carries the handshake, tells when the peer is gone, and
// carries the frames where no other link joins the pair. A transport may
// join a pair instead, one direction at a time: the writer opens its side of
// a link before the handshake and names it in its hello; the reader opens
// its side from that address (or refuses, and the frames come over TCP).
// Frames then flow writer -> link -> reader (transport/frame.hpp says what
// they hold; the data plane writes and reads them, never a transport).
//
// A new transport is a file implementing link_out and link_in plus a
// transport_kind, and one line in transport/links.cpp (or, in a program or
// test, one register_transport() call before its first world starts).
// TROUPE_TRANSPORT names the transport a job uses: "auto" (the default, the
// first registered transport that serves the pair), "tcp" (none: every frame
// over TCP), or a transport's name (that one where it serves the pair).

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "transport/frame.hpp"

namespace troupe::detail {

/// The two ends of a link, as the data plane knows them.
struct link_pair {
  int writer = -1;         ///< world rank writing the frames
  int reader = -1;         ///< world rank reading them
  bool same_host = false;  ///< the two processes share a host
  int writer_pid = 0;      ///< (on the reader's side) the writer's process
};

/// The writer's side of a link.
class link_out : public byte_stream {
 public:
  /// What the reader needs to open its side (travels in the hello, at most
  /// 200 bytes).
  virtual std::string address() const = 0;
  /// The reader opened its side (the handshake's answer said so).
  virtual void opened() {}
  /// Bytes write() could take now without waiting.
  virtual std::size_t writable() const { return 0; }
  /// write(), giving up at `deadline` while the reader takes nothing (false,
  /// as when the link is closed: a frame half written leaves the link
  /// useless unless the rest follows, and the data plane closes it; where
  /// `written` is given, how many bytes went). A transport whose writes can
  /// wait for room overrides it; the default waits as write() does.
  virtual bool write_until(const void* data, std::size_t n,
                           std::chrono::steady_clock::time_point /*deadline*/,
                           std::size_t* written = nullptr) {
    const bool ok = write(data, n);
    if (written) *written = ok ? n : 0;
    return ok;
  }
  /// A link reads nothing on this side.
  bool read(void*, std::size_t) override { return false; }
};

/// The reader's side of a link.
class link_in {
 public:
  virtual ~link_in() = default;
  /// Copies up to `n` bytes that are there now, without waiting: the count,
  /// 0 when none are there, -1 when none are and the link is closed.
  virtual long read_some(void* data, std::size_t n) = 0;
  /// After a batch of frames was read: the room they took may be reused.
  virtual void publish_read() {}
  /// Whether bytes are there to read now.
  virtual bool readable() const = 0;
  /// Waits until bytes are there (true) or the link is closed and empty or
  /// `max` passed (false when closed); it may look for bytes for up to
  /// `linger` before it sleeps.
  virtual bool wait_readable(std::chrono::milliseconds max, std::chrono::microseconds linger) = 0;
  /// A thread of the reading process starts (+1) or stops (-1) reading the
  /// link itself while the reader thread sleeps; true when the last one
  /// stopped while bytes wait that nobody woke the reader thread for.
  virtual bool polling(int /*delta*/) { return false; }
  /// Wakes the reader thread if it sleeps.
  virtual void wake_reader() {}
  /// Unblocks a waiting reader; later reads return -1.
  virtual void close() = 0;
};

/// A transport: how to make both sides of its links.
struct transport_kind {
  /// The name TROUPE_TRANSPORT gives it (letters, digits, '_').
  std::string name;
  /// Whether its links can join this pair (e.g. the same host).
  bool (*serves)(const link_pair& pair) = nullptr;
  /// The writer's side (throws troupe::error when it cannot).
  std::unique_ptr<link_out> (*open_out)(const link_pair& pair) = nullptr;
  /// The reader's side from the writer's address (throws troupe::error
  /// when it cannot or the address is not one of its links: the writer then
  /// writes over TCP).
  std::unique_ptr<link_in> (*open_in)(const std::string& address, const link_pair& pair) = nullptr;
  /// Its links are memory both processes map: a reader that cannot open one
  /// tells that the two processes cannot map each other's memory (no loans,
  /// no shared segment between them either).
  bool maps_memory = false;
};

/// Adds a transport after those registered so far (a name taken already
/// replaces that transport). Call it before the first world starts.
void register_transport(transport_kind kind);
/// The transport TROUPE_TRANSPORT (`setting`) chooses for `pair`, or null
/// (TCP): "auto", the first registered that serves it; "tcp", none; a name,
/// that transport if it serves the pair. Throws errc::invalid_argument for a
/// name no transport has.
const transport_kind* transport_for(const std::string& setting, const link_pair& pair);
/// The registered transport named `name`, or null.
const transport_kind* find_transport(const std::string& name);

/// The built-in transports (transport/links.cpp registers them first).
transport_kind shm_ring_transport();

}  // namespace troupe::detail
