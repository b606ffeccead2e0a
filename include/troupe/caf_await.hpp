#pragma once
/// Awaiting a troupe::work from inside a CAF actor without blocking a thread.
///
/// Opt-in: this is the one troupe header that includes CAF, for applications
/// that are CAF actors themselves. Everything else in troupe keeps CAF out of
/// its public headers.
///
///   caf::behavior my_actor(caf::event_based_actor* self, troupe::process_group* pg) {
///     return {[=](caf::atom_value) {
///       auto w = pg->allreduce(t);
///       troupe::await(self, w, std::chrono::seconds(10))
///           .then([=](const troupe::tensor_list& out) { /* ... */ },
///                 [=](caf::error& e) { /* failed or timed out */ });
///     }};
///   }
///
/// The response arrives as an ordinary message to `self`; the work's error is
/// delivered as a caf::error whose context holds the message (render it with
/// self->system().render(e)).

#include <caf/all.hpp>

#include <chrono>

#include "troupe/work.hpp"

#ifndef TROUPE_TENSOR_LIST_MESSAGE_TYPE
#define TROUPE_TENSOR_LIST_MESSAGE_TYPE
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::tensor_list)
#endif
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::work)

namespace troupe {

namespace caf_interop {
using await_atom = caf::atom_constant<caf::atom("tr_await")>;
using done_atom = caf::atom_constant<caf::atom("tr_done")>;
using expire_atom = caf::atom_constant<caf::atom("tr_expire")>;

/// A short-lived actor that answers one await request when `w` completes, or
/// with request_timeout after `timeout` (then it quits, so it never outlives
/// the wait and never holds up the actor system's shutdown).
inline caf::behavior awaiter(caf::event_based_actor* self, work w,
                             std::chrono::milliseconds timeout) {
  return {
      [self, w, timeout](await_atom) -> caf::result<tensor_list> {
        auto rp = self->make_response_promise<tensor_list>();
        auto me = caf::actor_cast<caf::actor>(self);
        // The callback runs on whichever thread completes the work: hop back
        // into this actor before touching the promise.
        w.on_complete([me](const work&) { caf::anon_send(me, done_atom::value); });
        self->delayed_send(self, timeout, expire_atom::value);
        self->become(
            [self, rp](expire_atom) mutable {
              rp.deliver(caf::make_error(caf::sec::request_timeout));
              self->quit();
            },
            [self, w, rp](done_atom) mutable {
              if (w.is_success()) {
                rp.deliver(w.result());
              } else {
                std::string what = "work failed";
                try {
                  std::rethrow_exception(w.exception());
                } catch (const std::exception& e) {
                  what = e.what();
                }
                rp.deliver(caf::make_error(caf::sec::runtime_error, std::move(what)));
              }
              self->quit();
            });
        return rp;
      },
  };
}
}  // namespace caf_interop

/// Requests the outputs of `w` as a message to `self`; continue with
/// `.then(on_outputs, on_error)`. Fails with request_timeout after `timeout`.
template <class Self>
auto await(Self* self, const work& w, std::chrono::milliseconds timeout) {
  auto helper = self->system().spawn(caf_interop::awaiter, w, timeout);
  return self->request(helper, caf::infinite, caf_interop::await_atom::value);
}

}  // namespace troupe
