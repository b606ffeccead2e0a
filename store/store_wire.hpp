#pragma once
// store_wire — how tcp_store clients and the server talk once the gate
// admitted a connection (store/store_gate.hpp): length-prefixed messages, every
// integer little-endian (hosts of one job may differ).
//
//   request: u32 length | u64 id | u8 op    | fields of the op
//   reply:   u32 length | u64 id | u8 error | error ? (u32 errc, string) : fields
//   string and bytes: u32 length | data;  lists: u32 count | items
//
// A message longer than max_store_message is refused (the connection
// closes); a reader grows its buffer with the bytes that arrive, never to
// what a length announces. Decoding checks every length against the bytes
// that are there.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/store.hpp"

namespace troupe::detail {

/// The longest request or reply (1 GiB: values are meant for rendezvous data).
inline constexpr std::uint32_t max_store_message = std::uint32_t{1} << 30;

enum class store_op : std::uint8_t {
  set,          ///< key, value
  multi_set,    ///< keys, values
  add,          ///< key, number (delta) -> number
  compare_set,  ///< key, values {expected, desired} -> value
  append,       ///< key, value
  check,        ///< keys -> flag
  wait,         ///< keys, number (timeout ms), flag (want values) -> missing keys, values
  remove,       ///< key -> flag
  count,        ///< -> number
  watch,        ///< key, value: appended to key if this connection ends without a goodbye
  goodbye,      ///< the client closes on purpose (no reply)
};
inline constexpr std::uint8_t store_op_count = 11;

/// One request, whatever its op (unused fields stay empty).
struct store_request {
  store_op op = store_op::count;
  std::vector<std::string> keys;
  std::vector<bytes> values;
  std::int64_t number = 0;
  bool flag = false;
};

/// One answer.
struct store_reply {
  bool failed = false;
  errc code = errc::store;  ///< when failed
  std::string message;      ///< when failed
  std::int64_t number = 0;
  bool flag = false;
  bytes value;
  std::vector<std::string> missing;
  std::vector<bytes> values;
};

/// The whole message (length prefix included).
std::string encode_request(std::uint64_t id, const store_request& r);
std::string encode_reply(std::uint64_t id, store_op op, const store_reply& r);

/// The body of a message (after its length): its id, then the request, or
/// nullopt when the bytes are not one (`why` says how).
std::optional<store_request> decode_request(const std::string& body, std::uint64_t& id,
                                            std::string& why);
/// The body of a reply to a request of `op` (its id read by message_id first).
std::optional<store_reply> decode_reply(const std::string& body, store_op op, std::string& why);
/// The id a message body starts with (0 when it is too short).
std::uint64_t message_id(const std::string& body);

/// Reads length-prefixed messages from bytes as they arrive.
class store_message_reader {
 public:
  /// Takes up to n bytes; returns how many it took. Stops after a complete
  /// message (then ready()) or a bad length (then bad()).
  std::size_t feed(const char* data, std::size_t n);
  bool ready() const noexcept { return ready_; }
  bool bad() const noexcept { return !why_.empty(); }
  const std::string& why() const noexcept { return why_; }
  /// The complete body; reading goes on with the next message.
  std::string take();

 private:
  char prefix_[4] = {};
  std::size_t prefix_got_ = 0;
  std::uint32_t len_ = 0;
  std::string body_;
  bool ready_ = false;
  std::string why_;
};

}  // namespace troupe::detail
