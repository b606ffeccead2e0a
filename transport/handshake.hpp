#pragma once
// handshake — the first bytes of a connection, sent by a peer that has not
// yet proven that it belongs to the job, and read without trusting them.
//
// A decoder says how many bytes it needs next, so that its reader takes
// exactly the handshake and nothing of what follows; it never holds more
// than its format's fixed maximum, whatever a length field announces.
//
// The data plane's hello (host byte order: the processes of a job run one build):
//   "TROUPEH1" | u32 token length (1..4096) | token | i32 world rank | i32 pid |
//   u16 length + host | u16 length + job | u16 length + link (each 0..255)
// The store's preamble (store/store_gate.hpp):
//   "TROUPES2" | big-endian u32 token length (1..4096) | token
// and the store's answer to it: byte 0 (refused), or byte 1 | u8 length +
// who serves ("troupe-run (pid 7) on host h"), read by the client only.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace troupe::detail {

/// Reads one handshake as its bytes arrive.
class handshake_decoder {
 public:
  enum class status { more, done, bad };
  virtual ~handshake_decoder() = default;
  /// How many bytes the decoder needs next (more than 0 until done or bad).
  virtual std::size_t wanted() const = 0;
  /// Takes the next `n` bytes, 0 < n <= wanted().
  virtual status take(const char* data, std::size_t n) = 0;
  /// Why the bytes are not a handshake (after status::bad).
  const std::string& why() const noexcept { return why_; }

 protected:
  status refuse(std::string why) {
    why_ = std::move(why);
    return status::bad;
  }

 private:
  std::string why_;
};

/// Whether `given` is the job token `expected` (never when `expected` is
/// empty), compared without an early exit so that timing tells nothing of it.
bool same_token(const std::string& given, const std::string& expected);

/// The longest job token either handshake carries.
inline constexpr std::size_t max_handshake_token = 4096;

/// What a rank says about itself when it connects to a process peer.
struct hello {
  std::string token;
  std::int32_t rank = -1;
  std::int32_t pid = 0;
  std::string host;
  std::string job;
  std::string link;  ///< the link it writes to, "NAME ADDRESS" (transport/link.hpp; empty: TCP)
};

/// The hello's bytes; throws errc::invalid_argument for fields over their limits.
std::string encode_hello(const hello& h);

/// Decodes a hello (at most 4887 bytes).
class hello_decoder final : public handshake_decoder {
 public:
  std::size_t wanted() const override { return need_ - piece_.size(); }
  status take(const char* data, std::size_t n) override;
  const hello& result() const noexcept { return h_; }

 private:
  enum class field { magic, token_len, token, ids, host_len, host, job_len, job, link_len, link };
  status next(field f, std::size_t need);
  field at_ = field::magic;
  std::size_t need_ = 8;
  std::string piece_;
  hello h_;
};

/// Decodes the store's preamble (at most 4108 bytes).
class preamble_decoder final : public handshake_decoder {
 public:
  std::size_t wanted() const override { return need_ - piece_.size(); }
  status take(const char* data, std::size_t n) override;
  const std::string& token() const noexcept { return token_; }

 private:
  int field_ = 0;  // 0 magic, 1 token length, 2 token
  std::size_t need_ = 8;
  std::string piece_;
  std::string token_;
};

}  // namespace troupe::detail
