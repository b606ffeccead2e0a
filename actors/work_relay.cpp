// The work relay: turns the group actor's response promise into the
// completion of a troupe::work.

#include "actors/rank_runtime.hpp"
#include "base/callback_pool.hpp"
#include "base/texts.hpp"
#include "base/work_state.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

// CAF treats an error with code 0 as "no error" (errc::invalid_argument is 0),
// so the code travels offset by one.
caf::error make_troupe_error(int code, std::string message) {
  return caf::error{static_cast<std::uint8_t>(code + 1), caf::atom("troupe"),
                    caf::make_message(std::move(message))};
}

std::exception_ptr to_exception(const caf::error& e, const std::string& context) {
  if (e && e.category() == caf::atom("troupe") && e.context().match_elements<std::string>())
    return std::make_exception_ptr(
        error(static_cast<errc>(e.code() - 1), e.context().get_as<std::string>(0)));
  return std::make_exception_ptr(error(
      errc::aborted, context + " failed: the group actor is gone (" + caf::to_string(e) + ")"));
}

namespace {

/// "allreduce on group 'g'": names the call when the group actor itself is gone.
template <class Call>
std::string context_of(const Call& call) {
  return call_location(call.name, call.handle.group_name());
}

}  // namespace

// The relay completes works with their callbacks run on the callback pool
// (base/callback_pool.hpp): a callback that waits for another call would
// block the relay that has to complete that call.
relay_actor spawn_work_relay(caf::actor_system& sys) {
  return sys.spawn([](relay_actor::pointer self) -> relay_actor::behavior_type {
    return {
        [self](submit_atom, call_ptr& call, group_actor& group) {
          self->request(group, caf::infinite, run_atom::value, call)
              .then([call](tensor_list& out) { complete_in_pool(call->handle, std::move(out)); },
                    [call](caf::error& e) {
                      fail_in_pool(call->handle, to_exception(e, context_of(*call)));
                    });
        },
        [self](submit_atom, p2p_ptr& call, group_actor& group) {
          self->request(group, caf::infinite, p2p_atom::value, call)
              .then(
                  [call](tensor_list& out) {
                    complete_in_pool(call->handle, std::move(out), call->source);
                  },
                  [call](caf::error& e) {
                    fail_in_pool(call->handle, to_exception(e, context_of(*call)));
                  });
        },
    };
  });
}

}  // namespace troupe::detail
