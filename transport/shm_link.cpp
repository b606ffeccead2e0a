// The transport "shm" (transport/link.hpp): links through a ring in shared
// memory (transport/shm_ring.hpp) between processes of one host, one ring
// per direction and pair of ranks, named "troupe-ring-WRITER-READER".

#include <memory>
#include <utility>

#include "transport/link.hpp"
#include "transport/shm_ring.hpp"

namespace troupe::detail {
namespace {

constexpr const char* ring_prefix = "troupe-ring-";
constexpr std::size_t ring_capacity = std::size_t{4} << 20;

class ring_out final : public link_out {
 public:
  explicit ring_out(std::unique_ptr<shm_ring> r) : ring_(std::move(r)) {}
  bool write(const void* data, std::size_t n) override { return ring_->write(data, n); }
  bool write_until(const void* data, std::size_t n, std::chrono::steady_clock::time_point deadline,
                   std::size_t* written) override {
    return ring_->write_until(data, n, deadline, written);
  }
  void close() override { ring_->close(); }
  bool writes_by_copy() const noexcept override { return true; }
  std::string address() const override { return ring_->name(); }
  void opened() override { ring_->opened_by_reader(); }
  std::size_t writable() const override { return ring_->writable(); }

 private:
  std::unique_ptr<shm_ring> ring_;
};

class ring_in final : public link_in {
 public:
  explicit ring_in(std::unique_ptr<shm_ring> r) : ring_(std::move(r)) {}
  long read_some(void* data, std::size_t n) override { return ring_->read_some(data, n); }
  void publish_read() override { ring_->publish_read(); }
  bool readable() const override { return ring_->readable(); }
  bool wait_readable(std::chrono::milliseconds max, std::chrono::microseconds linger) override {
    return ring_->wait_readable(max, linger);
  }
  bool polling(int delta) override { return ring_->polling(delta); }
  void wake_reader() override { ring_->wake_reader(); }
  void close() override { ring_->close(); }

 private:
  std::unique_ptr<shm_ring> ring_;
};

}  // namespace

transport_kind shm_ring_transport() {
  transport_kind k;
  k.name = "shm";
  k.serves = [](const link_pair& pair) { return pair.same_host; };
  k.open_out = [](const link_pair& pair) -> std::unique_ptr<link_out> {
    return std::make_unique<ring_out>(shm_ring::create(
        std::string(ring_prefix) + std::to_string(pair.writer) + "-" + std::to_string(pair.reader),
        ring_capacity));
  };
  k.open_in = [](const std::string& address, const link_pair& pair) -> std::unique_ptr<link_in> {
    return std::make_unique<ring_in>(shm_ring::open(address, pair.writer_pid, ring_prefix));
  };
  k.maps_memory = true;
  return k;
}

}  // namespace troupe::detail
