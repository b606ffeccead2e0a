#pragma once
// call_until — a blocking call that must not hold its caller past a
// deadline: a store whose server stopped (a rank hosting it, as under
// torchrun) answers nothing until the store's own timeout, minutes where a
// collective's is seconds. The call runs on a thread of its own; the caller
// takes its result if it came by the deadline, and goes on without it if not
// (the thread ends when the call does, detached).

#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

namespace troupe::detail {

/// What `f()` returned, if it returned (not threw) by `until`; nothing if
/// it had not (or no thread could start). `f` must own what it uses: it may
/// end after its caller did.
template <class F>
auto call_until(F f, std::chrono::steady_clock::time_point until) -> std::optional<decltype(f())> {
  using result_type = decltype(f());
  auto result = std::make_shared<std::promise<result_type>>();
  auto done = result->get_future();
  try {
    std::thread([f = std::move(f), result]() mutable {
      try {
        result->set_value(f());
      } catch (...) {
        result->set_exception(std::current_exception());
      }
    }).detach();
  } catch (const std::system_error&) {
    return std::nullopt;
  }
  if (done.wait_until(until) != std::future_status::ready) return std::nullopt;
  try {
    return done.get();
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace troupe::detail
