// A peer that holds the job's token and breaks the rules: rank 2 of three
// processes writes crafted frames on its own data-plane connections
// (data_plane::send_raw). Each bad frame fails only that peer on the ranks
// it reaches: their calls on groups with it fail with errc::peer_failure
// naming it and saying what it sent, a group without it keeps working, and
// no process dies. Then the same with mutated frames for a fixed budget
// (TROUPE_FUZZ_ROUNDS rounds of 64 frames, 20 by default; scripts/
// fuzz_frames.sh runs it for longer), the victims' memory measured.

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <thread>

#include "../actors/rank_runtime.hpp"
#include "../transport/data_plane.hpp"
#include "../transport/frame.hpp"
#include "forked_ranks.hpp"

using namespace troupe;
using namespace troupe::detail;
using namespace std::chrono_literals;
using troupe::test::expect;

namespace {

class string_stream final : public byte_stream {
 public:
  std::string bytes;
  bool write(const void* d, std::size_t n) override {
    bytes.append(static_cast<const char*>(d), n);
    return true;
  }
  bool read(void*, std::size_t) override { return false; }
  void close() override {}
};

/// The frame written to `s`, with `patch` applied to its header.
std::string patched(string_stream& s, const std::function<void(frame_header&)>& patch) {
  if (patch) {
    frame_header h;
    std::memcpy(&h, s.bytes.data(), sizeof(h));
    patch(h);
    std::memcpy(s.bytes.data(), &h, sizeof(h));
  }
  return s.bytes;
}

/// One frame as write_frame writes it, then `patch` applied to its header.
std::string frame(const std::string& group, std::uint8_t kind, std::uint64_t seq, int src,
                  const tensor& payload, const std::function<void(frame_header&)>& patch = {}) {
  string_stream s;
  if (kind == frame_p2p)
    write_frame(s, group, p2p_envelope{src, 0, payload});
  else
    write_frame(s, group, envelope{seq, 0, src, op_code::allreduce, payload, nullptr}, kind);
  return patched(s, patch);
}

data_plane& plane_of(world& w) {
  return *w.runtime().plane();
}

/// Three ranks over TCP; rank 2 sends what `attack(sub_group_name)` makes to
/// ranks 0 and 1, whose allreduce on the default group must then fail naming
/// rank 2 and `expected`, while their group of two keeps working.
void run_attack(const char* engine_setting,
                const std::function<std::string(const std::string&)>& attack,
                const std::string& expected) {
  CAPTURE(expected);
  const auto path = test::temp_store_path();
  auto codes = test::fork_ranks(3, [&](int r) {
    ::setenv("TROUPE_TRANSPORT", "tcp", 1);
    // The case's own route, whatever TROUPE_ENGINE the tests run under.
    if (*engine_setting)
      ::setenv("TROUPE_ENGINE", engine_setting, 1);
    else
      ::unsetenv("TROUPE_ENGINE");
    ::unsetenv("TROUPE_FABRIC");  // its older name
    auto s = std::make_shared<file_store>(path, 20s);
    world w{test::child_world(s, r, 3, 20s)};
    auto& pg = w.default_group();
    auto sub = w.new_group({0, 1});
    pg.barrier().wait();
    if (r < 2) s->set("ready/" + std::to_string(r), "1");  // out of the barrier
    if (r == 2) {
      s->wait({"ready/0", "ready/1"}, 20s);
      const auto bytes = attack(sub->name());
      plane_of(w).send_raw(0, bytes.data(), bytes.size());
      plane_of(w).send_raw(1, bytes.data(), bytes.size());
      s->wait({"checked/0", "checked/1"}, 20s);
      return true;
    }
    bool ok = true;
    try {
      pg.allreduce(tensor_list{tensor::from_vector<float>({1.f})}, {.timeout = 10000ms}).wait();
      ok = expect(r, false, "the allreduce with rank 2 succeeded");
    } catch (const error& e) {
      const std::string what = e.what();
      ok &= expect(r, e.code() == errc::peer_failure, "not a peer failure: " + what);
      ok &= expect(r, what.find("world rank 2 (host") != std::string::npos,
                   "rank 2 is not named: " + what);
      ok &= expect(r, what.find(expected) != std::string::npos, "not what it sent: " + what);
    }
    auto t = tensor::from_vector<int>({r + 1});
    sub->allreduce(t).wait();
    ok &= expect(r, t.to_vector<int>()[0] == 3, "the group of two summed wrong");
    s->set("checked/" + std::to_string(r), "1");
    sub->barrier().wait();
    return ok;
  });
  ::unlink(path.c_str());
  CHECK(codes == std::vector<int>{0, 0, 0});
}

}  // namespace

TEST_CASE("a frame announcing a payload larger than the host's memory fails only that peer") {
  run_attack(
      "",
      [](const std::string&) {
        return frame("default", frame_collective, 1, 2, tensor::from_vector<float>({1.f}),
                     [](frame_header& h) { h.payload_bytes = std::uint64_t{1} << 62; });
      },
      "more than this host's memory");
}

/// A loan frame (frame_loan) of rank 2 for the default group, `patch`ed.
/// `kind` help: a request to copy into rank 2's buffer (`bytes` of it).
std::string loan_frame(const std::function<void(frame_header&)>& patch = {},
                       p2p_envelope::kind_t kind = p2p_envelope::lent,
                       std::uint64_t bytes = 1 << 20) {
  string_stream s;
  p2p_envelope env{2, 0, {}, kind};
  env.loan = {1, 1, 1 << 20, 0, bytes, 3, static_cast<std::uint8_t>(dtype::float32), {}};
  write_frame(s, "default", env);
  return patched(s, patch);
}

// Over TCP the receiver cannot map the lender's memory (another host's pid
// would name an unrelated process here): a loan is a broken rule.
TEST_CASE("a loan from a peer that shares no memory fails only that peer") {
  run_attack(
      "", [](const std::string&) { return loan_frame(); }, "which this rank cannot map");
}

TEST_CASE("a request to copy into a peer's memory that cannot be mapped fails only that peer") {
  run_attack(
      "", [](const std::string&) { return loan_frame({}, p2p_envelope::help); },
      "which this rank cannot map");
  run_attack(
      "", [](const std::string&) { return loan_frame({}, p2p_envelope::help, 0); },
      "a request to copy 0 bytes");
}

TEST_CASE("a malformed loan frame fails only that peer") {
  run_attack(
      "", [](const std::string&) { return loan_frame([](frame_header& h) { h.code = 9; }); },
      "a bad loan frame");
}

TEST_CASE("a frame from a group rank out of range fails only that peer") {
  run_attack(
      "", [](const std::string&) { return frame("default", frame_inline, 1000, 77, tensor{}); },
      "from group rank 77, out of range for the group's 3 ranks");
}

TEST_CASE("a frame claiming another member as its sender fails only that peer") {
  run_attack(
      "actors",
      [](const std::string&) { return frame("default", frame_collective, 1, 0, tensor{}); },
      "claims to come from group rank 0 (world rank 0), not from its own group rank 2");
}

TEST_CASE("a frame for a group its sender is not a member of fails only that peer") {
  // Before: rank 0 of the group of two failed with a false collective mismatch.
  run_attack(
      "",
      [](const std::string& sub) {
        return frame(sub, frame_inline, 1, 0, tensor::from_vector<float>({5.f}));
      },
      "of which it is not a member");
}

TEST_CASE("frames for operations far ahead are bounded per peer (inline engine and group actors)") {
  for (const char* engine_setting : {"", "actors"}) {
    CAPTURE(std::string(engine_setting));
    run_attack(
        engine_setting,
        [&](const std::string&) {
          std::string all;
          const auto kind = *engine_setting ? frame_collective : frame_inline;
          for (std::size_t i = 0; i <= max_waiting_messages; ++i)
            all += frame("default", kind, 1000 + i, 2, tensor{});
          return all;
        },
        "more than " + std::to_string(max_waiting_messages) + " messages");
  }
}

namespace {

/// A frame for `group` mutated at random: header fields, lengths, bytes.
std::string mutated(std::mt19937_64& gen, const std::string& group) {
  const std::uint8_t kinds[] = {frame_collective, frame_p2p, frame_inline};
  const auto kind = kinds[gen() % 3];
  const auto seq = 1 + gen() % 4;
  const auto len = static_cast<std::int64_t>(gen() % 3 == 0 ? gen() % 9000 : gen() % 8);
  auto payload = tensor::zeros({len}, dtype::float32);
  auto f = frame(group, kind, seq, 2, payload);
  switch (gen() % 8) {
    case 0:  // a header field at random
      f[gen() % sizeof(frame_header)] = static_cast<char>(gen());
      break;
    case 1:  // an announced payload that does not come
      f = frame(group, kind, seq, 2, payload,
                [&](frame_header& h) { h.payload_bytes = (gen() % 4096) * 4 + 4; });
      break;
    case 2:  // another sender
      f = frame(group, kind, seq, static_cast<int>(gen() % 5) - 1, payload);
      break;
    case 3:  // cut short
      f.resize(gen() % f.size());
      break;
    case 4:  // bytes flipped anywhere
      for (int i = 0; i < 4; ++i) f[gen() % f.size()] ^= static_cast<char>(1 << (gen() % 8));
      break;
    default:  // as it is: valid, perhaps of another collective or step
      break;
  }
  return f;
}

}  // namespace

TEST_CASE("a token-holding peer sending mutated frames: no crash, bounded memory, others work") {
  const char* env = std::getenv("TROUPE_FUZZ_ROUNDS");
  const int rounds = env ? std::max(1, std::atoi(env)) : 20;
  const auto path = test::temp_store_path();
  auto& rss = *test::shared_page<std::array<std::atomic<long>, 6>>();  // KiB, first/last
  // Victims' default-group barriers after the frames: passed, failed by code.
  auto& outcomes = *test::shared_page<std::array<std::atomic<int>, 16>>();
  // A store file per round: a file_store rewrites its whole file at every
  // call, so one file for thousands of rounds would slow them down.
  auto store_of = [&](int round) { return path + "." + std::to_string(round); };
  auto codes = test::fork_ranks(3, [&](int r) {
    ::setenv("TROUPE_TRANSPORT", "tcp", 1);
    bool ok = true;
    for (int round = 0; round < rounds; ++round) {
      auto s = std::make_shared<file_store>(store_of(round), 60s);
      world w{test::child_world(s, r, 3, 20s)};
      auto& pg = w.default_group();
      auto sub = w.new_group({0, 1});
      pg.barrier({.timeout = 10000ms}).wait();
      const auto key = "round/" + std::to_string(round) + "/";
      if (round == 0 && r < 2) rss[static_cast<std::size_t>(r)] = test::status_value("VmRSS:");
      if (r < 2) s->set(key + "ready/" + std::to_string(r), "1");  // out of the barrier
      if (r == 2) {
        s->wait({key + "ready/0", key + "ready/1"}, 60s);
        std::mt19937_64 gen(static_cast<std::uint64_t>(round) * 7919 + 1);
        for (int i = 0; i < 64; ++i) {
          const auto f = mutated(gen, gen() % 4 == 0 ? sub->name() : "default");
          plane_of(w).send_raw(static_cast<int>(gen() % 2), f.data(), f.size());
        }
      }
      // The default group may fail (a frame of the wrong collective, a
      // dropped peer, a timeout): as a troupe::error, never a crash.
      try {
        pg.barrier({.timeout = 2000ms}).wait();
        if (r < 2) ++outcomes[0];
      } catch (const error& e) {
        if (r < 2) ++outcomes[1 + static_cast<std::size_t>(e.code()) % 15];
      }
      if (r < 2) {
        auto t = tensor::from_vector<int>({r + 1});
        sub->allreduce(t).wait();
        ok &= expect(r, t.to_vector<int>()[0] == 3, "the group of two summed wrong");
        rss[static_cast<std::size_t>(3 + r)] = test::status_value("VmRSS:");
      }
      s->set(key + std::to_string(r), "1");
      s->wait({key + "0", key + "1", key + "2"}, 60s);
      if (r == 0 && round > 0) ::unlink(store_of(round - 1).c_str());  // nobody uses it now
    }
    return ok;
  });
  ::unlink(store_of(rounds - 1).c_str());
  CHECK(codes == std::vector<int>{0, 0, 0});
  std::string seen = std::to_string(outcomes[0].load()) + " passed";
  for (int c = 0; c < 15; ++c)
    if (outcomes[1 + c].load())
      seen += ", " + std::to_string(outcomes[1 + c].load()) + " " + to_string(static_cast<errc>(c));
  MESSAGE("the victims' barriers after the frames: " << seen);
  for (int r = 0; r < 2; ++r) {
    MESSAGE("rank " << r << ": " << rounds << " rounds of 64 mutated frames; RSS " << rss[r] / 1024
                    << " MiB after the first world, " << rss[3 + r] / 1024 << " MiB at the end");
    CHECK(rss[3 + r] - rss[r] < 256 * 1024);
  }
}

namespace {

/// Two processes over TCP. Rank 0 runs `receiver`, which builds its world,
/// adds a sink for group "probe" and sets "sink" in the store; rank 1 then
/// sends it one inline frame for that group and leaves once rank 0 set "done".
void probe_rank0(const std::function<bool(const std::shared_ptr<file_store>&)>& receiver) {
  const auto path = test::temp_store_path();
  auto codes = test::fork_ranks(2, [&](int r) {
    ::setenv("TROUPE_TRANSPORT", "tcp", 1);
    auto s = std::make_shared<file_store>(path, 20s);
    if (r == 0) {
      if (!receiver(s)) return false;
      s->set("done", "1");
      return true;
    }
    world w{test::child_world(s, r, 2, 20s)};
    s->wait({"sink"}, 20s);
    const auto bytes = frame("probe", frame_inline, 1, 1, tensor::from_vector<float>({1.f}));
    plane_of(w).send_raw(0, bytes.data(), bytes.size());
    s->wait({"done"}, 20s);
    return true;
  });
  ::unlink(path.c_str());
  CHECK(codes == std::vector<int>{0, 0});
}

/// Waits up to `limit` for `flag`.
bool soon(const std::atomic<bool>& flag, std::chrono::milliseconds limit) {
  for (auto waited = 0ms; !flag.load() && waited < limit; waited += 10ms)
    std::this_thread::sleep_for(10ms);
  return flag.load();
}

}  // namespace

TEST_CASE(
    "a world ends while a reader thread holds its data plane: the plane closes, nobody crashes") {
  // A reader thread that holds the plane (a sink that locked what it needs)
  // when its world ends must not be left to destroy the plane: the plane
  // would join its own thread ("Resource deadlock avoided": the process
  // aborts). The world closes its plane itself, waiting for the reader.
  probe_rank0([](const std::shared_ptr<file_store>& s) {
    auto entered = std::make_shared<std::atomic<bool>>(false);
    auto left = std::make_shared<std::atomic<bool>>(false);
    {
      world w{test::child_world(s, 0, 2, 20s)};
      auto hold = std::make_shared<std::shared_ptr<data_plane>>(w.runtime().plane());
      plane_of(w).add_sink("probe", {0, 1}, [hold, entered, left](received_frame&) {
        {
          const auto mine = std::move(*hold);  // the last holder once the world let go
          entered->store(true);
          std::this_thread::sleep_for(300ms);  // the world ends meanwhile
        }
        left->store(true);
        return std::string();
      });
      s->set("sink", "1");
      if (!expect(0, soon(*entered, 20s), "the probe frame never reached the sink")) return false;
    }
    // The reader let go of the plane by now (its world waited for it), and
    // the process is still here.
    return expect(0, soon(*left, 5s), "the sink never returned");
  });
}

TEST_CASE(
    "ranks that route collectives differently (TROUPE_ENGINE): every rank refuses the world") {
  // Frames of the group actors are dropped unread by an inline engine and
  // the other way round: without the check such a job waits for a timeout.
  const auto path = test::temp_store_path();
  auto codes = test::fork_ranks(3, [&](int r) {
    ::setenv("TROUPE_TRANSPORT", "tcp", 1);
    if (r == 2)
      ::setenv("TROUPE_ENGINE", "actors", 1);
    else
      ::unsetenv("TROUPE_ENGINE");
    ::unsetenv("TROUPE_FABRIC");  // its older name
    auto s = std::make_shared<file_store>(path, 20s);
    const auto start = std::chrono::steady_clock::now();
    try {
      world w{test::child_world(s, r, 3, 20s)};
      return expect(r, false, "the world was built");
    } catch (const error& e) {
      const std::string what = e.what();
      bool ok = expect(r, e.code() == errc::invalid_argument, "not invalid_argument: " + what);
      ok &= expect(r, what.find("TROUPE_ENGINE") != std::string::npos, "not named: " + what);
      ok &= expect(
          r, what.find(r == 2 ? "rank 0 has 'inline'" : "rank 2 has 'actors'") != std::string::npos,
          "the other route is not named: " + what);
      ok &= expect(r, std::chrono::steady_clock::now() - start < 10s, "found late: " + what);
      return ok;
    }
  });
  ::unlink(path.c_str());
  CHECK(codes == std::vector<int>{0, 0, 0});
}

TEST_CASE("a world ended by a callback on its own reader thread closes without joining it") {
  // A callback that a frame's reader runs may end the world (an
  // application that drops its last handle there): its data plane cannot
  // join that thread, which must still get home safely.
  probe_rank0([](const std::shared_ptr<file_store>& s) {
    auto ended = std::make_shared<std::atomic<bool>>(false);
    auto w = std::make_shared<std::unique_ptr<world>>(
        std::make_unique<world>(test::child_world(s, 0, 2, 20s)));
    plane_of(**w).add_sink("probe", {0, 1}, [w, ended](received_frame&) {
      w->reset();  // the world ends on this reader thread
      ended->store(true);
      return std::string();
    });
    s->set("sink", "1");
    if (!expect(0, soon(*ended, 20s), "the world did not end")) return false;
    std::this_thread::sleep_for(200ms);  // the reader gets home
    return true;
  });
}
