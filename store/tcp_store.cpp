// tcp_store: a store served by a store actor (store/store_actor.hpp) behind
// the store gate (store/store_gate.hpp), the server's only socket: no CAF port
// is open, and no byte of a client reaches the actor before the client proved
// the job's token. Clients talk the gate's wire (store/store_wire.hpp) through
// a store_client; a client in the server's own process talks to the actor
// through a session of its own.
//
// Errors: connecting that never succeeds within the timeout is errc::store
// ("tcp_store: cannot reach store at host:port ..."), a refused token is
// errc::store naming the token problem, a store answer that does not come in
// time is errc::timeout ("Timeout", the key(s), the ms), a lost server is
// errc::store naming the process that served ("lost the store at host:port
// served by troupe-run (pid 7) on host h: the connection closed"), which the
// server tells every client it admits. Blocking reads send their timeout to the server, which
// answers with the keys still missing when it passes; the client's own limit (the same plus a grace
// period) covers a server that does not answer at all.

#include "troupe/tcp_store.hpp"
#include "base/texts.hpp"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "actors/thread_logger.hpp"
#include "store/store_actor.hpp"
#include "store/store_client.hpp"
#include "store/store_gate.hpp"
#include "transport/handshake.hpp"
#include "troupe/error.hpp"

namespace troupe {
namespace {

using detail::store_actor;
using detail::store_client;
using detail::store_op;
using detail::store_reply;
using detail::store_request;
using ms = std::chrono::milliseconds;

/// Added to the client's request timeouts: the server answers a blocking read at its deadline.
constexpr ms grace{1000};
/// Longest timeout handed on (about ten years), so that deadlines cannot overflow.
constexpr ms max_timeout{315360000000};

ms request_timeout(ms t) {
  return std::clamp(t, ms::zero(), max_timeout - grace) + grace;
}

std::string endpoint(const std::string& host, std::uint16_t port) {
  return host + ":" + std::to_string(port);
}

/// How a server's process is named to its clients: "NAME (pid N) on host H".
std::string identity(const std::string& name) {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = 0;
  const auto pid = std::to_string(::getpid());
  return (name.empty() ? "pid " + pid : name + " (pid " + pid + ")") + " on host " +
         (host[0] ? host : "(unknown)");
}

std::string quoted(const std::vector<std::string>& keys) {
  if (keys.empty()) return "no key";
  if (keys.size() == 1) return "key '" + keys.front() + "'";
  std::string s = "keys [";
  for (std::size_t i = 0; i < keys.size(); ++i) s += (i ? ", '" : "'") + keys[i] + "'";
  return s + "]";
}

}  // namespace

namespace detail {

/// An actor system with a store actor, served through a gate on the public
/// address (of tcp_store_server, or of an is_server store).
struct server_core {
  std::unique_ptr<store_gate> gate;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  store_actor actor;
  std::string token;
  std::string served_by;  // this process, as clients are told
  std::uint16_t port = 0;
  std::shared_ptr<std::atomic<std::uint64_t>> refused =
      std::make_shared<std::atomic<std::uint64_t>>(0);

  server_core(const std::string& bind_address, std::uint16_t want_port, std::string tok,
              const std::string& name)
      : token(std::move(tok)), served_by(identity(name)) {
    if (token.empty())
      throw error(errc::invalid_argument,
                  "tcp_store_server(" + endpoint(bind_address, want_port) +
                      "): empty job token; set TROUPE_JOB_TOKEN (every request must prove it "
                      "belongs to the job)");
    if (token.size() > detail::max_handshake_token)
      throw error(errc::invalid_argument,
                  "tcp_store_server(" + endpoint(bind_address, want_port) +
                      "): the job token has " + std::to_string(token.size()) + " bytes; at most " +
                      std::to_string(detail::max_handshake_token) + " are allowed");
    // The public address is the gate's (its constructor throws naming the address).
    gate = std::make_unique<store_gate>(bind_address, want_port, token, served_by);
    detail::configure_store_system(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
    actor = detail::spawn_store_actor(*sys, token, refused);
    gate->start(*sys, actor);
    port = gate->port();
    release_thread_logger();  // the store may end on another thread
  }
  ~server_core() {
    gate.reset();  // no new connections; the admitted ones close, their sessions end
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    actor = nullptr;
    sys.reset();  // the store actor ends on the exit
  }
};

}  // namespace detail

struct tcp_store_server::impl {
  detail::server_core core;
  impl(const std::string& bind_address, std::uint16_t port, std::string token,
       const std::string& name)
      : core(bind_address, port, std::move(token), name) {}
};

tcp_store_server::tcp_store_server(const std::string& bind_address, std::uint16_t port,
                                   std::string token, std::string name)
    : impl_(std::make_unique<impl>(bind_address, port, std::move(token), name)) {}

tcp_store_server::~tcp_store_server() = default;

std::uint16_t tcp_store_server::port() const noexcept {
  return impl_->core.port;
}

std::uint64_t tcp_store_server::refused_requests() const {
  return impl_->core.refused->load();
}

std::uint64_t tcp_store_server::refused_connections() const {
  return impl_->core.gate ? impl_->core.gate->refused() : 0;
}

std::size_t tcp_store_server::clients() const {
  return impl_->core.gate ? impl_->core.gate->connections() : 0;
}

std::string tcp_store_server::served_by() const {
  return impl_->core.served_by;
}

struct tcp_store::impl {
  std::string host;
  std::uint16_t port = 0;
  std::string token;
  std::string served_by;                        // as the server said
  std::unique_ptr<detail::server_core> server;  // when is_server
  caf::actor session;                           // this client's, with the server in this process
  std::unique_ptr<store_client> client;         // when the server is elsewhere

  ~impl() {
    if (session) caf::anon_send_exit(session, caf::exit_reason::user_shutdown);
    session = nullptr;
    client.reset();
    server.reset();
  }

  /// Asks the store; what became of the request.
  store_client::outcome ask(const store_request& r, ms limit) {
    if (client) return client->call(r, limit);
    struct slot {
      std::mutex m;
      std::condition_variable cv;
      bool done = false;
      store_reply reply;
    };
    auto s = std::make_shared<slot>();
    auto call = std::make_shared<detail::store_call>();
    call->request = r;
    call->done = [s](store_reply reply) {
      std::lock_guard<std::mutex> g{s->m};
      s->reply = std::move(reply);
      s->done = true;
      s->cv.notify_all();
    };
    caf::anon_send(session, std::move(call));
    std::unique_lock<std::mutex> g{s->m};
    if (!s->cv.wait_for(g, std::clamp(limit, ms(0), max_timeout), [&] { return s->done; }))
      return {store_client::outcome::timed_out, {}, {}};
    return {store_client::outcome::answered, std::move(s->reply), {}};
  }

  /// The answer of a request; throws `op`'s error when there is none.
  store_reply answer(const char* op, const std::vector<std::string>& keys, ms timeout,
                     const store_request& r, ms limit) {
    auto o = ask(r, limit);
    if (o.kind == store_client::outcome::timed_out)
      throw error(errc::timeout, std::string(op) + ": " + detail::timeout_after(timeout) +
                                     " waiting for the store at " + endpoint(host, port) +
                                     " to answer (" + quoted(keys) + ")");
    if (o.kind == store_client::outcome::lost)
      throw error(errc::store, std::string(op) + "(" + quoted(keys) + "): lost the store at " +
                                   endpoint(host, port) + " served by " + served_by + ": " + o.why);
    auto& reply = o.reply;
    if (!reply.failed) return std::move(reply);
    if (reply.message == detail::refused_token_message)
      throw error(reply.code, std::string(op) + ": " + reply.message +
                                  " (this process's TROUPE_JOB_TOKEN is not the one the store at " +
                                  endpoint(host, port) + " expects)");
    if (reply.code == errc::store)
      throw error(reply.code, std::string(op) + "(" + quoted(keys) + "): " + reply.message);
    throw error(reply.code, reply.message);  // names the operation already
  }

  /// One request with the store's timeout.
  store_reply call(const char* op, ms timeout, store_request r) {
    return answer(op, r.keys, timeout, r, request_timeout(timeout));
  }

  /// Waits for `keys` (values when `want_values`); throws the timeout naming the missing ones.
  std::vector<bytes> wait(const char* op, const std::vector<std::string>& keys, ms timeout,
                          bool want_values) {
    const auto t = std::clamp(timeout, ms::zero(), max_timeout - grace);
    auto reply =
        answer(op, keys, timeout, store_request{store_op::wait, keys, {}, t.count(), want_values},
               request_timeout(t));
    if (!reply.missing.empty()) throw_timeout(op, reply.missing, timeout);
    return std::move(reply.values);
  }
};

tcp_store::tcp_store(const std::string& host, std::uint16_t port, tcp_store_options opts)
    : store(opts.timeout), impl_(std::make_unique<impl>()) {
  if (opts.token.empty())
    throw error(errc::invalid_argument,
                "tcp_store(" + endpoint(host, port) +
                    "): empty job token; set TROUPE_JOB_TOKEN to the job's secret");
  impl_->host = host;
  impl_->port = port;
  impl_->token = opts.token;
  if (opts.is_server) {
    // The store actor lives in this process: talk to it directly, not through a socket.
    impl_->server = std::make_unique<detail::server_core>(opts.bind_address, port, opts.token,
                                                          opts.server_name);
    impl_->port = impl_->server->port;
    impl_->served_by = impl_->server->served_by;
    impl_->session =
        detail::spawn_store_session(*impl_->server->sys, impl_->server->actor, opts.token);
  } else {
    if (opts.token.size() > detail::max_handshake_token)
      throw error(errc::invalid_argument, "tcp_store(" + endpoint(host, port) +
                                              "): the job token must have 1.." +
                                              std::to_string(detail::max_handshake_token) +
                                              " bytes, not " + std::to_string(opts.token.size()));
    impl_->client = std::make_unique<store_client>(host, port, opts.token,
                                                   std::clamp(opts.timeout, ms(1), max_timeout));
    impl_->served_by = impl_->client->served_by();
  }
}

tcp_store::~tcp_store() = default;

std::uint16_t tcp_store::port() const noexcept {
  return impl_->port;
}

std::string tcp_store::served_by() const {
  return impl_->served_by;
}

void tcp_store::append_on_disconnect(const std::string& key, const bytes& value) {
  if (!impl_->client) return;  // the server lives and dies with this process
  impl_->call("tcp_store.append_on_disconnect", timeout_,
              store_request{store_op::watch, {key}, {value}, 0, false});
}

void tcp_store::set(const std::string& key, const bytes& value) {
  impl_->call("tcp_store.set", timeout_, store_request{store_op::set, {key}, {value}, 0, false});
}

bytes tcp_store::get(const std::string& key) {
  return std::move(impl_->wait("tcp_store.get", {key}, timeout_, true).front());
}

std::int64_t tcp_store::add(const std::string& key, std::int64_t delta) {
  return impl_
      ->call("tcp_store.add", timeout_, store_request{store_op::add, {key}, {}, delta, false})
      .number;
}

bytes tcp_store::compare_set(const std::string& key, const bytes& expected, const bytes& desired) {
  return impl_
      ->call("tcp_store.compare_set", timeout_,
             store_request{store_op::compare_set, {key}, {expected, desired}, 0, false})
      .value;
}

bool tcp_store::check(const std::vector<std::string>& keys) {
  return impl_
      ->call("tcp_store.check", timeout_, store_request{store_op::check, keys, {}, 0, false})
      .flag;
}

void tcp_store::wait(const std::vector<std::string>& keys, duration timeout) {
  impl_->wait("tcp_store.wait", keys, timeout, false);
}

bool tcp_store::delete_key(const std::string& key) {
  return impl_
      ->call("tcp_store.delete_key", timeout_, store_request{store_op::remove, {key}, {}, 0, false})
      .flag;
}

std::int64_t tcp_store::num_keys() {
  return impl_
      ->call("tcp_store.num_keys", timeout_, store_request{store_op::count, {}, {}, 0, false})
      .number;
}

void tcp_store::append(const std::string& key, const bytes& value) {
  impl_->call("tcp_store.append", timeout_,
              store_request{store_op::append, {key}, {value}, 0, false});
}

std::vector<bytes> tcp_store::multi_get(const std::vector<std::string>& keys) {
  return impl_->wait("tcp_store.multi_get", keys, timeout_, true);
}

void tcp_store::multi_set(const std::vector<std::string>& keys, const std::vector<bytes>& values) {
  check_multi_set("tcp_store.multi_set", keys.size(), values.size());
  impl_->call("tcp_store.multi_set", timeout_,
              store_request{store_op::multi_set, keys, values, 0, false});
}

}  // namespace troupe
