#pragma once
/// troupe::tcp_store — a store served over TCP, for ranks in several
/// processes or on several hosts.
///
/// The server is a CAF actor (troupe-run serves it for the jobs it starts;
/// under other launchers rank 0 hosts it; `troupe-store` runs it standalone)
/// behind one socket, host:port, and no other: every connection must first
/// present the job's secret token (strangers' connections cost bounded work
/// and cannot crowd out the job's own: transport/pending_handshakes.hpp),
/// and only then are its requests read (troupe's own length-prefixed
/// messages, at most 1 GiB each) and passed to the actor. A connection with
/// a wrong token, garbage or nothing in time is refused, logged and counted,
/// and a client with a wrong token fails to connect. Clients get the full store interface with the same timeouts and
/// errors. The server keeps serving when a client disconnects or dies; when
/// the server's process dies, its clients' calls fail naming that process
/// (the server tells each client who it is when it admits it).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "troupe/store.hpp"

namespace troupe {

struct tcp_store_options {
  /// Host this process's server (in-process) and connect to it.
  bool is_server = false;
  /// Address the server binds to; loopback unless set (security baseline).
  std::string bind_address = "127.0.0.1";
  /// The job's secret (TROUPE_JOB_TOKEN); must match the server's.
  std::string token;
  /// Timeout of blocking calls and of connecting.
  store::duration timeout = store::default_timeout;
  /// With is_server: how the server names its process to clients ("rank 0");
  /// they say "served by NAME (pid N) on host H" when it is lost.
  std::string server_name;
};

/// Runs a store server until stop() or destruction (what troupe-store does).
class tcp_store_server {
 public:
  /// Binds host:port (port 0 picks a free port); throws errc::store naming the
  /// address when it cannot. `name` is how clients name this process when
  /// they lose it ("troupe-run", "troupe-store"), with its pid and host.
  tcp_store_server(const std::string& bind_address, std::uint16_t port, std::string token,
                   std::string name = {});
  ~tcp_store_server();
  tcp_store_server(const tcp_store_server&) = delete;
  tcp_store_server& operator=(const tcp_store_server&) = delete;
  std::uint16_t port() const noexcept;
  /// Requests refused for a missing or wrong token so far (by the store actor,
  /// behind the gate).
  std::uint64_t refused_requests() const;
  /// Connections the gate refused so far: wrong token, not a troupe store
  /// client, garbled, silent or slow, or dropped to make room for newer ones.
  std::uint64_t refused_connections() const;
  /// Clients connected now (connections that proved the token and are open).
  std::size_t clients() const;
  /// Who serves, as clients are told: "NAME (pid N) on host H".
  std::string served_by() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

class tcp_store final : public store {
 public:
  /// Connects to the server at host:port (starting it first when is_server).
  tcp_store(const std::string& host, std::uint16_t port, tcp_store_options opts = {});
  ~tcp_store() override;
  void set(const std::string& key, const bytes& value) override;
  bytes get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  bytes compare_set(const std::string& key, const bytes& expected, const bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, duration timeout) override;
  bool delete_key(const std::string& key) override;
  std::int64_t num_keys() override;
  void append(const std::string& key, const bytes& value) override;
  std::vector<bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<bytes>& values) override;
  using store::set;
  using store::wait;
  /// The server's port (useful with port 0 and is_server).
  std::uint16_t port() const noexcept;
  /// Who serves the store, as the server said when it admitted this client:
  /// "NAME (pid N) on host H" ("pid N on host H" for a server without a name).
  std::string served_by() const;
  /// Asks the server to append `value` to `key` should this client's
  /// connection end without the client closing it (its process died), so
  /// that others can tell (like an ephemeral node). Does nothing when this
  /// process hosts the server (is_server): they end together.
  void append_on_disconnect(const std::string& key, const bytes& value);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
