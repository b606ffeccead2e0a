#include "transport/frame.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "base/agreement.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {
namespace {

/// Up to this size a frame is assembled and written at once (one system call,
/// one TCP segment); larger payloads, and into a ring those past
/// ring_assembled, are written from where they are.
constexpr std::size_t small_frame = 16 << 10;
/// Into a ring (a write is a copy) up to this size: past it, the payload's
/// copy into the assembly buffer costs more than a second write to the ring.
constexpr std::size_t ring_assembled = 512;

bool write_common(byte_stream& out, frame_header& h, const std::string& group,
                  const tensor& payload, const fingerprint_ptr& fp = nullptr) {
  const auto fp_bytes = fp ? fp->serialize() : std::string{};
  h.name_len = static_cast<std::uint16_t>(group.size());
  h.fp_bytes = static_cast<std::uint32_t>(fp_bytes.size());
  h.has_payload = payload.defined() ? 1 : 0;
  h.dtype = static_cast<std::uint8_t>(payload.defined() ? payload.scalar_type() : dtype::uint8);
  h.payload_bytes = payload.defined() ? payload.nbytes() : 0;
  // Each thread assembles its frames in one buffer, kept between frames
  // and filled by plain copies (std::string's appends would cost a small
  // point-to-point frame 175 instructions of its 400).
  thread_local std::vector<char> buf;
  const bool whole = h.payload_bytes <= (out.writes_by_copy() ? ring_assembled : small_frame);
  const std::size_t head = sizeof(h) + group.size() + fp_bytes.size();
  const std::size_t n = head + (whole ? h.payload_bytes : 0);
  if (buf.size() < n || buf.size() > 4 * small_frame + n) {
    buf.clear();  // no copy of the old bytes; shrinks after a large fingerprint
    buf.shrink_to_fit();
    buf.resize(std::max(n, small_frame + 256));
  }
  char* at = buf.data();
  std::memcpy(at, &h, sizeof(h));
  at += sizeof(h);
  std::memcpy(at, group.data(), group.size());
  at += group.size();
  if (!fp_bytes.empty()) std::memcpy(at, fp_bytes.data(), fp_bytes.size());
  at += fp_bytes.size();
  if (whole) {
    if (h.payload_bytes) std::memcpy(at, payload.data(), h.payload_bytes);
    return out.write(buf.data(), n);
  }
  return out.write(buf.data(), n) &&
         (h.payload_bytes == 0 || out.write(payload.data(), h.payload_bytes));
}

/// Why a header is malformed (empty: it is not).
std::string check_header(const frame_header& h) {
  if (h.magic != frame_magic) return "bad frame magic";
  if (h.kind == frame_goodbye || h.kind == frame_heartbeat)
    return h.name_len == 0 && h.payload_bytes == 0 && h.fp_bytes == 0
               ? std::string()
               : "a goodbye or heartbeat with a body";
  if (h.kind > frame_loan) return "bad frame kind " + std::to_string(h.kind);
  if (h.kind == frame_loan) {
    // Lent and help: exactly a loan's bytes; the others: at most a text.
    const bool lent = h.code == p2p_envelope::lent || h.code == p2p_envelope::help;
    if (h.code < p2p_envelope::lent || h.code > p2p_envelope::helped ||
        h.dtype != static_cast<std::uint8_t>(dtype::uint8) ||
        (lent ? !h.has_payload || h.payload_bytes != sizeof(p2p_loan)
              : h.payload_bytes > max_loan_text))
      return "a bad loan frame (kind " + std::to_string(h.code) + ", " +
             std::to_string(h.payload_bytes) + " bytes)";
  }
  if (h.payload_bytes > max_frame_payload())
    return "a frame announcing " + std::to_string(h.payload_bytes) +
           " bytes of payload, more than this host's memory (" +
           std::to_string(max_frame_payload()) + " bytes)";
  if ((h.kind == frame_collective || h.kind == frame_inline) &&
      h.code > static_cast<std::uint8_t>(op_code::monitored_barrier))
    return "bad op code " + std::to_string(h.code);
  if (h.dtype >= dtype_count) return "bad dtype " + std::to_string(h.dtype);
  if (h.name_len == 0 || h.name_len > max_group_name)
    return "bad group name length " + std::to_string(h.name_len);
  if (h.fp_bytes > max_fingerprint ||
      (h.fp_bytes != 0 && (h.kind == frame_p2p || h.kind == frame_loan)))
    return "bad fingerprint size " + std::to_string(h.fp_bytes);
  const auto elem = element_size(static_cast<dtype>(h.dtype));
  if (h.payload_bytes % elem != 0 || (!h.has_payload && h.payload_bytes != 0))
    return "bad payload size " + std::to_string(h.payload_bytes);
  return {};
}

/// The (empty) payload tensor a header announces.
tensor payload_for(const frame_header& h) {
  if (!h.has_payload) return {};
  const auto elem = element_size(static_cast<dtype>(h.dtype));
  return tensor::empty({static_cast<std::int64_t>(h.payload_bytes / elem)},
                       static_cast<dtype>(h.dtype));
}

}  // namespace

bool write_frame(byte_stream& out, const std::string& group, const envelope& env,
                 std::uint8_t kind) {
  frame_header h;
  h.kind = kind;
  h.code = static_cast<std::uint8_t>(env.code);
  h.src = env.src;
  h.step = env.step;
  h.seq = env.seq;
  return write_common(out, h, group, env.payload, env.fp);
}

bool write_frame(byte_stream& out, const std::string& group, const p2p_envelope& env) {
  frame_header h;
  h.kind = env.kind == p2p_envelope::message ? frame_p2p : frame_loan;
  h.code = env.kind;
  h.src = env.src;
  h.tag = env.tag;
  if (env.kind != p2p_envelope::lent && env.kind != p2p_envelope::help) {
    h.seq = env.loan.id;
    return write_common(out, h, group, env.payload);
  }
  auto loan = tensor::empty({static_cast<std::int64_t>(sizeof(p2p_loan))}, dtype::uint8);
  std::memcpy(loan.data(), &env.loan, sizeof(p2p_loan));
  return write_common(out, h, group, loan);
}

std::string read_loan(const received_frame& f, p2p_envelope& env) {
  const auto& h = f.header;
  env = p2p_envelope{h.src, h.tag, {}, static_cast<p2p_envelope::kind_t>(h.code)};
  if (env.kind != p2p_envelope::lent && env.kind != p2p_envelope::help) {
    env.loan.id = h.seq;
    env.payload = f.payload;
    return {};
  }
  std::memcpy(&env.loan, f.payload.data(), sizeof(p2p_loan));
  const auto& l = env.loan;
  if (l.dtype >= dtype_count) return "a loan of dtype " + std::to_string(l.dtype);
  if (env.kind == p2p_envelope::help && l.nbytes == 0) return "a request to copy 0 bytes";
  if (l.nbytes % element_size(static_cast<dtype>(l.dtype)) != 0 || l.share_size == 0 ||
      l.share_offset > l.share_size || l.nbytes > l.share_size - l.share_offset || l.share_fd < 0)
    return "a loan of " + std::to_string(l.nbytes) + " bytes at " + std::to_string(l.share_offset) +
           " of a buffer of " + std::to_string(l.share_size) + " bytes (fd " +
           std::to_string(l.share_fd) + ")";
  return {};
}

p2p_envelope loan_answer(std::int32_t src, std::uint64_t id, const std::string& why,
                         p2p_envelope::kind_t kind) {
  p2p_envelope env{src, 0, {}, kind};
  env.loan.id = id;
  if (!why.empty()) {
    const auto n = std::min(why.size(), max_loan_text);
    env.payload = tensor::empty({static_cast<std::int64_t>(n)}, dtype::uint8);
    std::memcpy(env.payload.data(), why.data(), n);
  }
  return env;
}

std::string loan_refusal(const p2p_envelope& answer) {
  if (!answer.payload.defined()) return {};
  return {static_cast<const char*>(answer.payload.data()),
          static_cast<std::size_t>(answer.payload.nbytes())};
}

bool write_heartbeat(byte_stream& out) {
  frame_header h;
  h.kind = frame_heartbeat;
  return out.write(&h, sizeof(h));
}

const char* failure_words(failure_kind kind) {
  switch (kind) {
    case failure_kind::died:
      return "died or broke its connection";
    case failure_kind::unresponsive:
      return "was found unresponsive (it sent nothing, not even a heartbeat, for the "
             "detector's bound)";
    case failure_kind::dropped:
      return "was dropped for the frames it sent";
    case failure_kind::failed:
      break;
  }
  return "failed";
}

bool write_goodbye(byte_stream& out, std::int32_t cause, failure_kind kind) {
  frame_header h;
  h.kind = frame_goodbye;
  h.src = cause;
  h.code = static_cast<std::uint8_t>(kind);
  return out.write(&h, sizeof(h));
}

std::string check_sender(const frame_header& h, const std::string& group,
                         const std::vector<int>& members, int peer) {
  const auto size = static_cast<std::int64_t>(members.size());
  // The per-frame path: two comparisons and a load.
  if (h.src >= 0 && h.src < size && members[static_cast<std::size_t>(h.src)] == peer) return {};
  const auto mine = std::find(members.begin(), members.end(), peer);
  if (mine == members.end())
    return "a frame for group '" + group + "', of which it is not a member";
  if (h.src < 0 || h.src >= size)
    return "a frame for group '" + group + "' from group rank " + std::to_string(h.src) +
           ", out of range for the group's " + std::to_string(size) + " ranks";
  return "a frame for group '" + group + "' that claims to come from group rank " +
         std::to_string(h.src) + " (world rank " +
         std::to_string(members[static_cast<std::size_t>(h.src)]) +
         "), not from its own group rank " + std::to_string(mine - members.begin());
}

std::uint64_t max_frame_payload() noexcept {
  static const std::uint64_t limit = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? static_cast<std::uint64_t>(pages) * size
                                 : std::uint64_t{1} << 40;
  }();
  return limit;
}

std::string frame_reader::drain(int fd, const std::function<bool(received_frame&)>& on_frame,
                                const place_fn& place, const admit_fn& admit) {
  std::string broke;
  auto receive = [&](void* p, std::size_t n) -> long {
    for (;;) {
      const auto k = ::recv(fd, p, n, MSG_DONTWAIT);
      if (k > 0) return static_cast<long>(k);
      if (k == 0) return -1;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      broke = std::string("connection broke: ") + std::strerror(errno);
      return -1;
    }
  };
  // Pieces smaller than the read-ahead buffer come out of it, refilled by
  // one recv of what the socket has; larger ones (payloads) go straight
  // from the socket to their place once the buffer is empty. A refill that
  // came short took all the socket had: the next one would only say so (a
  // system call a message, half of what a small message costs to read), so
  // the pieces end there and the next look (a poll, or the reader's) asks again.
  auto& a = ahead_;
  bool dry = false;
  auto from_socket = [&](void* p, std::size_t n) -> long {
    if (a.at == a.end) {
      if (n >= read_ahead::capacity) return receive(p, n);
      if (dry) return 0;
      if (!a.bytes) a.bytes = std::make_unique<char[]>(read_ahead::capacity);
      const auto k = receive(a.bytes.get(), read_ahead::capacity);
      if (k <= 0) return k;
      dry = static_cast<std::size_t>(k) < read_ahead::capacity;
      a.at = 0;
      a.end = static_cast<std::size_t>(k);
    }
    const auto k = std::min(n, a.end - a.at);
    std::memcpy(p, a.bytes.get() + a.at, k);
    a.at += k;
    return static_cast<long>(k);
  };
  auto why = drain(from_socket, on_frame, place, admit);
  return broke.empty() ? why : broke;
}

long frame_reader::read_posted(const std::function<long(void*, std::size_t)>& read_some) {
  const auto need = f_.header.payload_bytes - got_;
  std::lock_guard<std::mutex> g{guard_->mtx};
  if (guard_->revoked) {
    // Whoever posted no longer wants the bytes (its operation ended): the
    // rest goes to a fresh tensor, as a frame nobody posted for.
    f_.payload = payload_for(f_.header);
    guard_.reset();
  }
  return read_some(static_cast<char*>(f_.payload.data()) + got_, need);
}

std::string frame_reader::drain(const std::function<long(void*, std::size_t)>& read_some,
                                const std::function<bool(received_frame&)>& on_frame,
                                const place_fn& place, const admit_fn& admit) {
  auto& h = f_.header;
  for (;;) {
    if (at_ == piece::payload && skip_) {
      // A frame nobody here takes: its payload is read and dropped.
      char scratch[16 << 10];
      const auto k = read_some(scratch, std::min(sizeof(scratch), h.payload_bytes - got_));
      if (k < 0) return "connection closed";
      if (k == 0) return {};
      bytes_read_ += static_cast<std::uint64_t>(k);
      got_ += static_cast<std::size_t>(k);
      if (got_ < h.payload_bytes) continue;
      got_ = 0;
      skip_ = false;
      at_ = piece::header;
      f_ = received_frame{};
      continue;
    }
    char* dst = nullptr;
    std::size_t need = 0;
    switch (at_) {
      case piece::header:
        dst = reinterpret_cast<char*>(&h);
        need = sizeof(h);
        break;
      case piece::name:
        dst = f_.group.data();
        need = h.name_len;
        break;
      case piece::fingerprint:
        dst = fp_.data();
        need = h.fp_bytes;
        break;
      case piece::payload:
        dst = static_cast<char*>(f_.payload.data());
        need = h.payload_bytes;
        break;
    }
    if (got_ < need) {
      const auto k = at_ == piece::payload && guard_ ? read_posted(read_some)
                                                     : read_some(dst + got_, need - got_);
      if (k < 0) return "connection closed";
      if (k == 0) return {};
      bytes_read_ += static_cast<std::uint64_t>(k);
      got_ += static_cast<std::size_t>(k);
      if (got_ < need) continue;
    }
    // A piece is complete: check it, then move on to the next one.
    got_ = 0;
    bool complete = false;
    if (at_ == piece::header) {
      if (auto why = check_header(h); !why.empty()) return why;
      if (h.kind == frame_goodbye || h.kind == frame_heartbeat) {
        complete = true;
      } else {
        f_.group.resize(h.name_len);
        at_ = piece::name;
      }
    } else if (at_ == piece::name || at_ == piece::fingerprint) {
      // The sender is admitted once the group is known (before anything
      // else of the frame is allocated); then its fingerprint is read.
      if (at_ == piece::name && admit)
        if (auto why = admit(h, f_.group, skip_); !why.empty()) return why;
      if (at_ == piece::name && h.fp_bytes != 0) {
        fp_.resize(h.fp_bytes);
        at_ = piece::fingerprint;
        continue;
      }
      if (skip_) {
        if (h.payload_bytes) {
          at_ = piece::payload;
        } else {
          skip_ = false;
          at_ = piece::header;
          f_ = received_frame{};
        }
        continue;
      }
      if (h.fp_bytes != 0) {
        try {
          f_.fp = std::make_shared<const call_fingerprint>(
              call_fingerprint::deserialize(fp_.data(), fp_.size()));
        } catch (const error& e) {
          return e.what();
        }
      }
      // Point-to-point payloads of any size go where a receive was posted
      // for them (no fresh tensor, no second copy); collective ones from 16 KiB.
      if (place && h.payload_bytes > 0 && (h.payload_bytes > small_frame || h.kind == frame_p2p)) {
        auto posted = place(h, f_.group);
        if (posted.into.defined() && posted.guard && posted.into.nbytes() == h.payload_bytes &&
            static_cast<std::uint8_t>(posted.into.scalar_type()) == h.dtype) {
          f_.payload = std::move(posted.into);
          guard_ = std::move(posted.guard);
        }
      }
      if (!guard_) f_.payload = payload_for(h);
      if (h.payload_bytes)
        at_ = piece::payload;
      else
        complete = true;
    } else {
      complete = true;
    }
    if (complete) {
      at_ = piece::header;
      guard_.reset();
      received_frame f = std::move(f_);
      f_ = received_frame{};
      if (!on_frame(f)) return "stopped";
    }
  }
}

}  // namespace troupe::detail
