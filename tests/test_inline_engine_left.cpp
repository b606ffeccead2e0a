// The inline engine and a rank that left after finishing its part: the operation
// was blocked on it, its last message and its goodbye arrived together, and
// the one more try that takes the message moves the operation on to wait for
// a rank that is still there. It must wait on, not fail blaming the rank that
// left (seen under load as "rank 1 left group 'default' (it left the job)
// before finishing this barrier" on a rank whose barrier could finish).

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "../inline/engine.hpp"
#include "../inline/medium.hpp"
#include "troupe/error.hpp"

using namespace troupe;
using namespace troupe::detail;
using namespace std::chrono_literals;

namespace {

/// Three ranks; rank 1 "left" once `left` is set.
class test_medium final : public medium {
 public:
  std::atomic<bool> left{false};
  int size() const noexcept override { return 3; }
  void sleep(int, std::chrono::nanoseconds max, const std::function<bool()>& recheck,
             bool) override {
    if (!recheck()) std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(max, 1ms));
  }
  std::string lost(std::uint64_t, int blocker, std::chrono::steady_clock::time_point) override {
    return blocker == 1 && left ? "rank 1 left group 'g' (it left the job)" : std::string();
  }
  void wake_all() override {}
  void leave() override {}
};

/// Waits for a message from rank 1, then one from rank 2. The first look finds
/// nothing; right after it, rank 1's message and its goodbye arrive.
class two_messages final : public inline_op {
 public:
  two_messages(test_medium& med, std::atomic<bool>& from_2) : med_(med), from_2_(from_2) {}
  bool step(inline_context&, bool& moved) override {
    if (stage_ == 0) {
      if (!arrived_) {
        arrived_ = true;   // rank 1's message is there from now on...
        med_.left = true;  // ...and so is its goodbye
        return false;
      }
      stage_ = 1;
      moved = true;
    }
    if (!from_2_) return false;
    moved = true;
    return true;
  }
  std::pair<int, std::string> blocker() const override {
    return {stage_ == 0 ? 1 : 2, "send its data"};
  }

 private:
  test_medium& med_;
  std::atomic<bool>& from_2_;
  int stage_ = 0;
  bool arrived_ = false;
};

}  // namespace

TEST_CASE("a rank that left after its part is not blamed when the operation moves on") {
  auto med = std::make_shared<test_medium>();
  std::atomic<bool> from_2{false};
  auto f = std::make_shared<inline_engine>(med, 0, "g",
                                           std::vector<std::string>{"rank 0", "rank 1", "rank 2"});
  auto op = std::make_unique<two_messages>(*med, from_2);
  op->name = "barrier";
  op->op = f->next_op();
  op->timeout = 10000ms;
  op->handle = work::make("barrier", "g", 1);
  auto w = op->handle;
  f->submit(std::move(op));
  std::this_thread::sleep_for(50ms);  // the watchdog passes: now it waits for rank 2
  CHECK_FALSE(w.is_completed());
  from_2 = true;  // rank 2's message
  w.wait(5000ms);
  CHECK(w.is_success());
}
