#pragma once
// frame — the wire format of the data plane between processes.
//
// A frame carries one envelope (collective data for the group actor, or for
// the group's inline engine: kind 3) or p2p_envelope (point to point: kind 1
// for a message, kind 4 for what a loan needs said, its p2p_envelope kind
// in `code`: the loan's 48 bytes as payload when lent, else its number in
// `seq` and, when returned untaken, why as text) for `group` in the
// receiving process:
//   header (fixed 48 bytes) | group name (name_len bytes)
//   | the sender's call fingerprint (fp_bytes; base/agreement.hpp) | payload (payload_bytes)
// Every field is checked on receipt; a malformed frame closes the connection.
// The reader trusts nothing a frame announces: its header is checked alone
// (kind, op code, dtype, name length, and a payload no larger than this
// host's memory), then the receiver admits the frame once its group name is
// known (transport/data_plane.cpp: the sender's rank, the group's members),
// and only then is its payload allocated. A goodbye (kind 2) carries in
// `src` the world rank whose failure made the sender leave, or -1.

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/call.hpp"

namespace troupe::detail {

inline constexpr std::uint32_t frame_magic = 0x46505254;  // "TRPF"
inline constexpr std::size_t max_group_name = 1024;
/// The longest fingerprint a frame may carry (alltoall splits of 4096 ranks).
inline constexpr std::size_t max_fingerprint = 32 + 16 * 4096;

/// What one peer in another process may have waiting in one group of this
/// rank (the inline engine's inbox, the group actor's early messages): at most this
/// many messages not yet taken, and at most this many payload bytes for
/// operations after the next one this rank runs. A peer over either bound is
/// failed (its connection dropped, naming it): a rank cannot hold without
/// limit what a peer sends ahead.
inline constexpr std::size_t max_waiting_messages = 65536;
inline constexpr std::uint64_t max_early_bytes = std::uint64_t{1} << 30;

struct frame_header {
  std::uint32_t magic = frame_magic;
  std::uint8_t kind = 0;  ///< 0: collective, 1: p2p, 2: goodbye, 3: inline, 4: loan, 5: heartbeat
  std::uint8_t code = 0;  ///< op_code (collective)
  std::uint8_t dtype = 0;
  std::uint8_t has_payload = 0;  ///< 0 for an undefined payload tensor (barriers)
  std::uint16_t name_len = 0;
  std::uint16_t reserved = 0;
  std::int32_t src = 0;  ///< group rank of the sender (goodbye: the world rank it blames, or -1)
                         ///< (a goodbye's code: how that rank failed, a failure_kind)
  std::int32_t tag = 0;  ///< p2p tag
  std::uint32_t step = 0;
  std::uint32_t fp_bytes = 0;  ///< the serialized call fingerprint after the name (0: none)
  std::uint64_t seq = 0;
  std::uint64_t payload_bytes = 0;
};
static_assert(sizeof(frame_header) == 48);

/// A byte stream in one direction (TCP socket or shared-memory ring).
class byte_stream {
 public:
  virtual ~byte_stream() = default;
  /// Writes all `n` bytes; false when the stream is closed or broken.
  virtual bool write(const void* data, std::size_t n) = 0;
  /// Reads exactly `n` bytes; false at end of stream or error.
  virtual bool read(void* data, std::size_t n) = 0;
  /// Unblocks readers and writers; later calls fail.
  virtual void close() = 0;
  /// Whether a write is a copy into memory the reader maps (no system call
  /// per write): a frame's payload then goes in from where it is, not
  /// assembled behind its header first (a second copy of it).
  virtual bool writes_by_copy() const noexcept { return false; }
};

inline constexpr std::uint8_t frame_collective = 0, frame_p2p = 1, frame_goodbye = 2,
                              frame_inline = 3, frame_loan = 4, frame_heartbeat = 5;

/// How the rank a goodbye blames failed (the goodbye's `code`), so that a
/// rank hearing the goodbye first names the cause as the one that judged it.
enum class failure_kind : std::uint8_t { failed = 0, died = 1, unresponsive = 2, dropped = 3 };
/// "failed", "died or broke its connection", "was found unresponsive", ...
const char* failure_words(failure_kind kind);
/// The most text a loan's refusal carries (frame_loan, p2p_envelope::returned).
inline constexpr std::size_t max_loan_text = 4096;

/// Writes one frame (header, group name, payload) to `out`; `kind` is
/// frame_collective or frame_inline. Small frames go out in one write.
bool write_frame(byte_stream& out, const std::string& group, const envelope& env,
                 std::uint8_t kind = frame_collective);
bool write_frame(byte_stream& out, const std::string& group, const p2p_envelope& env);

/// The p2p_envelope a loan frame (frame_loan) carries; "" when it is sound,
/// else what is wrong with it (the sender broke the rules).
struct received_frame;
std::string read_loan(const received_frame& f, p2p_envelope& env);
/// Group rank `src`'s answer to loan `id`: taken (`why` empty), or why not
/// (at most max_loan_text bytes of it); `kind` helped: the lender's answer
/// to a request for help with it.
p2p_envelope loan_answer(std::int32_t src, std::uint64_t id, const std::string& why,
                         p2p_envelope::kind_t kind = p2p_envelope::returned);
/// Why a returned loan was not taken, or why a lender did not help ("": it was, it did).
std::string loan_refusal(const p2p_envelope& answer);

/// Writes a heartbeat: a header alone, that says the writer's process runs
/// (transport/data_plane_heartbeat.cpp).
bool write_heartbeat(byte_stream& out);

/// Writes the last frame of a rank that leaves on purpose (its world ends);
/// `cause`: the world rank whose failure made it leave, or -1.
bool write_goodbye(byte_stream& out, std::int32_t cause = -1,
                   failure_kind kind = failure_kind::failed);

/// Why a frame from world rank `peer` for `group`, whose group ranks are the
/// world ranks `members`, is refused ("": it is not): the sender must be a
/// member, and the frame's src its own group rank.
std::string check_sender(const frame_header& h, const std::string& group,
                         const std::vector<int>& members, int peer);

/// The largest payload a frame may announce: this host's physical memory
/// (no receiver could hold more). Larger announcements are malformed frames.
std::uint64_t max_frame_payload() noexcept;

/// A received frame.
struct received_frame {
  frame_header header;
  std::string group;
  tensor payload;
  fingerprint_ptr fp;  ///< what the sender called (its first message of a call carries it)
};

/// A receive posted in advance: a payload of exactly `into`'s bytes and dtype
/// is read straight into `into` instead of a fresh tensor (the receiver then
/// copies nothing). The reader writes there only while it holds
/// `guard->mtx` and `guard->revoked` is false; the poster sets `revoked`
/// (under the mutex) when it no longer wants the bytes, and the rest of the
/// payload goes to a fresh tensor.
struct receive_guard {
  std::mutex mtx;
  bool revoked = false;
};
struct posted_receive {
  tensor into;  ///< undefined: nothing posted
  std::shared_ptr<receive_guard> guard;
};
/// Where a frame's payload goes (asked once its header and group name are
/// read), or nothing posted.
using place_fn = std::function<posted_receive(const frame_header&, const std::string& group)>;
/// Whether the receiver takes a frame whose header and group name were read,
/// asked before its payload is allocated: "" to take it, else why the frame
/// is refused (the connection is then over). Setting `skip` takes it without
/// keeping it: its payload is read into nothing and the frame never handed
/// on (a frame for a group that no longer exists here).
using admit_fn =
    std::function<std::string(const frame_header&, const std::string& group, bool& skip)>;

/// Reads frames piece by piece from a socket without blocking, for whichever
/// thread holds the socket at the moment (the data plane's reader thread, or
/// a thread waiting for an inline operation that reads the socket itself).
class frame_reader {
 public:
  /// Reads what `fd` has now; `on_frame` gets each complete frame (and
  /// returns false to stop early, after a goodbye). Returns "" when the
  /// socket has nothing more for now, else why the connection is over
  /// ("connection closed", a malformed frame, "stopped").
  /// `place`, when set, is asked where point-to-point payloads and others
  /// above 16 KiB go; `admit`, when set, whether to take each frame.
  std::string drain(int fd, const std::function<bool(received_frame&)>& on_frame,
                    const place_fn& place = {}, const admit_fn& admit = {});
  /// The same over any source: `read_some(p, n)` copies up to n bytes that
  /// are there now and returns the count, 0 when nothing is there, -1 at the
  /// end of the stream.
  std::string drain(const std::function<long(void*, std::size_t)>& read_some,
                    const std::function<bool(received_frame&)>& on_frame,
                    const place_fn& place = {}, const admit_fn& admit = {});
  /// Bytes read so far (the peer's liveness: a frame in progress counts).
  std::uint64_t bytes_read() const noexcept { return bytes_read_; }

 private:
  /// Reads the next bytes of a payload that goes where it was posted, or,
  /// once revoked, into a fresh tensor.
  long read_posted(const std::function<long(void*, std::size_t)>& read_some);

  /// A socket's next bytes, read ahead: a small frame's pieces (header,
  /// group name, fingerprint, payload) come from one recv instead of one
  /// each. Allocated at the first read of a socket; empty whenever drain
  /// returned "" (it reads until the socket has nothing more).
  struct read_ahead {
    static constexpr std::size_t capacity = 4096;
    std::unique_ptr<char[]> bytes;
    std::size_t at = 0, end = 0;
  };
  read_ahead ahead_;
  enum class piece { header, name, fingerprint, payload } at_ = piece::header;
  std::size_t got_ = 0;
  received_frame f_;
  std::string fp_;                        // the fingerprint's bytes as they arrive
  std::shared_ptr<receive_guard> guard_;  // the payload is read into a posted tensor
  bool skip_ = false;                     // the payload is read into nothing
  std::uint64_t bytes_read_ = 0;
};

}  // namespace troupe::detail
