// store_wire: encoding and bounded decoding of the store's messages
// (store/store_wire.hpp).

#include "store/store_wire.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

namespace troupe::detail {

namespace {

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
void put_data(std::string& out, const void* data, std::size_t n) {
  put_u32(out, static_cast<std::uint32_t>(n));
  out.append(static_cast<const char*>(data), n);
}
void put_string(std::string& out, const std::string& s) {
  put_data(out, s.data(), s.size());
}
void put_bytes(std::string& out, const bytes& b) {
  put_data(out, b.data(), b.size());
}
template <class T, class Put>
void put_list(std::string& out, const std::vector<T>& xs, Put put) {
  put_u32(out, static_cast<std::uint32_t>(xs.size()));
  for (const auto& x : xs) put(out, x);
}

/// Reads fields from a body, failing (once) at the first length that does not fit.
class cursor {
 public:
  explicit cursor(const std::string& body) : p_(body.data()), end_(body.data() + body.size()) {}
  bool ok() const noexcept { return ok_; }
  bool at_end() const noexcept { return p_ == end_; }
  std::uint64_t u(int n) {
    if (!need(static_cast<std::size_t>(n))) return 0;
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= std::uint64_t{static_cast<unsigned char>(p_[i])} << (8 * i);
    p_ += n;
    return v;
  }
  std::string string() {
    const auto n = u(4);
    if (!need(n)) return {};
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  bytes data() {
    const auto n = u(4);
    if (!need(n)) return {};
    bytes b(reinterpret_cast<const std::uint8_t*>(p_),
            reinterpret_cast<const std::uint8_t*>(p_) + n);
    p_ += n;
    return b;
  }
  template <class F>
  auto list(F item) -> std::vector<decltype(item())> {
    const auto n = u(4);
    std::vector<decltype(item())> xs;
    // Every item takes at least 4 bytes: a count beyond that cannot be true.
    if (!need(0) || n > static_cast<std::size_t>(end_ - p_) / 4) {
      ok_ = false;
      return xs;
    }
    xs.reserve(n);
    for (std::uint64_t i = 0; i < n && ok_; ++i) xs.push_back(item());
    return xs;
  }

 private:
  bool need(std::size_t n) {
    if (ok_ && static_cast<std::size_t>(end_ - p_) >= n) return true;
    ok_ = false;
    return false;
  }
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

/// Writes the length of everything after the first 4 bytes into them.
std::string framed(std::string out) {
  const auto n = static_cast<std::uint32_t>(out.size() - 4);
  for (int i = 0; i < 4; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out;
}

}  // namespace

std::string encode_request(std::uint64_t id, const store_request& r) {
  std::string out(4, '\0');
  put_u64(out, id);
  out.push_back(static_cast<char>(r.op));
  const auto key = r.keys.empty() ? std::string() : r.keys.front();
  const auto value = r.values.empty() ? bytes() : r.values.front();
  switch (r.op) {
    case store_op::set:
    case store_op::append:
    case store_op::watch:
      put_string(out, key);
      put_bytes(out, value);
      break;
    case store_op::multi_set:
      put_list(out, r.keys, put_string);
      put_list(out, r.values, put_bytes);
      break;
    case store_op::add:
      put_string(out, key);
      put_u64(out, static_cast<std::uint64_t>(r.number));
      break;
    case store_op::compare_set:
      put_string(out, key);
      put_list(out, r.values, put_bytes);
      break;
    case store_op::check:
      put_list(out, r.keys, put_string);
      break;
    case store_op::wait:
      put_list(out, r.keys, put_string);
      put_u64(out, static_cast<std::uint64_t>(r.number));
      out.push_back(r.flag ? 1 : 0);
      break;
    case store_op::remove:
      put_string(out, key);
      break;
    case store_op::count:
    case store_op::goodbye:
      break;
  }
  return framed(std::move(out));
}

std::uint64_t message_id(const std::string& body) {
  cursor c(body);
  const auto id = c.u(8);
  return c.ok() ? id : 0;
}

std::optional<store_request> decode_request(const std::string& body, std::uint64_t& id,
                                            std::string& why) {
  cursor c(body);
  id = c.u(8);
  const auto op = c.u(1);
  if (!c.ok() || op >= store_op_count) {
    why = "a request of unknown kind " + std::to_string(op);
    return std::nullopt;
  }
  store_request r;
  r.op = static_cast<store_op>(op);
  auto string = [&] { return c.string(); };
  auto data = [&] { return c.data(); };
  switch (r.op) {
    case store_op::set:
    case store_op::append:
    case store_op::watch:
      r.keys.push_back(c.string());
      r.values.push_back(c.data());
      break;
    case store_op::multi_set:
      r.keys = c.list(string);
      r.values = c.list(data);
      break;
    case store_op::add:
      r.keys.push_back(c.string());
      r.number = static_cast<std::int64_t>(c.u(8));
      break;
    case store_op::compare_set:
      r.keys.push_back(c.string());
      r.values = c.list(data);
      if (c.ok() && r.values.size() != 2) why = "a compare_set without 2 values";
      break;
    case store_op::check:
      r.keys = c.list(string);
      break;
    case store_op::wait:
      r.keys = c.list(string);
      r.number = static_cast<std::int64_t>(c.u(8));
      if (const auto flag = c.u(1); flag > 1)
        why = "a wait whose flag is " + std::to_string(flag);
      else
        r.flag = flag != 0;
      break;
    case store_op::remove:
      r.keys.push_back(c.string());
      break;
    case store_op::count:
    case store_op::goodbye:
      break;
  }
  if (!c.ok() || !c.at_end() || !why.empty()) {
    if (why.empty()) why = "a malformed request";
    return std::nullopt;
  }
  return r;
}

std::string encode_reply(std::uint64_t id, store_op op, const store_reply& r) {
  std::string out(4, '\0');
  put_u64(out, id);
  out.push_back(r.failed ? 1 : 0);
  if (r.failed) {
    put_u32(out, static_cast<std::uint32_t>(r.code));
    put_string(out, r.message);
    return framed(std::move(out));
  }
  switch (op) {
    case store_op::add:
    case store_op::count:
      put_u64(out, static_cast<std::uint64_t>(r.number));
      break;
    case store_op::compare_set:
      put_bytes(out, r.value);
      break;
    case store_op::check:
    case store_op::remove:
      out.push_back(r.flag ? 1 : 0);
      break;
    case store_op::wait:
      put_list(out, r.missing, put_string);
      put_list(out, r.values, put_bytes);
      break;
    default:
      break;
  }
  return framed(std::move(out));
}

std::optional<store_reply> decode_reply(const std::string& body, store_op op, std::string& why) {
  cursor c(body);
  c.u(8);  // the id
  store_reply r;
  r.failed = c.u(1) != 0;
  if (r.failed) {
    const auto code = c.u(4);
    r.code =
        code <= static_cast<std::uint64_t>(errc::internal) ? static_cast<errc>(code) : errc::store;
    r.message = c.string();
  } else {
    auto string = [&] { return c.string(); };
    auto data = [&] { return c.data(); };
    switch (op) {
      case store_op::add:
      case store_op::count:
        r.number = static_cast<std::int64_t>(c.u(8));
        break;
      case store_op::compare_set:
        r.value = c.data();
        break;
      case store_op::check:
      case store_op::remove:
        r.flag = c.u(1) != 0;
        break;
      case store_op::wait:
        r.missing = c.list(string);
        r.values = c.list(data);
        break;
      default:
        break;
    }
  }
  if (!c.ok() || !c.at_end()) {
    why = "a malformed reply";
    return std::nullopt;
  }
  return r;
}

std::size_t store_message_reader::feed(const char* data, std::size_t n) {
  std::size_t used = 0;
  if (ready_ || bad()) return 0;
  if (prefix_got_ < 4) {
    const auto k = std::min(n, 4 - prefix_got_);
    std::memcpy(prefix_ + prefix_got_, data, k);
    prefix_got_ += k;
    used += k;
    if (prefix_got_ < 4) return used;
    len_ = 0;
    for (int i = 0; i < 4; ++i)
      len_ |= std::uint32_t{static_cast<unsigned char>(prefix_[i])} << (8 * i);
    if (len_ > max_store_message) {
      why_ = "a message of " + std::to_string(len_) + " bytes (at most " +
             std::to_string(max_store_message) + ")";
      return used;
    }
    body_.clear();
  }
  const auto k = std::min(n - used, std::size_t{len_} - body_.size());
  body_.append(data + used, k);  // grows with what arrived, not with what was announced
  used += k;
  ready_ = body_.size() == len_;
  return used;
}

std::string store_message_reader::take() {
  ready_ = false;
  prefix_got_ = 0;
  return std::exchange(body_, std::string());
}

}  // namespace troupe::detail
