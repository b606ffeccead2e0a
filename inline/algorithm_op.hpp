#pragma once
// algorithm_op — runs one of troupe's algorithms (algorithms/) as an inline engine
// operation over the data plane's connections (message_medium): the state machine
// the group actor would run, driven instead by the thread that waits for it.
// Messages leave from that thread and are taken from the group's inbox.

#include <memory>

#include "base/call.hpp"
#include "inline/engine.hpp"

namespace troupe::detail {

/// `call` as planned by the backend, which the operation keeps and changes
/// (its handle is unused: the inline engine completes the op's own handle).
std::unique_ptr<inline_op> make_algorithm_op(call_ptr call);

}  // namespace troupe::detail
