// The store actor: a key-value map served to tcp_store clients (protocol in
// store/store_actor.hpp).
//
// Terms: a waiter is a kv_wait request whose keys are not all present yet; it
// holds the caller's promise until every key exists (answered after each
// write), its deadline passes (answered with the missing keys) or its caller
// goes away (dropped; the server monitors each waiting caller).

#include "store/store_actor.hpp"

#include "transport/handshake.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include "troupe/error.hpp"

namespace troupe::detail {
namespace {

/// Gives the actor the counter helper every store shares (identical messages).
struct store_helpers : store {
  using store::add_to_counter;
};

struct waiter {
  std::vector<std::string> keys;
  bool want_values = false;
  caf::response_promise rp;
  caf::actor_addr caller;
};

struct store_state {
  std::string token;
  std::shared_ptr<std::atomic<std::uint64_t>> refused;
  std::map<std::string, bytes> data;
  std::map<std::uint64_t, waiter> waiters;  // by id, in arrival order
  std::uint64_t next_waiter = 0;
  std::map<caf::actor_addr, int> watched;  // monitored callers -> their waiters
  static inline const char* name = "troupe_store";
};

using store_ptr = store_actor::stateful_pointer<store_state>;
using wait_result = caf::result<std::vector<std::string>, std::vector<bytes>>;

/// Whether the request carries the job's token; counts and logs a refusal.
bool admitted(store_ptr self, const std::string& token) {
  if (same_token(token, self->state.token)) return true;
  self->state.refused->fetch_add(1);
  const auto peer = caf::to_string(self->current_sender());
  std::fprintf(stderr, "[troupe store] refused request from %s: wrong job token\n", peer.c_str());
  return false;
}

caf::error refusal() {
  return make_troupe_error(static_cast<int>(errc::store), refused_token_message);
}

std::vector<std::string> missing_keys(const store_state& st, const std::vector<std::string>& keys) {
  std::vector<std::string> missing;
  for (const auto& k : keys)
    if (st.data.count(k) == 0) missing.push_back(k);
  return missing;
}

std::vector<bytes> values_of(const store_state& st, const std::vector<std::string>& keys) {
  std::vector<bytes> values;
  values.reserve(keys.size());
  for (const auto& k : keys) values.push_back(st.data.at(k));
  return values;
}

/// Stops counting a waiter of `caller`; demonitors it after its last one.
void unwatch(store_ptr self, const caf::actor_addr& caller) {
  auto it = self->state.watched.find(caller);
  if (it == self->state.watched.end() || --it->second > 0) return;
  self->demonitor(caller);
  self->state.watched.erase(it);
}

/// After a write: answers every waiter whose keys all exist now.
void serve_waiters(store_ptr self) {
  auto& st = self->state;
  for (auto it = st.waiters.begin(); it != st.waiters.end();) {
    auto& w = it->second;
    if (!missing_keys(st, w.keys).empty()) {
      ++it;
      continue;
    }
    w.rp.deliver(std::vector<std::string>{},
                 w.want_values ? values_of(st, w.keys) : std::vector<bytes>{});
    unwatch(self, w.caller);
    it = st.waiters.erase(it);
  }
}

/// Handles kv_wait: answers now, or keeps a waiter until the keys exist or `timeout_ms` passes.
wait_result wait_for(store_ptr self, std::vector<std::string>& keys, std::int64_t timeout_ms,
                     bool want_values) {
  auto& st = self->state;
  auto missing = missing_keys(st, keys);
  if (missing.empty())
    return wait_result{std::vector<std::string>{},
                       want_values ? values_of(st, keys) : std::vector<bytes>{}};
  if (timeout_ms <= 0) return wait_result{std::move(missing), std::vector<bytes>{}};
  const auto id = st.next_waiter++;
  auto rp = self->make_response_promise();
  caf::actor_addr caller;
  if (const auto& src = rp.source()) {
    caller = src->address();
    if (st.watched[caller]++ == 0) self->monitor(src);
  }
  st.waiters.emplace(id, waiter{std::move(keys), want_values, rp, caller});
  // Clamped so that the deadline cannot overflow the clock (about ten years).
  const auto limit = std::min<std::int64_t>(timeout_ms, std::int64_t{315360000000});
  self->delayed_send(self, std::chrono::milliseconds(limit), kv_expire_atom::value, id);
  return rp;
}

/// Runs a write that may throw troupe::error (add's counter check) and turns it into an error.
template <class F>
auto guarded(F&& f) -> caf::result<decltype(f())> {
  try {
    return f();
  } catch (const error& e) {
    return make_troupe_error(static_cast<int>(e.code()), e.what());
  } catch (const std::exception& e) {
    return make_troupe_error(static_cast<int>(errc::store), e.what());
  }
}

store_actor::behavior_type store_behavior(store_ptr self, std::string token,
                                          std::shared_ptr<std::atomic<std::uint64_t>> refused) {
  self->state.token = std::move(token);
  self->state.refused = std::move(refused);
  // A caller that left (disconnected, killed, timed out) no longer needs its waiters.
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    st.watched.erase(dm.source);
    for (auto it = st.waiters.begin(); it != st.waiters.end();)
      it = it->second.caller == dm.source ? st.waiters.erase(it) : std::next(it);
  });
  // On shutdown, waiting callers learn why instead of running into their timeout.
  self->set_exit_handler([self](caf::exit_msg& msg) {
    for (auto& [id, w] : self->state.waiters)
      w.rp.deliver(make_troupe_error(static_cast<int>(errc::store), "the store server shut down"));
    self->state.waiters.clear();
    self->quit(msg.reason);
  });
  return {
      [self](kv_set_atom, const std::string& tok, const std::string& key,
             bytes& value) -> caf::result<bool> {
        if (!admitted(self, tok)) return refusal();
        self->state.data[key] = std::move(value);
        serve_waiters(self);
        return true;
      },
      [self](kv_mset_atom, const std::string& tok, const std::vector<std::string>& keys,
             std::vector<bytes>& values) -> caf::result<bool> {
        if (!admitted(self, tok)) return refusal();
        if (keys.size() != values.size())
          return make_troupe_error(static_cast<int>(errc::invalid_argument),
                                   "tcp_store.multi_set: got " + std::to_string(keys.size()) +
                                       " keys but " + std::to_string(values.size()) + " values");
        for (std::size_t i = 0; i < keys.size(); ++i)
          self->state.data[keys[i]] = std::move(values[i]);
        serve_waiters(self);
        return true;
      },
      [self](kv_add_atom, const std::string& tok, const std::string& key,
             std::int64_t delta) -> caf::result<std::int64_t> {
        if (!admitted(self, tok)) return refusal();
        return guarded([&] {
          auto& data = self->state.data;
          auto it = data.find(key);
          auto value = store_helpers::add_to_counter(
              "tcp_store.add", key, it == data.end() ? nullptr : &it->second, delta);
          data[key] = to_bytes(std::to_string(value));
          serve_waiters(self);
          return value;
        });
      },
      [self](kv_cas_atom, const std::string& tok, const std::string& key, const bytes& expected,
             bytes& desired) -> caf::result<bytes> {
        if (!admitted(self, tok)) return refusal();
        auto& data = self->state.data;
        auto it = data.find(key);
        if (it == data.end() && !expected.empty()) return expected;
        if (it != data.end() && it->second != expected) return it->second;
        data[key] = desired;
        serve_waiters(self);
        return desired;
      },
      [self](kv_append_atom, const std::string& tok, const std::string& key,
             const bytes& value) -> caf::result<bool> {
        if (!admitted(self, tok)) return refusal();
        auto& v = self->state.data[key];
        v.insert(v.end(), value.begin(), value.end());
        serve_waiters(self);
        return true;
      },
      [self](kv_check_atom, const std::string& tok,
             const std::vector<std::string>& keys) -> caf::result<bool> {
        if (!admitted(self, tok)) return refusal();
        return missing_keys(self->state, keys).empty();
      },
      [self](kv_wait_atom, const std::string& tok, std::vector<std::string>& keys,
             std::int64_t timeout_ms, bool want_values) -> wait_result {
        if (!admitted(self, tok)) return refusal();
        return wait_for(self, keys, timeout_ms, want_values);
      },
      [self](kv_del_atom, const std::string& tok, const std::string& key) -> caf::result<bool> {
        if (!admitted(self, tok)) return refusal();
        return self->state.data.erase(key) != 0;
      },
      [self](kv_count_atom, const std::string& tok) -> caf::result<std::int64_t> {
        if (!admitted(self, tok)) return refusal();
        return static_cast<std::int64_t>(self->state.data.size());
      },
      [self](kv_expire_atom, std::uint64_t id) {
        if (self->current_sender() != self->ctrl()) return;
        auto& st = self->state;
        auto it = st.waiters.find(id);
        if (it == st.waiters.end()) return;  // answered or dropped already
        auto& w = it->second;
        w.rp.deliver(missing_keys(st, w.keys), std::vector<bytes>{});
        unwatch(self, w.caller);
        st.waiters.erase(it);
      },
  };
}

/// A store_reply carrying the failure `e` (a troupe error keeps its code and message).
store_reply failure(caf::actor_system& sys, const caf::error& e) {
  store_reply r;
  r.failed = true;
  if (e.category() == caf::atom("troupe") && e.context().match_elements<std::string>()) {
    r.code = static_cast<errc>(e.code() - 1);
    r.message = e.context().get_as<std::string>(0);
  } else {
    r.code = errc::store;
    r.message = sys.render(e);
  }
  return r;
}

caf::behavior session_behavior(caf::event_based_actor* self, store_actor server,
                               std::string token) {
  return {
      [self, server, token](store_call_ptr& c) {
        const auto& q = c->request;
        auto& sys = self->system();
        auto fail = [c, &sys](caf::error& e) { c->done(failure(sys, e)); };
        const auto key = q.keys.empty() ? std::string() : q.keys.front();
        const auto value = q.values.empty() ? bytes() : q.values.front();
        auto ok = [c](bool) { c->done(store_reply{}); };
        switch (q.op) {
          case store_op::set:
            self->request(server, caf::infinite, kv_set_atom::value, token, key, value)
                .then(ok, fail);
            return;
          case store_op::multi_set:
            self->request(server, caf::infinite, kv_mset_atom::value, token, q.keys, q.values)
                .then(ok, fail);
            return;
          case store_op::add:
            self->request(server, caf::infinite, kv_add_atom::value, token, key, q.number)
                .then(
                    [c](std::int64_t v) {
                      store_reply r;
                      r.number = v;
                      c->done(std::move(r));
                    },
                    fail);
            return;
          case store_op::compare_set:
            self->request(server, caf::infinite, kv_cas_atom::value, token, key, q.values.at(0),
                          q.values.at(1))
                .then(
                    [c](bytes& v) {
                      store_reply r;
                      r.value = std::move(v);
                      c->done(std::move(r));
                    },
                    fail);
            return;
          case store_op::append:
            self->request(server, caf::infinite, kv_append_atom::value, token, key, value)
                .then(ok, fail);
            return;
          case store_op::check:
          case store_op::remove: {
            auto flag = [c](bool v) {
              store_reply r;
              r.flag = v;
              c->done(std::move(r));
            };
            if (q.op == store_op::check)
              self->request(server, caf::infinite, kv_check_atom::value, token, q.keys)
                  .then(flag, fail);
            else
              self->request(server, caf::infinite, kv_del_atom::value, token, key).then(flag, fail);
            return;
          }
          case store_op::wait:
            self->request(server, caf::infinite, kv_wait_atom::value, token, q.keys, q.number,
                          q.flag)
                .then(
                    [c](std::vector<std::string>& missing, std::vector<bytes>& values) {
                      store_reply r;
                      r.missing = std::move(missing);
                      r.values = std::move(values);
                      c->done(std::move(r));
                    },
                    fail);
            return;
          case store_op::count:
            self->request(server, caf::infinite, kv_count_atom::value, token)
                .then(
                    [c](std::int64_t v) {
                      store_reply r;
                      r.number = v;
                      c->done(std::move(r));
                    },
                    fail);
            return;
          case store_op::watch:
          case store_op::goodbye:
            break;
        }
        store_reply r;
        r.failed = true;
        r.message = "tcp_store: a request the store session does not serve";
        c->done(std::move(r));
      },
  };
}

}  // namespace

caf::actor spawn_store_session(caf::actor_system& sys, store_actor server, std::string token) {
  return sys.spawn(session_behavior, std::move(server), std::move(token));
}

void configure_store_system(caf::actor_system_config& cfg) {
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.add_message_type<bytes>("troupe_bytes");
  cfg.add_message_type<std::vector<bytes>>("troupe_bytes_list");
}

store_actor spawn_store_actor(caf::actor_system& sys, std::string token,
                              std::shared_ptr<std::atomic<std::uint64_t>> refused) {
  return sys.spawn(store_behavior, std::move(token), std::move(refused));
}

}  // namespace troupe::detail
