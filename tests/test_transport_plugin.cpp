// A transport written outside troupe, in one file and one registration:
// links through named pipes (FIFOs) between processes of one host. It shows
// what a transport implements (transport/link.hpp: link_out, link_in, a
// transport_kind) and that the data plane then runs every frame between the
// processes through it: collectives as messages (TROUPE_ENGINE=messages)
// and point to point, results checked, the bytes counted on both sides.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "check_error.hpp"
#include "forked_ranks.hpp"
#include "scoped_env.hpp"
#include "transport/link.hpp"
#include "troupe/error.hpp"
#include "troupe/troupe.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::test::check_error;

namespace {

/// Bytes this process wrote into and read out of FIFO links.
std::atomic<long> fifo_written{0}, fifo_read{0};

class fifo_out final : public detail::link_out {
 public:
  explicit fifo_out(std::string path) : path_(std::move(path)) {
    ::unlink(path_.c_str());
    if (::mkfifo(path_.c_str(), 0600) != 0)
      throw error(errc::backend, "fifo: mkfifo " + path_ + ": " + std::strerror(errno));
    // Read-write: the open does not wait for the reader, and writes block
    // while the pipe is full.
    fd_ = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ < 0) throw error(errc::backend, "fifo: open " + path_ + ": " + std::strerror(errno));
  }
  ~fifo_out() override {
    close();
    ::unlink(path_.c_str());
  }
  bool write(const void* data, std::size_t n) override {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const auto k = ::write(fd_, p, n);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return false;
      p += k;
      n -= static_cast<std::size_t>(k);
      fifo_written += k;
    }
    return true;
  }
  void close() override {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  std::string address() const override { return path_; }
  void opened() override { ::unlink(path_.c_str()); }  // nobody else may open it now

 private:
  std::string path_;
  int fd_ = -1;
};

class fifo_in final : public detail::link_in {
 public:
  explicit fifo_in(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) throw error(errc::backend, "fifo: open " + path + ": " + std::strerror(errno));
  }
  ~fifo_in() override { ::close(fd_); }
  long read_some(void* data, std::size_t n) override {
    if (closed_) return -1;
    const auto k = ::read(fd_, data, n);
    if (k > 0) fifo_read += k;
    if (k > 0) return k;
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    return -1;  // the writer closed its end
  }
  bool readable() const override {
    pollfd pf{fd_, POLLIN, 0};
    return !closed_ && ::poll(&pf, 1, 0) > 0 && (pf.revents & POLLIN);
  }
  bool wait_readable(std::chrono::milliseconds max, std::chrono::microseconds) override {
    if (closed_) return false;
    pollfd pf{fd_, POLLIN, 0};
    const int n = ::poll(&pf, 1, static_cast<int>(max.count()));
    if (n > 0 && !(pf.revents & POLLIN)) return false;  // hung up, nothing left
    return !closed_;
  }
  void close() override { closed_ = true; }

 private:
  int fd_ = -1;
  std::atomic<bool> closed_{false};
};

detail::transport_kind fifo_transport() {
  detail::transport_kind k;
  k.name = "fifo";
  k.serves = [](const detail::link_pair& pair) { return pair.same_host; };
  k.open_out = [](const detail::link_pair& pair) -> std::unique_ptr<detail::link_out> {
    return std::make_unique<fifo_out>("/tmp/troupe-test-fifo-" + std::to_string(::getpid()) + "-" +
                                      std::to_string(pair.writer) + "-" +
                                      std::to_string(pair.reader));
  };
  k.open_in = [](const std::string& address,
                 const detail::link_pair&) -> std::unique_ptr<detail::link_in> {
    return std::make_unique<fifo_in>(address);
  };
  return k;
}

}  // namespace

TEST_CASE("a transport registered by the program carries every frame between processes") {
  detail::register_transport(fifo_transport());  // the one registration line
  const auto path = test::temp_store_path();
  for (int n : {2, 3}) {
    CAPTURE(n);
    ::unlink(path.c_str());
    auto codes = test::fork_ranks(n, [&](int r) {
      ::setenv("TROUPE_TRANSPORT", "fifo", 1);
      ::setenv("TROUPE_ENGINE", "messages", 1);  // collectives as frames too
      auto s = std::make_shared<file_store>(path, 20s);
      bool ok = true;
      {
        world w{test::child_world(s, r, n, 20s)};
        auto& pg = w.default_group();
        // A collective of 1 MiB and one of 4 bytes.
        auto big = tensor::empty({1 << 18}, dtype::float32);
        for (std::int64_t i = 0; i < big.numel(); ++i) big.data_as<float>()[i] = float(r + i % 7);
        pg.allreduce(big).wait();
        for (std::int64_t i = 0; i < big.numel(); i += 4099)
          ok &= test::expect(r, big.data_as<float>()[i] == float(n * (i % 7) + n * (n - 1) / 2),
                             "allreduce element " + std::to_string(i));
        auto small = tensor::from_vector<int>({r});
        pg.allreduce(small, reduce_op::MAX).wait();
        ok &= test::expect(r, small.to_vector<int>()[0] == n - 1, "allreduce MAX");
        // Point to point around the ring.
        auto out = tensor::from_vector<int>({100 + r}), in = tensor::from_vector<int>({-1});
        auto sent = pg.send(out, (r + 1) % n, 5);
        pg.recv(in, (r + n - 1) % n, 5).wait();
        sent.wait();
        ok &= test::expect(r, in.to_vector<int>()[0] == 100 + (r + n - 1) % n, "recv");
        pg.barrier().wait();
        // Each leaves at once: a peer still in the barrier reads the
        // leaver's last message and goodbye from the link before it closes.
      }
      // Every frame to and from a peer went through the FIFOs: at least the
      // bytes of the large allreduce's ring.
      ok &= test::expect(r, fifo_written.load() > (1 << 20) / n,
                         "written through the fifo links: " + std::to_string(fifo_written));
      ok &= test::expect(r, fifo_read.load() > (1 << 20) / n,
                         "read from the fifo links: " + std::to_string(fifo_read));
      return ok;
    });
    CHECK(codes == std::vector<int>(static_cast<std::size_t>(n), 0));
  }
  ::unlink(path.c_str());
}

TEST_CASE("a transport nobody registered is refused by name") {
  test::scoped_env env{"TROUPE_TRANSPORT", "carrier_pigeon"};
  auto s = std::make_shared<hash_store>();
  check_error([&] { world w{test::child_world(s, 0, 2, 2s)}; }, errc::invalid_argument,
              {"transport 'carrier_pigeon'", "not auto, tcp or a registered transport"});
}
