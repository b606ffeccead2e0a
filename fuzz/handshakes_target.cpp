// Fuzzing target: the decoders of what strangers send first (the data
// plane's hello, the store's preamble: transport/handshake.hpp) and of the
// store's wire (store/store_wire.hpp). The first input byte picks the decoder
// and how many bytes arrive at a time; the rest is the stream. Invariants:
// a decoder never asks for more than its format's maximum, a decoded hello
// or request encodes back to what was read, a reply decodes within bounds.

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "fuzz/fuzz_target.hpp"
#include "store/store_wire.hpp"
#include "transport/handshake.hpp"

using namespace troupe;
using namespace troupe::detail;

namespace troupe::fuzz {

void expect(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
  std::abort();
}

const char* name() {
  return "handshakes";
}

std::vector<std::string> seeds() {
  hello h{"0123456789abcdef", 3, 4711, "host", "job-1", "troupe-ring-3-0@4711:5"};
  std::string preamble = "TROUPES2";
  preamble += std::string("\0\0\0\x05", 4) + "token";
  std::vector<std::string> out = {std::string(1, '\x00') + encode_hello(h),
                                  std::string(1, '\x01') + preamble};
  for (auto op : {store_op::set, store_op::wait, store_op::multi_set, store_op::compare_set,
                  store_op::watch}) {
    store_request r{op, {"key", "k2"}, {to_bytes("v"), to_bytes("w")}, 1500, true};
    out.push_back(std::string(1, '\x02') + encode_request(9, r));
    store_reply a;
    a.missing = {"k2"};
    a.values = {to_bytes("v")};
    a.number = 3;
    out.push_back(std::string(1, static_cast<char>(0x03 | (static_cast<int>(op) << 4))) +
                  encode_reply(9, op, a));
  }
  return out;
}

}  // namespace troupe::fuzz

namespace {

using troupe::fuzz::expect;

/// Feeds a handshake decoder at most `piece` bytes at a time, as it asks.
std::string feed(handshake_decoder& d, const char* p, std::size_t n, std::size_t piece,
                 handshake_decoder::status& st) {
  std::string taken;
  st = handshake_decoder::status::more;
  std::size_t at = 0;
  while (st == handshake_decoder::status::more && at < n) {
    const auto want = d.wanted();
    expect(want > 0 && want <= max_handshake_token, "a decoder asked for too much");
    const auto k = std::min({want, piece, n - at});
    st = d.take(p + at, k);
    taken.append(p + at, k);
    at += k;
  }
  return taken;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const int which = data[0] & 0x03;
  const std::size_t piece = std::size_t{1} << ((data[0] >> 2) & 0x03) * 3;  // 1, 8, 64, 512
  const char* p = reinterpret_cast<const char*>(data + 1);
  const std::size_t n = size - 1;
  auto st = handshake_decoder::status::more;
  if (which == 0) {
    hello_decoder d;
    const auto taken = feed(d, p, n, piece, st);
    if (st == handshake_decoder::status::done) {
      const auto& h = d.result();
      expect(h.token.size() <= max_handshake_token, "a token over its limit");
      expect(encode_hello(h) == taken, "a hello that does not encode back to its bytes");
    }
  } else if (which == 1) {
    preamble_decoder d;
    feed(d, p, n, piece, st);
    if (st == handshake_decoder::status::done)
      expect(!d.token().empty() && d.token().size() <= max_handshake_token, "a bad token size");
  } else if (which == 2) {
    store_message_reader reader;
    for (std::size_t at = 0; at < n && !reader.bad();) {
      at += reader.feed(p + at, std::min(piece, n - at));
      if (!reader.ready()) continue;
      const auto body = reader.take();
      std::uint64_t id = 0;
      std::string why;
      if (auto r = decode_request(body, id, why)) {
        const auto again = encode_request(id, *r);
        expect(again.substr(4) == body, "a request that does not encode back to its bytes");
      }
    }
  } else {
    const auto op = static_cast<store_op>((data[0] >> 4) % store_op_count);
    std::string why;
    if (auto r = decode_reply(std::string(p, n), op, why))
      expect(r->missing.size() <= n && r->values.size() <= n, "lists longer than their bytes");
  }
  return 0;
}
