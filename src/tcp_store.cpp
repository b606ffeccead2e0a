// tcp_store: a store served by a published store actor (actors/store_actor.hpp).
//
// No byte reaches CAF before the job token is proven (src/store_gate.hpp): the
// server publishes its actor on 127.0.0.1 only, behind a store_gate on the
// public address; a client's middleman connects to its own store_forwarder,
// which presents the token to the gate and then carries the BASP bytes.
//
// Errors: connecting that never succeeds within the timeout is errc::store
// ("tcp_store: cannot reach store at host:port ..."), a refused token is
// errc::store naming the token problem, a store answer that does not come in
// time is errc::timeout ("Timeout", the key(s), the ms), a lost server is
// errc::store. Blocking reads send their timeout to the server, which answers
// with the keys still missing when it passes; the client's own request timeout
// (the same plus a grace period) covers a server that does not answer at all.

#include "troupe/tcp_store.hpp"

#include <caf/io/all.hpp>

#include <thread>

#include "actors/store_actor.hpp"
#include "src/store_gate.hpp"
#include "troupe/error.hpp"

namespace troupe {
namespace {

using detail::store_actor;
using ms = std::chrono::milliseconds;

/// Added to the client's request timeouts: the server answers a blocking read at its deadline.
constexpr ms grace{1000};
/// Longest timeout passed to CAF (about ten years), so that deadlines cannot overflow.
constexpr ms max_timeout{315360000000};

ms request_timeout(ms t) {
  return std::clamp(t, ms::zero(), max_timeout - grace) + grace;
}

std::string endpoint(const std::string& host, std::uint16_t port) {
  return host + ":" + std::to_string(port);
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

/// An actor system with a store actor published on loopback, behind a gate on the public address
/// (of tcp_store_server, or of an is_server store).
struct server_core {
  std::unique_ptr<store_gate> gate;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  store_actor actor;
  std::uint16_t port = 0;
  std::shared_ptr<std::atomic<std::uint64_t>> refused =
      std::make_shared<std::atomic<std::uint64_t>>(0);

  server_core(const std::string& bind_address, std::uint16_t want_port, std::string token) {
    if (token.empty())
      throw error(errc::invalid_argument,
                  "tcp_store_server(" + endpoint(bind_address, want_port) +
                      "): empty job token; set TROUPE_JOB_TOKEN (every request must prove it "
                      "belongs to the job)");
    if (token.size() > gate_max_token)
      throw error(errc::invalid_argument, "tcp_store_server(" + endpoint(bind_address, want_port) +
                                              "): the job token has " +
                                              std::to_string(token.size()) + " bytes; at most " +
                                              std::to_string(gate_max_token) + " are allowed");
    // The public address is the gate's (its constructor throws naming the address).
    gate = std::make_unique<store_gate>(bind_address, want_port, token);
    detail::configure_store_system(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
    actor = detail::spawn_store_actor(*sys, std::move(token), refused);
    // Internal only: reachable from this host, and from elsewhere only through the gate.
    auto bound = caf::io::publish(actor, 0, "127.0.0.1", true);
    if (!bound) {
      const auto reason = sys->render(bound.error());
      shutdown();
      throw error(errc::store, "tcp_store_server(" + endpoint(bind_address, want_port) +
                                   "): cannot publish the store on 127.0.0.1: " + reason);
    }
    gate->start(*bound);
    port = gate->port();
  }
  ~server_core() { shutdown(); }

  void shutdown() {
    gate.reset();  // no new connections; the admitted ones close
    if (actor) {
      caf::io::unpublish(actor);
      caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
      actor = nullptr;
    }
    sys.reset();  // the store actor ends on the exit; connections close with the middleman
  }
};

}  // namespace detail

struct tcp_store_server::impl {
  detail::server_core core;
  impl(const std::string& bind_address, std::uint16_t port, std::string token)
      : core(bind_address, port, std::move(token)) {}
};

tcp_store_server::tcp_store_server(const std::string& bind_address, std::uint16_t port,
                                   std::string token)
    : impl_(std::make_unique<impl>(bind_address, port, std::move(token))) {}

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

struct tcp_store::impl {
  std::string host;
  std::uint16_t port = 0;
  std::string token;
  std::unique_ptr<detail::server_core> server;         // when is_server
  std::unique_ptr<detail::store_forwarder> forwarder;  // `own`'s way to the gate of host:port
  caf::actor_system_config cfg;                        // of `own` (when reaching a remote server)
  std::unique_ptr<caf::actor_system> own;
  caf::actor_system* sys = nullptr;  // `own` or the server's
  store_actor actor;                 // the store actor, or the relay to a remote one

  ~impl() {
    if (own && actor) caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);  // the relay
    actor = nullptr;
    own.reset();
    forwarder.reset();  // after `own`: its connections have closed
    server.reset();
  }

  /// Reaches the store actor at host:port, retrying until `timeout` passes.
  void connect(ms timeout) {
    forwarder = std::make_unique<detail::store_forwarder>(host, port, token,
                                                          std::clamp(timeout, ms(1), max_timeout));
    detail::configure_store_system(cfg);
    own = std::make_unique<caf::actor_system>(cfg);
    sys = own.get();
    const auto deadline =
        std::chrono::steady_clock::now() + std::clamp(timeout, ms(0), max_timeout);
    const auto expected = sys->message_types(caf::detail::type_list<store_actor>{});
    auto pause = ms(10);
    std::string reason = "no attempt within the timeout";
    for (;;) {
      const auto left = std::chrono::duration_cast<ms>(deadline - std::chrono::steady_clock::now());
      if (left <= ms::zero()) break;
      // The middleman's connect request, so that even a connect that hangs obeys the timeout.
      caf::scoped_actor self{*sys};
      bool done = false;
      // CAF reaches the store through this process's forwarder (which proves the token first).
      self->request(sys->middleman().actor_handle(), left, caf::connect_atom::value,
                    std::string("127.0.0.1"), forwarder->port())
          .receive(
              [&](const caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>& ifs) {
                if (!ptr) {
                  reason = "no actor is published on that port";
                } else if (ifs != expected) {
                  reason = "the actor published there is not a troupe store";
                } else {
                  actor = detail::spawn_store_relay(
                      *sys, caf::actor_cast<store_actor>(std::move(ptr)), endpoint(host, port));
                  done = true;
                }
              },
              [&](caf::error& e) {
                reason = forwarder->take_failure();
                if (reason.empty()) reason = sys->render(e);
              });
      if (done) return;
      if (forwarder->token_refused())
        throw error(errc::store, "tcp_store: the store at " + endpoint(host, port) +
                                     " refused this process's job token (TROUPE_JOB_TOKEN is not " +
                                     "the one the store expects)");
      std::this_thread::sleep_for(std::min(
          pause, std::chrono::duration_cast<ms>(deadline - std::chrono::steady_clock::now())));
      pause = std::min(pause * 2, ms(500));
    }
    throw error(errc::store, "tcp_store: cannot reach store at " + endpoint(host, port) +
                                 " within " + std::to_string(timeout.count()) + " ms: " + reason);
  }

  /// Turns a failed request into the exception of `op` on `keys`.
  [[noreturn]] void fail(const char* op, const std::vector<std::string>& keys, ms timeout,
                         const caf::error& e) const {
    if (e.category() == caf::atom("troupe") && e.context().match_elements<std::string>()) {
      const auto code = static_cast<errc>(e.code() - 1);
      const auto& what = e.context().get_as<std::string>(0);
      if (what == detail::refused_token_message)
        throw error(code, std::string(op) + ": " + what + " (this process's TROUPE_JOB_TOKEN " +
                              "is not the one the store at " + endpoint(host, port) + " expects)");
      if (code == errc::store)
        throw error(code, std::string(op) + "(" + quoted(keys) + "): " + what);
      throw error(code, what);  // names the operation already
    }
    if (e == caf::sec::request_timeout)
      throw error(errc::timeout, std::string(op) + ": Timeout after " +
                                     std::to_string(timeout.count()) +
                                     " ms waiting for the store at " + endpoint(host, port) +
                                     " to answer (" + quoted(keys) + ")");
    throw error(errc::store, std::string(op) + "(" + quoted(keys) + "): lost the store at " +
                                 endpoint(host, port) + ": " + sys->render(e));
  }

  /// Sends one request; runs `on_reply` on the answer, throws `op`'s error otherwise.
  template <class OnReply, class... Ts>
  void ask(const char* op, const std::vector<std::string>& keys, ms timeout, ms limit,
           OnReply on_reply, Ts&&... xs) {
    caf::scoped_actor self{*sys};
    caf::error err;
    self->request(actor, limit, std::forward<Ts>(xs)...).receive(on_reply, [&](caf::error& e) {
      err = std::move(e);
    });
    if (err) fail(op, keys, timeout, err);
  }

  /// One request answered by a single value of type R.
  template <class R, class... Ts>
  R call(const char* op, const std::vector<std::string>& keys, ms timeout, Ts&&... xs) {
    R out{};
    ask(
        op, keys, timeout, request_timeout(timeout), [&](R& r) { out = std::move(r); },
        std::forward<Ts>(xs)...);
    return out;
  }

  /// Waits for `keys` (values when `want_values`); throws the timeout naming the missing ones.
  std::vector<bytes> wait(const char* op, const std::vector<std::string>& keys, ms timeout,
                          bool want_values) {
    std::vector<std::string> missing;
    std::vector<bytes> values;
    const auto t = std::clamp(timeout, ms::zero(), max_timeout - grace);
    ask(
        op, keys, timeout, request_timeout(t),
        [&](std::vector<std::string>& m, std::vector<bytes>& v) {
          missing = std::move(m);
          values = std::move(v);
        },
        detail::kv_wait_atom::value, token, keys, static_cast<std::int64_t>(t.count()),
        want_values);
    if (!missing.empty()) throw_timeout(op, missing, timeout);
    return values;
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
    impl_->server = std::make_unique<detail::server_core>(opts.bind_address, port, opts.token);
    impl_->port = impl_->server->port;
    impl_->sys = impl_->server->sys.get();
    impl_->actor = impl_->server->actor;
  } else {
    impl_->connect(opts.timeout);
  }
}

tcp_store::~tcp_store() = default;

std::uint16_t tcp_store::port() const noexcept {
  return impl_->port;
}

void tcp_store::set(const std::string& key, const bytes& value) {
  impl_->call<bool>("tcp_store.set", {key}, timeout_, detail::kv_set_atom::value, impl_->token, key,
                    value);
}

bytes tcp_store::get(const std::string& key) {
  return std::move(impl_->wait("tcp_store.get", {key}, timeout_, true).front());
}

std::int64_t tcp_store::add(const std::string& key, std::int64_t delta) {
  return impl_->call<std::int64_t>("tcp_store.add", {key}, timeout_, detail::kv_add_atom::value,
                                   impl_->token, key, delta);
}

bytes tcp_store::compare_set(const std::string& key, const bytes& expected, const bytes& desired) {
  return impl_->call<bytes>("tcp_store.compare_set", {key}, timeout_, detail::kv_cas_atom::value,
                            impl_->token, key, expected, desired);
}

bool tcp_store::check(const std::vector<std::string>& keys) {
  return impl_->call<bool>("tcp_store.check", keys, timeout_, detail::kv_check_atom::value,
                           impl_->token, keys);
}

void tcp_store::wait(const std::vector<std::string>& keys, duration timeout) {
  impl_->wait("tcp_store.wait", keys, timeout, false);
}

bool tcp_store::delete_key(const std::string& key) {
  return impl_->call<bool>("tcp_store.delete_key", {key}, timeout_, detail::kv_del_atom::value,
                           impl_->token, key);
}

std::int64_t tcp_store::num_keys() {
  return impl_->call<std::int64_t>("tcp_store.num_keys", {}, timeout_, detail::kv_count_atom::value,
                                   impl_->token);
}

void tcp_store::append(const std::string& key, const bytes& value) {
  impl_->call<bool>("tcp_store.append", {key}, timeout_, detail::kv_append_atom::value,
                    impl_->token, key, value);
}

std::vector<bytes> tcp_store::multi_get(const std::vector<std::string>& keys) {
  return impl_->wait("tcp_store.multi_get", keys, timeout_, true);
}

void tcp_store::multi_set(const std::vector<std::string>& keys, const std::vector<bytes>& values) {
  check_multi_set("tcp_store.multi_set", keys.size(), values.size());
  impl_->call<bool>("tcp_store.multi_set", keys, timeout_, detail::kv_mset_atom::value,
                    impl_->token, keys, values);
}

}  // namespace troupe
