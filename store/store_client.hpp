#pragma once
// store_client — a tcp_store client's connection to the server's gate
// (store/store_gate.hpp): it presents the job's token, then sends store_wire
// requests (store/store_wire.hpp) from any thread and a reader thread of its
// own hands each answer to the call waiting for it. When the connection
// ends, every open and later call fails at once, naming why.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "store/store_wire.hpp"

namespace troupe::detail {

class store_client {
 public:
  /// What became of a call.
  struct outcome {
    enum kind_t { answered, timed_out, lost } kind = lost;
    store_reply reply;  ///< when answered
    std::string why;    ///< when lost
  };

  /// Connects to host:port and presents `token`, retrying until `timeout`
  /// passes (also when the store dropped the connection before it answered:
  /// a store under a flood of strangers makes room so). Throws errc::store:
  /// "tcp_store: cannot reach store at host:port within T ms: why", or at
  /// once when the store refuses the token.
  store_client(std::string host, std::uint16_t port, std::string token,
               std::chrono::milliseconds timeout);
  /// Says goodbye (the server then takes the end for a normal one), closes
  /// and joins the reader.
  ~store_client();
  store_client(const store_client&) = delete;
  store_client& operator=(const store_client&) = delete;

  /// Sends `r` and waits up to `limit` for its answer.
  outcome call(const store_request& r, std::chrono::milliseconds limit);
  /// Who serves, as the store said when it admitted this client.
  const std::string& served_by() const noexcept { return served_by_; }

 private:
  struct slot {
    store_op op;
    bool done = false;
    store_reply reply;
  };
  void read_loop();
  void lose(const std::string& why);

  std::string where_;
  std::string served_by_;
  int fd_ = -1;
  std::mutex write_mtx_;
  std::mutex mtx_;  // guards open_, next_, lost_
  std::condition_variable answered_;
  std::map<std::uint64_t, std::shared_ptr<slot>> open_;
  std::uint64_t next_ = 1;
  std::string lost_;  // why the connection ended (empty while it is open)
  std::thread reader_;
};

}  // namespace troupe::detail
