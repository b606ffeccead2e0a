// handshake: the hello of the data plane and the preamble of the store,
// decoded field by field (formats in transport/handshake.hpp).

#include "transport/handshake.hpp"

#include <cstring>

#include "troupe/error.hpp"

namespace troupe::detail {

namespace {

constexpr char hello_magic[8] = {'T', 'R', 'O', 'U', 'P', 'E', 'H', '1'};
constexpr char preamble_magic[8] = {'T', 'R', 'O', 'U', 'P', 'E', 'S', '2'};
constexpr std::size_t max_field = 255;

template <class T>
T load(const std::string& bytes) {
  T v{};
  std::memcpy(&v, bytes.data(), sizeof(v));
  return v;
}

void put_string(std::string& out, const std::string& s, const char* what) {
  if (s.size() > max_field)
    throw error(errc::invalid_argument, std::string("data plane hello: the ") + what + " has " +
                                            std::to_string(s.size()) + " bytes; at most " +
                                            std::to_string(max_field) + " fit");
  const auto n = static_cast<std::uint16_t>(s.size());
  out.append(reinterpret_cast<const char*>(&n), sizeof(n));
  out += s;
}

}  // namespace

bool same_token(const std::string& given, const std::string& expected) {
  if (expected.empty()) return false;
  unsigned diff = given.size() != expected.size();
  for (std::size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ expected[i % expected.size()]);
  return diff == 0;
}

std::string encode_hello(const hello& h) {
  if (h.token.empty() || h.token.size() > max_handshake_token)
    throw error(errc::invalid_argument, "data plane hello: the job token must have 1.." +
                                            std::to_string(max_handshake_token) + " bytes, not " +
                                            std::to_string(h.token.size()));
  std::string out(hello_magic, sizeof(hello_magic));
  const auto tlen = static_cast<std::uint32_t>(h.token.size());
  out.append(reinterpret_cast<const char*>(&tlen), sizeof(tlen));
  out += h.token;
  const std::int32_t ids[2] = {h.rank, h.pid};
  out.append(reinterpret_cast<const char*>(ids), sizeof(ids));
  put_string(out, h.host, "host name");
  put_string(out, h.job, "job id");
  put_string(out, h.link, "link");
  return out;
}

hello_decoder::status hello_decoder::next(field f, std::size_t need) {
  at_ = f;
  need_ = need;
  piece_.clear();
  return status::more;
}

hello_decoder::status hello_decoder::take(const char* data, std::size_t n) {
  if (n == 0 || n > wanted()) return refuse("handshake reader took the wrong number of bytes");
  piece_.append(data, n);
  if (piece_.size() < need_) return status::more;
  // A field is complete.
  switch (at_) {
    case field::magic:
      if (std::memcmp(piece_.data(), hello_magic, sizeof(hello_magic)) != 0)
        return refuse("not a troupe handshake");
      return next(field::token_len, sizeof(std::uint32_t));
    case field::token_len: {
      const auto len = load<std::uint32_t>(piece_);
      if (len == 0 || len > max_handshake_token)
        return refuse("malformed handshake: a token of " + std::to_string(len) + " bytes (1.." +
                      std::to_string(max_handshake_token) + " allowed)");
      return next(field::token, len);
    }
    case field::token:
      h_.token = piece_;
      return next(field::ids, 2 * sizeof(std::int32_t));
    case field::ids:
      h_.rank = load<std::int32_t>(piece_);
      h_.pid = load<std::int32_t>(piece_.substr(sizeof(std::int32_t)));
      return next(field::host_len, sizeof(std::uint16_t));
    case field::host_len:
    case field::job_len:
    case field::link_len: {
      const auto len = load<std::uint16_t>(piece_);
      if (len > max_field)
        return refuse("malformed handshake: a field of " + std::to_string(len) + " bytes (0.." +
                      std::to_string(max_field) + " allowed)");
      const auto f = at_ == field::host_len  ? field::host
                     : at_ == field::job_len ? field::job
                                             : field::link;
      if (len > 0) return next(f, len);
      piece_.clear();
      at_ = f;
      need_ = 0;
      [[fallthrough]];
    }
    case field::host:
    case field::job:
    case field::link:
      if (at_ == field::host) {
        h_.host = piece_;
        return next(field::job_len, sizeof(std::uint16_t));
      }
      if (at_ == field::job) {
        h_.job = piece_;
        return next(field::link_len, sizeof(std::uint16_t));
      }
      h_.link = piece_;
      need_ = piece_.size();  // wanted() is 0 from now on
      return status::done;
  }
  return refuse("malformed handshake");
}

preamble_decoder::status preamble_decoder::take(const char* data, std::size_t n) {
  if (n == 0 || n > wanted()) return refuse("handshake reader took the wrong number of bytes");
  piece_.append(data, n);
  if (piece_.size() < need_) return status::more;
  if (field_ == 0) {
    if (std::memcmp(piece_.data(), preamble_magic, sizeof(preamble_magic)) != 0)
      return refuse("not a troupe store client (no TROUPES2 preamble)");
    field_ = 1;
    need_ = 4;
    piece_.clear();
    return status::more;
  }
  if (field_ == 1) {
    const auto* b = reinterpret_cast<const unsigned char*>(piece_.data());
    const std::uint32_t len = (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) |
                              (std::uint32_t{b[2]} << 8) | b[3];
    if (len == 0 || len > max_handshake_token)
      return refuse("announced a token of " + std::to_string(len) + " bytes (1.." +
                    std::to_string(max_handshake_token) + " allowed)");
    field_ = 2;
    need_ = len;
    piece_.clear();
    return status::more;
  }
  token_ = piece_;
  return status::done;
}

}  // namespace troupe::detail
