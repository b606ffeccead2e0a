// Ranks that do not come to the rendezvous, or die in it: the others fail
// naming the ranks (not store keys) when the world's timeout passes, and at
// once when the rank's end can be told: by the store server (tcp_store: the
// rank's connection to it ended without a goodbye) or on this host (its
// process ended, once its identity was in the store). Children are killed
// with SIGKILL while they wait in the rendezvous, and at varied moments
// after they reached the store.

#include <doctest/doctest.h>
#include <linux/capability.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <thread>

#include "check_error.hpp"
#include "forked_ranks.hpp"
#include "troupe/tcp_store.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::test::check_error;
using troupe::test::expect;

namespace {

const std::string token = "0123456789abcdef";

/// What the children tell the parent.
struct board {
  std::atomic<int> entering{0};         // the victim is about to build its world
  std::atomic<long long> killed_at{0};  // now_ns() of the kill
  std::atomic<int> victim_pid{0};
  std::atomic<long long> failed_ms[4] = {};  // kill -> failure (+1), per survivor
  std::atomic<int> in_world[4] = {};         // failed after its world was built
};

tcp_store_options client(std::chrono::milliseconds timeout) {
  tcp_store_options o;
  o.token = token;
  o.timeout = timeout;
  return o;
}

/// A survivor: builds its world and runs allreduces in it, expecting a peer
/// failure that names world rank `victim` with its pid (the victim joins the
/// first allreduce when it lives that long).
bool survivor(int r, int size, int victim, std::shared_ptr<store> s, board& b,
              std::chrono::milliseconds timeout) {
  bool built = false;
  try {
    world w{test::child_world(std::move(s), r, size, timeout)};
    built = true;
    for (int i = 0; i < 2; ++i)
      w.default_group().allreduce(tensor::from_vector<float>({1.f})).wait();
    return expect(r, false, "the world was built and allreduces ran without the killed rank");
  } catch (const error& e) {
    const auto at = test::now_ns();
    const std::string what = e.what();
    bool ok = expect(r, e.code() == errc::peer_failure, "not a peer failure: " + what);
    ok &=
        expect(r,
               what.find("world rank " + std::to_string(victim) + " (host") != std::string::npos &&
                   what.find("pid " + std::to_string(b.victim_pid.load())) != std::string::npos,
               "the killed rank is not named with host and pid: " + what);
    ok &= expect(r, what.find("troupe/") == std::string::npos, "a store key is named: " + what);
    b.failed_ms[r] = (at - b.killed_at.load()) / 1000000 + 1;
    b.in_world[r] = built;
    return ok;
  }
}

/// The victim: marks that it enters, builds its world and joins the first
/// allreduce, until it is killed.
bool victim(int r, int size, std::shared_ptr<store> s, board& b) {
  b.victim_pid = ::getpid();
  b.entering = 1;
  world w{test::child_world(std::move(s), r, size, 20s)};
  w.default_group().allreduce(tensor::from_vector<float>({1.f})).wait();
  std::this_thread::sleep_for(20s);  // killed before
  return false;
}

/// Kills the victim (once it entered and `ready` says so) after `delay`.
void kill_victim(board& b, const std::function<bool()>& ready, std::chrono::milliseconds delay) {
  const auto give_up = std::chrono::steady_clock::now() + 20s;  // the victim failed early
  while ((!b.entering.load() || !ready()) && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(delay);
  b.killed_at = test::now_ns();
  ::kill(b.victim_pid.load(), SIGKILL);
}

/// Checks the children's exit codes and that each survivor failed within 2 s.
void check_outcome(const std::vector<int>& codes, int victim, board& b, const std::string& what) {
  std::string times;
  for (int r = 0; r < static_cast<int>(codes.size()); ++r) {
    CAPTURE(r);
    if (r == victim) {
      CHECK(codes[static_cast<std::size_t>(r)] == 128 + SIGKILL);
      continue;
    }
    CHECK(codes[static_cast<std::size_t>(r)] == 0);
    const auto ms = b.failed_ms[r].load() - 1;
    CHECK(ms >= 0);
    CHECK(ms < 2000);
    times += " rank " + std::to_string(r) + ": " + std::to_string(ms) + " ms" +
             (b.in_world[r] ? " (in its world)" : " (in the rendezvous)");
  }
  MESSAGE(what << ":" << times);
}

}  // namespace

TEST_CASE("a rank that never comes: the others time out naming it, not a store key") {
  auto s = std::make_shared<hash_store>(20s);
  std::vector<std::thread> threads;
  std::string what[2];
  errc code[2] = {errc::internal, errc::internal};
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        world w{test::child_world(s, r, 3, 1500ms)};
      } catch (const error& e) {
        what[r] = e.what();
        code[r] = e.code();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    CAPTURE(what[r]);
    CHECK(code[r] == errc::timeout);
    CHECK(what[r].find("Timed out after 1500 ms waiting for rank 2 to") != std::string::npos);
    CHECK(what[r].find("troupe/") == std::string::npos);
  }
}

TEST_CASE("rank 0 never comes: the others name it") {
  auto s = std::make_shared<hash_store>(20s);
  s->add("troupe/joined", 1);  // as if rank 0 had joined, and then stopped
  check_error([&] { world w{test::child_world(s, 1, 2, 500ms)}; }, errc::timeout,
              {"world: rank 1", "Timed out after 500 ms waiting for rank 0 to start the job"});
}

TEST_CASE("a rank killed while it waits for the job id: the store tells the others at once") {
  // Rank 0 comes late, so the others (the victim among them) wait for the
  // job id; the victim is killed there. The store server (this process) sees
  // its connection end and notes it; the others fail as soon as they look.
  tcp_store_server server("127.0.0.1", 0, token);
  const auto port = server.port();
  auto& b = *test::shared_page<board>();
  std::thread killer([&] {
    kill_victim(
        b, [] { return true; }, 200ms);
  });
  auto codes = test::fork_ranks(4, [&](int r) {
    auto s = std::make_shared<tcp_store>("127.0.0.1", port, client(20s));
    if (r == 2) return victim(r, 4, s, b);
    if (r == 0)
      while (!b.killed_at.load()) std::this_thread::sleep_for(1ms);
    return survivor(r, 4, 2, s, b, 15s);
  });
  killer.join();
  check_outcome(codes, 2, b, "killed waiting for the job id");
}

TEST_CASE("rank 0, which serves the store, killed in the rendezvous: the others say so at once") {
  auto& b = *test::shared_page<board>();
  auto& port = *test::shared_page<std::atomic<int>>();
  std::thread killer([&] {
    kill_victim(
        b, [] { return true; }, 200ms);
  });
  auto codes = test::fork_ranks(3, [&](int r) {
    if (r == 0) {
      auto o = client(20s);
      o.is_server = true;
      auto s = std::make_shared<tcp_store>("127.0.0.1", 0, o);
      port = s->port();
      b.victim_pid = ::getpid();
      b.entering = 1;
      std::this_thread::sleep_for(20s);  // killed before it starts the job
      return false;
    }
    while (!port.load()) std::this_thread::sleep_for(1ms);
    auto s = std::make_shared<tcp_store>("127.0.0.1", port.load(), client(20s));
    try {
      world w{test::child_world(s, r, 3, 15s)};
      return expect(r, false, "a world without rank 0 was built");
    } catch (const error& e) {
      const std::string what = e.what();
      b.failed_ms[r] = (test::now_ns() - b.killed_at.load()) / 1000000 + 1;
      return expect(r,
                    e.code() == errc::store &&
                        what.find("lost the store while waiting for rank 0 to start the job") !=
                            std::string::npos,
                    "not the lost store: " + what);
    }
  });
  killer.join();
  check_outcome(codes, 0, b, "rank 0 killed with the store");
}

TEST_CASE("a rank killed before it published its address: its ended process is seen at once") {
  // A file_store cannot tell; the victim's process identity is in the store
  // (it waits for rank 1's), so the others watch its process on this host.
  const auto path = test::temp_store_path();
  auto& b = *test::shared_page<board>();
  std::thread killer([&] {
    kill_victim(
        b, [] { return true; }, 200ms);
  });
  auto codes = test::fork_ranks(3, [&](int r) {
    auto s = std::make_shared<file_store>(path, 20s);
    if (r == 2) return victim(r, 3, s, b);
    if (r == 1)
      while (!b.killed_at.load()) std::this_thread::sleep_for(1ms);
    return survivor(r, 3, 2, s, b, 15s);
  });
  killer.join();
  ::unlink(path.c_str());
  check_outcome(codes, 2, b, "killed waiting for rank 1");
}

TEST_CASE("a rank that gives up building its world: the others fail at once, quoting why") {
  // Rank 0 rejects its transport setting after the job started, before any
  // rank knows where it runs: the others cannot watch its process, and a
  // file_store cannot tell them it is gone. They fail at once with its
  // reason, not at the world's timeout naming rank 0 alone. Rank 2, on
  // another host, learns it the same way.
  const auto path = test::temp_store_path();
  auto& failed_ms = *test::shared_page<std::array<std::atomic<long long>, 3>>();
  auto codes = test::fork_ranks(3, [&](int r) {
    ::setenv("TROUPE_HOSTNAME", r == 2 ? "b" : "a", 1);
    if (r == 0) ::setenv("TROUPE_TRANSPORT", "no-such-transport", 1);
    auto s = std::make_shared<file_store>(path, 20s);
    const auto start = test::now_ns();
    try {
      world w{test::child_world(s, r, 3, 15s)};
      return expect(r, false, "a world was built");
    } catch (const error& e) {
      const std::string what = e.what();
      failed_ms[static_cast<std::size_t>(r)] = (test::now_ns() - start) / 1000000;
      if (r == 0) return expect(r, e.code() == errc::invalid_argument, "not invalid: " + what);
      bool ok = expect(r, e.code() == errc::peer_failure, "not a peer failure: " + what);
      ok &= expect(r,
                   what.find("world rank 0") != std::string::npos &&
                       what.find("transport 'no-such-transport'") != std::string::npos,
                   "rank 0's reason is not quoted: " + what);
      return ok;
    }
  });
  ::unlink(path.c_str());
  CHECK(codes == std::vector<int>{0, 0, 0});
  for (int r : {1, 2}) {
    CAPTURE(r);
    CHECK(failed_ms[static_cast<std::size_t>(r)].load() < 5000);
  }
}

TEST_CASE("lines in the gave-up key that are no rank's reason are ignored") {
  // Whoever can write to the store can doom a world (a line of one of its
  // ranks: "1 failure why"), but lines that name no rank of it, or not as
  // a rank that gave up writes them, change nothing.
  auto s = std::make_shared<hash_store>(20s);
  s->append("troupe/job/0/gave_up", to_bytes(std::string("\x01\x02 garbage\n-5 failure x\n"
                                                         "99 failure y\n\n2\n1x\n1 timeout z\n")));
  std::vector<std::thread> threads;
  std::atomic<int> built{0};
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      world w{test::child_world(s, r, 2, 5s)};
      w.default_group().barrier().wait();
      ++built;
    });
  for (auto& t : threads) t.join();
  CHECK(built == 2);
}

TEST_CASE("a rank killed at varied moments of the rendezvous: the others fail at once, naming it") {
  // The victim is killed 0..100 ms after it wrote its process identity to
  // the store: in the data plane's set-up, in the default group's, or in the
  // first allreduce. Wherever it happened, every survivor fails within 2 s
  // naming it.
  for (int delay : {0, 1, 3, 10, 30, 100}) {
    CAPTURE(delay);
    tcp_store_server server("127.0.0.1", 0, token);
    const auto port = server.port();
    tcp_store watcher("127.0.0.1", port, client(20s));
    auto& b = *test::shared_page<board>();
    // Its process identity in the store: it asked the store to watch it before.
    auto noted = [&] {
      if (!watcher.check({"troupe/job/0"})) return false;
      const auto job = watcher.get_string("troupe/job/0");
      return watcher.check({"troupe/" + job + "/proc/2"});
    };
    std::thread killer([&] { kill_victim(b, noted, std::chrono::milliseconds(delay)); });
    auto codes = test::fork_ranks(3, [&](int r) {
      auto s = std::make_shared<tcp_store>("127.0.0.1", port, client(20s));
      if (r == 2) return victim(r, 3, s, b);
      return survivor(r, 3, 2, s, b, 15s);
    });
    killer.join();
    check_outcome(codes, 2, b,
                  "killed " + std::to_string(delay) + " ms after it wrote its identity");
  }
}

namespace {

/// Gives up the capability to look into other processes (root has it; a
/// user's processes do not): a process that is not dumpable is then closed
/// to this one, as to another user's.
void drop_ptrace_capability() {
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct d[2] = {};
  if (::syscall(SYS_capget, &h, d) != 0) return;
  d[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
  ::syscall(SYS_capset, &h, d);
}

}  // namespace

TEST_CASE(
    "a process whose memory its peers cannot open: the world still forms and every call works") {
  // A process that is not dumpable (prctl) keeps its /proc/PID/fd from the
  // other processes of its user; one without CAP_SYS_PTRACE cannot open a
  // root process's at all (so, run as root, neither rank can open the
  // other's). Peers that cannot open a ring read its writer over the socket
  // instead, a segment that not every rank can open is not used, and every
  // call still works.
  for (int closed : {0, 1}) {
    CAPTURE(closed);
    const auto path = test::temp_store_path();
    auto codes = test::fork_ranks(2, [&](int r) {
      ::setenv("TROUPE_TRANSPORT", "shm", 1);
      drop_ptrace_capability();
      if (r == closed) ::prctl(PR_SET_DUMPABLE, 0);
      auto s = std::make_shared<file_store>(path, 20s);
      world w{test::child_world(s, r, 2, 20s)};
      auto& pg = w.default_group();
      bool ok = true;
      for (std::int64_t n : {1, 1024, 64 << 10}) {
        auto t = tensor::from_vector(std::vector<float>(static_cast<std::size_t>(n), r + 1.f));
        pg.allreduce(t).wait();
        ok &= expect(r, t.to_vector<float>().back() == 3.f, "allreduce of " + std::to_string(n));
        auto b = tensor::from_vector(std::vector<float>(static_cast<std::size_t>(n), float(r)));
        pg.broadcast(b, 1).wait();
        ok &= expect(r, b.to_vector<float>().front() == 1.f, "broadcast of " + std::to_string(n));
      }
      auto m = tensor::from_vector<int>({r, r, r});
      if (r == 0) {
        pg.send(m, 1).wait();
        pg.recv(m, 1).wait();
        ok &= expect(r, m.to_vector<int>()[2] == 1, "the reply");
      } else {
        pg.recv(m, 0).wait();
        ok &= expect(r, m.to_vector<int>()[2] == 0, "the message");
        pg.send(m = tensor::from_vector<int>({1, 1, 1}), 0).wait();
      }
      // Messages large enough to be lent (a shared buffer, and a plain one
      // whose pages move into shared memory): a receiver that cannot open
      // the sender's memory gets them through the connection.
      for (bool shared : {true, false}) {
        const std::int64_t n = 1 << 18;  // 1 MiB of float32
        for (int from : {0, 1}) {
          auto big = shared ? tensor::empty_shared({n}, dtype::float32)
                            : tensor::empty({n}, dtype::float32);
          const float mark = 10.f * static_cast<float>(from + 1) + (shared ? 1.f : 0.f);
          if (r == from) {
            auto* f = static_cast<float*>(big.data());
            std::fill(f, f + n, mark);
            pg.send(big, 1 - r).wait();
          } else {
            big.zero_();
            pg.recv(big, from).wait();
            const auto v = big.to_vector<float>();
            ok &= expect(r, v.front() == mark && v.back() == mark,
                         "a lent message from rank " + std::to_string(from));
          }
        }
      }
      pg.barrier().wait();
      return ok;
    });
    ::unlink(path.c_str());
    CHECK(codes == std::vector<int>{0, 0});
  }
}
