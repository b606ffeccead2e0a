// Frames between processes (transport/frame.hpp): frames read from a socket
// through the read-ahead buffer (small ones back to back, a large payload
// that starts in it), payloads read straight into a receive posted for them
// (inline/message_medium's post_receive),
// what happens when the poster revokes it while the payload is being read,
// and messages that arrive after their operation ended.

#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../inline/message_medium.hpp"
#include "../transport/frame.hpp"
#include "troupe/troupe.hpp"

using namespace troupe;
using namespace troupe::detail;

namespace {

/// Collects what write_frame writes.
class string_stream final : public byte_stream {
 public:
  std::string bytes;
  bool write(const void* d, std::size_t n) override {
    bytes.append(static_cast<const char*>(d), n);
    return true;
  }
  bool read(void*, std::size_t) override { return false; }
  void close() override {}
};

/// An inline engine frame carrying `count` floats 0, 1, 2, ... (op 7, step 3, rank 1).
std::string inline_frame(std::int64_t count) {
  auto payload = tensor::empty({count}, dtype::float32);
  for (std::int64_t i = 0; i < count; ++i) payload.data_as<float>()[i] = float(i);
  string_stream out;
  REQUIRE(
      write_frame(out, "g", envelope{7, 3, 1, op_code::allreduce, payload, nullptr}, frame_inline));
  return out.bytes;
}

/// Hands `bytes[at, at + n)` to the reader, at most `piece` at a time.
struct feeder {
  const std::string& bytes;
  std::size_t at = 0, end = 0, piece = 4096;
  long operator()(void* d, std::size_t n) {
    const auto k = std::min({n, end - at, piece});
    std::memcpy(d, bytes.data() + at, k);
    at += k;
    return static_cast<long>(k);
  }
};

bool counts_up(const float* p, std::int64_t from, std::int64_t to) {
  for (std::int64_t i = from; i < to; ++i)
    if (p[i] != float(i)) return false;
  return true;
}

}  // namespace

TEST_CASE("frames from a socket: small ones back to back, and a large payload posted for") {
  // Small frames around a 256 KiB one, written at once: the reader takes
  // several pieces out of one recv, and the large payload partly out of the
  // read-ahead buffer, the rest straight from the socket into the tensor
  // posted for it.
  const std::int64_t big = 64 << 10;
  std::string bytes;
  const std::vector<std::int64_t> counts{1, 3, 1000, big, 2, 1};
  for (auto c : counts) bytes += inline_frame(c);
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  std::thread writer([&] {
    std::size_t at = 0;
    while (at < bytes.size()) {
      const auto k = ::write(fds[0], bytes.data() + at, bytes.size() - at);
      if (k <= 0) break;
      at += static_cast<std::size_t>(k);
    }
  });
  auto into = tensor::zeros({big}, dtype::float32);
  auto guard = std::make_shared<receive_guard>();
  frame_reader reader;
  std::vector<std::int64_t> got;
  bool posted_used = false, right = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (got.size() < counts.size() && std::chrono::steady_clock::now() < deadline) {
    const auto why = reader.drain(
        fds[1],
        [&](received_frame& f) {
          got.push_back(f.payload.numel());
          right = right && counts_up(f.payload.data_as<float>(), 0, f.payload.numel());
          posted_used = posted_used || f.payload.data() == into.data();
          return true;
        },
        [&](const frame_header&, const std::string&) {
          return posted_receive{into, guard};
        });
    REQUIRE(why.empty());
  }
  writer.join();
  ::close(fds[0]);
  ::close(fds[1]);
  CHECK(got == counts);
  CHECK(right);
  CHECK(posted_used);
  CHECK(reader.bytes_read() == bytes.size());
}

TEST_CASE("a frame's payload lands in the tensor posted for it when it fits exactly") {
  const std::int64_t count = 64 << 10;  // 256 KiB
  const auto bytes = inline_frame(count);
  for (const auto& [what, into] :
       {std::pair{"fits", tensor::zeros({count}, dtype::float32)},
        std::pair{"too small", tensor::zeros({count - 1}, dtype::float32)},
        std::pair{"another dtype", tensor::zeros({count}, dtype::int32)}}) {
    CAPTURE(what);
    const bool fits = std::string(what) == "fits";
    auto guard = std::make_shared<receive_guard>();
    int asked = 0, frames = 0;
    frame_reader reader;
    feeder feed{bytes, 0, bytes.size()};
    const auto why = reader.drain(
        feed,
        [&](received_frame& f) {
          ++frames;
          CHECK(f.header.seq == 7);
          CHECK((f.payload.data() == into.data()) == fits);
          CHECK(f.payload.numel() == count);
          CHECK(counts_up(f.payload.data_as<float>(), 0, count));
          return true;
        },
        [&](const frame_header& h, const std::string& group) {
          ++asked;
          CHECK(group == "g");
          CHECK(h.payload_bytes == std::uint64_t(count) * 4);
          return posted_receive{into, guard};
        });
    CHECK(why.empty());
    CHECK(asked == 1);
    CHECK(frames == 1);
    if (!fits) {
      const auto* b = static_cast<const unsigned char*>(into.data());
      CHECK(std::all_of(b, b + into.nbytes(), [](unsigned char c) { return c == 0; }));
    }
  }
  // Small payloads (up to 16 KiB) are not worth asking about.
  const auto small = inline_frame(1024);
  frame_reader reader;
  feeder feed{small, 0, small.size()};
  int asked = 0;
  reader.drain(
      feed, [](received_frame&) { return true; },
      [&](const frame_header&, const std::string&) {
        ++asked;
        return posted_receive{};
      });
  CHECK(asked == 0);
}

TEST_CASE("a posted receive revoked while its payload is read gets no byte more") {
  const std::int64_t count = 64 << 10;
  const auto bytes = inline_frame(count);
  auto into = tensor::empty({count}, dtype::float32);
  std::fill_n(into.data_as<float>(), count, -1.f);
  auto guard = std::make_shared<receive_guard>();
  received_frame got;
  int frames = 0;
  frame_reader reader;
  const std::size_t half = bytes.size() - std::size_t(count) * 4 / 2;
  feeder feed{bytes, 0, half};
  auto on_frame = [&](received_frame& f) {
    ++frames;
    got = std::move(f);
    return true;
  };
  auto place = [&](const frame_header&, const std::string&) { return posted_receive{into, guard}; };
  CHECK(reader.drain(std::ref(feed), on_frame, place).empty());
  CHECK(frames == 0);
  {
    std::lock_guard<std::mutex> g{guard->mtx};
    guard->revoked = true;
  }
  feed.end = bytes.size();
  CHECK(reader.drain(std::ref(feed), on_frame, place).empty());
  REQUIRE(frames == 1);
  // The first half went where it was posted, nothing after the revocation.
  const auto* p = into.data_as<float>();
  CHECK(counts_up(p, 0, count / 2));
  CHECK(std::all_of(p + count / 2, p + count, [](float v) { return v == -1.f; }));
  // The frame still arrives whole-sized, in a tensor of its own.
  CHECK(got.payload.data() != into.data());
  CHECK(got.payload.numel() == count);
  CHECK(counts_up(got.payload.data_as<float>(), count / 2, count));
}

TEST_CASE("a group's posted receives are handed out once, by key and kind, and revoked at end_op") {
  auto medium = std::make_shared<message_medium>(
      nullptr, "test-frames-", std::vector<bool>{true, false}, std::vector<int>{0, 1}, 0, "g",
      std::vector<std::string>{"rank 0", "rank 1"});
  const auto code = static_cast<std::uint8_t>(op_code::allgatherv);
  auto into = tensor::empty({1 << 16}, dtype::float32);
  medium->post_receive(9, 2, 1, code, into);
  medium->post_receive(9, 2, 0, code, into);  // rank 0 lives here: nothing to read
  frame_header h;
  h.kind = frame_inline;
  h.seq = 9;
  h.step = 2;
  h.src = 0;
  h.code = code;
  CHECK_FALSE(medium->placement(h).into.defined());
  h.src = 1;
  h.code = static_cast<std::uint8_t>(op_code::alltoallv);  // another collective
  CHECK_FALSE(medium->placement(h).into.defined());
  h.code = code;
  h.step = 3;
  CHECK_FALSE(medium->placement(h).into.defined());
  h.step = 2;
  const auto where = medium->placement(h);
  REQUIRE(where.into.defined());
  CHECK(where.into.data() == into.data());
  CHECK_FALSE(medium->placement(h).into.defined());  // once
  CHECK_FALSE(where.guard->revoked);
  medium->end_op(9);
  CHECK(where.guard->revoked);
}

TEST_CASE("a message for an operation that already ended is dropped, not kept") {
  // Two ranks of one process: rank 0's messages go straight into rank 1's inbox.
  const std::vector<std::string> names{"rank 0", "rank 1"};
  auto a = std::make_shared<message_medium>(nullptr, "test-late-", std::vector<bool>{true, true},
                                            std::vector<int>{0, 1}, 0, "g", names);
  auto b = std::make_shared<message_medium>(nullptr, "test-late-", std::vector<bool>{true, true},
                                            std::vector<int>{0, 1}, 1, "g", names);
  a->attach();
  b->attach();
  const auto code = static_cast<std::uint8_t>(op_code::allreduce);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  auto payload = tensor::zeros({4}, dtype::float32);
  auto taken = [&](std::uint64_t op) {
    int n = 0;
    b->take_all(op, [&](int src, std::uint32_t, message_medium::message& m) {
      CHECK(src == 0);
      CHECK(m.payload.defined());
      ++n;
    });
    return n;
  };
  b->end_op(4);  // operations 1..4 ended (failed) on rank 1
  a->send(1, 4, 0, code, payload, deadline, reading::none);
  a->send(1, 3, 0, code, payload, deadline, reading::none);
  a->send(1, 5, 0, code, payload, deadline, reading::none);
  CHECK(taken(3) == 0);
  CHECK(taken(4) == 0);
  CHECK(taken(5) == 1);  // the next operation's message is kept
}
