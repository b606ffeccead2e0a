// A rank killed with SIGKILL while its peers keep their worlds: 4 processes,
// killed at different moments (idle, in a loop of small allreduces, in large
// ones read by the reader threads), over TCP on the message engine and on the
// group actors (TROUPE_ENGINE=actors), and over shared memory. Every survivor
// fails soon after the kill (checked within 5 s, long before the calls' 20 s
// timeout; alone 30-130 ms) with errc::peer_failure naming the killed
// rank with its host and pid, never a live rank, also when one survivor
// leaves at once after its own failure; later calls on groups with the dead
// rank fail at once; a group without it keeps working. Across two emulated
// hosts (TROUPE_HOSTNAME) the same holds in the hierarchical collectives
// and in the pipelined chains, killed in the middle of a call.

#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "forked_ranks.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::test::expect;

namespace {

constexpr int ranks = 4;

// idle: between calls; small_loop / large_loop: after a few calls of 4 B /
// 4 MiB, before its next; mid_call: while its own 64 MiB call is under way
// (the survivors have segments of it in flight, to it and from it).
enum class moment { idle, small_loop, large_loop, mid_call };

struct plan {
  const char* name;
  const char* transport;       // TROUPE_TRANSPORT
  const char* engine_setting;  // TROUPE_ENGINE ("" leaves it unset)
  int victim;
  moment when;
  int leaver = -1;  // a survivor that destroys its world right after failing
  // Two emulated hosts (TROUPE_HOSTNAME: ranks 0 and 1 on one, 2 and 3 on
  // the other; shared memory inside, TCP across) and the algorithms forced
  // there (TROUPE_ALGORITHMS, with slices of 4 KiB: TROUPE_HIER_SEGMENT).
  const char* algorithms = nullptr;
  int reduce_root = -1;  // the calls are reduces (broadcasts) to (from) this rank
  // Or the calls are alltoall_single without split sizes ("alltoall"),
  // allgather_into_tensor ("allgather"), reduce_scatter_tensor
  // ("reduce_scatter") or broadcasts from reduce_root ("broadcast"), of
  // `len` elements per rank.
  const char* collective = "allreduce";
};

/// What the children tell the parent.
struct board {
  std::atomic<int> ready{0};            // survivors past the first barrier
  std::atomic<long long> killed_at{0};  // now_ns() just before the kill
  std::atomic<int> victim_pid{0};
  std::atomic<int> call_under_way{0};  // mid_call: the victim's call had not ended at its kill
  std::atomic<long long> detected_ms[ranks] = {};  // kill -> failure, per survivor (+1)
  std::atomic<long long> later_ms[ranks] = {};     // a later call's failure took (+1)
};

/// The plan's tensors of `len` floats (per rank).
struct operands {
  tensor t, all;
  operands(std::int64_t len, const plan& p)
      : t(tensor::empty({len}, dtype::float32)),
        all(tensor::empty(
            {std::string(p.collective) == "allreduce" || std::string(p.collective) == "broadcast"
                 ? 0
                 : len * ranks},
            dtype::float32)) {}
};

/// Starts one of the plan's calls on `o`.
work start_call(process_group& pg, operands& o, const plan& p) {
  std::fill_n(o.t.data_as<float>(), o.t.numel(), 1.f);
  std::fill_n(o.all.data_as<float>(), o.all.numel(), 1.f);
  const std::string what = p.collective;
  if (what == "alltoall") return pg.alltoall_single(o.all, o.all);
  if (what == "allgather") return pg.allgather_into_tensor(o.all, o.t);
  if (what == "reduce_scatter") return pg.reduce_scatter_tensor(o.t, o.all);
  if (what == "broadcast") return pg.broadcast(o.t, {.root_rank = p.reduce_root});
  if (p.reduce_root >= 0) return pg.reduce(o.t, {.root_rank = p.reduce_root});
  return pg.allreduce(o.t);
}

/// Runs `rounds` of the plan's calls on `len` floats (per rank), stopping at
/// the first that fails.
void run_until_failure(process_group& pg, std::int64_t len, int rounds, const plan& p) {
  operands o(len, p);
  for (int i = 0; i < rounds; ++i) start_call(pg, o, p).wait();
}

bool rank_body(const plan& p, const std::string& path, board& b, int r) {
  ::setenv("TROUPE_TRANSPORT", p.transport, 1);
  if (*p.engine_setting)
    ::setenv("TROUPE_ENGINE", p.engine_setting, 1);
  else
    ::unsetenv("TROUPE_ENGINE");
  ::unsetenv("TROUPE_FABRIC");  // its older name
  if (p.algorithms) {
    ::setenv("TROUPE_HOSTNAME", r < ranks / 2 ? "host-a" : "host-b", 1);
    ::setenv("TROUPE_ALGORITHMS", p.algorithms, 1);
    ::setenv("TROUPE_HIER_SEGMENT", "4096", 1);
  }
  auto s = std::make_shared<file_store>(path, 20s);
  world w{test::child_world(s, r, ranks, 20s)};
  auto& pg = w.default_group();
  std::vector<int> keepers;  // the survivors that stay to the end
  for (int q = 0; q < ranks; ++q)
    if (q != p.victim && q != p.leaver) keepers.push_back(q);
  auto sub = w.new_group(keepers);
  pg.barrier().wait();
  if (r != p.victim) ++b.ready;
  const bool loop = p.when != moment::idle;
  const bool large = p.when == moment::large_loop || p.when == moment::mid_call;
  // 4 B, 4 MiB, or 64 MiB mid call (a call of a few ms is over before a
  // sleep ends on a busy machine).
  const std::int64_t len = !large ? 1 : p.when == moment::mid_call ? (1 << 24) : (1 << 20);
  if (r == p.victim) {
    while (b.ready.load() < ranks - 1) std::this_thread::sleep_for(1ms);  // all left the barrier
    if (loop) run_until_failure(pg, len, large ? 3 : 20, p);
    operands o(len, p);
    std::optional<work> under_way;
    if (p.when == moment::mid_call) {
      // A quarter of the way through its call, by how long one took here;
      // where a loaded machine ran that one slow and the next one was over
      // by then, the next call, an eighth of the way, and so on.
      const auto before = test::now_ns();
      start_call(pg, o, p).wait();
      auto wait = std::chrono::nanoseconds(test::now_ns() - before) / 4;
      for (int attempt = 0; attempt < 6; ++attempt, wait /= 2) {
        under_way = start_call(pg, o, p);
        std::this_thread::sleep_for(wait);
        b.call_under_way = under_way->is_completed() ? 0 : 1;
        if (b.call_under_way.load()) break;
        under_way->wait();
      }
    }
    b.victim_pid = ::getpid();
    b.killed_at = test::now_ns();
    ::kill(::getpid(), SIGKILL);
  }
  if (!loop) {
    while (b.killed_at.load() == 0) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(100ms);  // the survivors are idle when it dies
  }
  bool ok = true;
  try {
    run_until_failure(pg, len, 1000000, p);
    return expect(r, false, "no call failed");
  } catch (const error& e) {
    const auto failed_at = test::now_ns();
    const std::string what = e.what();
    const auto victim = "world rank " + std::to_string(p.victim) + " (host ";
    ok &= expect(r, e.code() == errc::peer_failure, "not a peer failure: " + what);
    ok &= expect(r,
                 what.find(victim) != std::string::npos &&
                     what.find("pid " + std::to_string(b.victim_pid.load())) != std::string::npos,
                 "the killed rank is not named with host and pid: " + what);
    for (int q : keepers)
      if (q != r)
        ok &=
            expect(r, what.find("world rank " + std::to_string(q) + " (host") == std::string::npos,
                   "a live rank is named: " + what);
    // Found long before the calls' 20 s timeout: no write to it can have timed out
    // (a write that failed says the peer closed or reset the connection).
    ok &= expect(r,
                 what.find("timed out") == std::string::npos &&
                     what.find("took no data") == std::string::npos,
                 "a failure found at once is worded as a timeout: " + what);
    if (p.leaver >= 0 &&
        what.find("world rank " + std::to_string(p.leaver) + " (host") != std::string::npos)
      ok &=
          expect(r, what.find("after world rank " + std::to_string(p.victim)) != std::string::npos,
                 "the rank that left is blamed, not the killed one: " + what);
    b.detected_ms[r] = (failed_at - b.killed_at.load()) / 1000000 + 1;
  }
  if (r == p.leaver) return ok;  // leaves at once: its world says goodbye
  // Later calls on the group with the dead rank fail at once, naming it.
  const auto start = test::now_ns();
  try {
    pg.allreduce(tensor::from_vector<float>({1.f})).wait();
    ok &= expect(r, false, "a later allreduce succeeded");
  } catch (const error& e) {
    const std::string what = e.what();
    ok &= expect(r, what.find("world rank " + std::to_string(p.victim)) != std::string::npos,
                 "a later call does not name the killed rank: " + what);
  }
  b.later_ms[r] = (test::now_ns() - start) / 1000000 + 1;
  // A group without it keeps working.
  auto t = tensor::from_vector<int>({r});
  sub->allreduce(t).wait();
  int sum = 0;
  for (int q : keepers) sum += q;
  ok &= expect(r, t.to_vector<int>()[0] == sum, "the group of survivors summed wrong");
  // A new group with it is refused, naming a rank that is gone (its group
  // actor hears of the death before it has its transport).
  try {
    std::vector<int> everyone(ranks);
    for (int q = 0; q < ranks; ++q) everyone[static_cast<std::size_t>(q)] = q;
    troupe::new_group_options o;
    o.timeout = 5s;
    w.new_group(everyone, o);
    ok &= expect(r, false, "a group with the killed rank was made");
  } catch (const error& e) {
    const std::string what = e.what();
    ok &= expect(r, e.code() == errc::peer_failure, "not a peer failure: " + what);
    ok &= expect(r,
                 what.find("world rank " + std::to_string(p.victim)) != std::string::npos ||
                     what.find("world rank " + std::to_string(p.leaver)) != std::string::npos,
                 "no rank that is gone is named: " + what);
  }
  sub->barrier().wait();  // every survivor checked before any world goes
  return ok;
}

void run(const plan& p) {
  const std::string name = p.name;
  CAPTURE(name);
  const auto path = test::temp_store_path();
  auto& b = *test::shared_page<board>();
  auto codes = test::fork_ranks(ranks, [&](int r) { return rank_body(p, path, b, r); });
  ::unlink(path.c_str());
  std::string times;
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    if (r == p.victim) {
      CHECK(codes[static_cast<std::size_t>(r)] == 128 + SIGKILL);
      if (p.when == moment::mid_call) CHECK(b.call_under_way.load() == 1);
      continue;
    }
    CHECK(codes[static_cast<std::size_t>(r)] == 0);
    const auto detected = b.detected_ms[r].load() - 1;
    times += " rank " + std::to_string(r) + ": " + std::to_string(detected) + " ms";
    if (r != p.leaver) times += " (later call " + std::to_string(b.later_ms[r].load() - 1) + " ms)";
    CHECK(detected >= 0);
    // Found long before the calls' 20 s timeout: alone, 30-130 ms; beside
    // the rest of the suite on 2 loaded CPUs up to 2.3 s (a fresh-clone CI
    // run, the chains killed mid-call).
    CHECK(detected < 5000);
    if (r != p.leaver) CHECK(b.later_ms[r].load() - 1 < 1000);
  }
  MESSAGE(name << ": failed after the kill:" << times);
}

/// Point to point: every survivor waits in a recv from the victim when it
/// is killed (`lent`: in a send of 1 MiB from shared memory, lent to the
/// victim, which never receives it); it fails naming the victim, and a send
/// to it fails as well.
bool p2p_body(const char* transport, bool lent, const std::string& path, board& b, int r) {
  constexpr int victim = ranks - 1;
  ::setenv("TROUPE_TRANSPORT", transport, 1);
  ::unsetenv("TROUPE_ENGINE");
  ::unsetenv("TROUPE_FABRIC");  // its older name
  auto s = std::make_shared<file_store>(path, 20s);
  world w{test::child_world(s, r, ranks, 20s)};
  auto& pg = w.default_group();
  pg.barrier().wait();
  if (r == victim) {
    while (b.ready.load() < ranks - 1) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(50ms);  // the survivors wait in their recv
    b.victim_pid = ::getpid();
    b.killed_at = test::now_ns();
    ::kill(::getpid(), SIGKILL);
  }
  auto t = tensor::zeros({1}, dtype::int32);
  auto big = tensor::empty_shared({1 << 18}, dtype::float32);
  auto rv =
      lent ? pg.send(big, victim, 5) : (r == 0 ? pg.recv_any_source(t, 5) : pg.recv(t, victim, 5));
  ++b.ready;
  bool ok = true;
  auto names_victim = [&](const std::string& what) {
    return what.find("world rank " + std::to_string(victim) + " (host ") != std::string::npos &&
           what.find("pid " + std::to_string(b.victim_pid.load())) != std::string::npos;
  };
  try {
    rv.wait(20s);
    ok &= expect(r, false, lent ? "the lent send succeeded" : "the recv succeeded");
  } catch (const error& e) {
    b.detected_ms[r] = (test::now_ns() - b.killed_at.load()) / 1000000 + 1;
    const std::string what = e.what();
    ok &= expect(r, e.code() == errc::peer_failure, "not a peer failure: " + what);
    ok &= expect(r, names_victim(what), "the killed rank is not named: " + what);
  }
  const auto start = test::now_ns();
  try {
    pg.send(t, victim).wait(20s);
    ok &= expect(r, false, "a send to the killed rank succeeded");
  } catch (const error& e) {
    const std::string what = e.what();
    ok &= expect(r, names_victim(what), "a later send does not name the killed rank: " + what);
  }
  b.later_ms[r] = (test::now_ns() - start) / 1000000 + 1;
  // A batch's send to it fails the batch alike (its small sends to other
  // processes are written at once, without a work of their own).
  try {
    std::vector<p2p_op> ops{{p2p_op::isend, t, victim, 9}};
    pg.batch_isend_irecv(ops).wait(20s);
    ok &= expect(r, false, "a batch sending to the killed rank succeeded");
  } catch (const error& e) {
    const std::string what = e.what();
    ok &= expect(r, names_victim(what), "a batch's send does not name the killed rank: " + what);
  }
  // A batch receiving from it and from a live rank fails naming it (the
  // group fails every later call once a rank of it died).
  const int to = (r + 1) % victim, from = (r + victim - 1) % victim;  // the survivors' ring
  auto from_other = tensor::zeros({1}, dtype::int32);
  try {
    std::vector<p2p_op> ops{{p2p_op::irecv, t, victim, 10},
                            {p2p_op::irecv, from_other, from, 11},
                            {p2p_op::isend, t, to, 11}};
    pg.batch_isend_irecv(ops).wait(20s);
    ok &= expect(r, false, "a batch receiving from the killed rank succeeded");
  } catch (const error& e) {
    const std::string what = e.what();
    ok &= expect(r, e.code() == errc::peer_failure, "not a peer failure: " + what);
    ok &= expect(r, names_victim(what), "a batch's receive does not name the killed rank: " + what);
  }
  return ok;
}

void run_p2p(const char* transport, bool lent = false) {
  CAPTURE(std::string(transport));
  CAPTURE(lent);
  const auto path = test::temp_store_path();
  auto& b = *test::shared_page<board>();
  auto codes =
      test::fork_ranks(ranks, [&](int r) { return p2p_body(transport, lent, path, b, r); });
  ::unlink(path.c_str());
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    if (r == ranks - 1) {
      CHECK(codes[static_cast<std::size_t>(r)] == 128 + SIGKILL);
      continue;
    }
    CHECK(codes[static_cast<std::size_t>(r)] == 0);
    CHECK(b.detected_ms[r].load() - 1 >= 0);
    CHECK(b.detected_ms[r].load() - 1 < 2000);
    CHECK(b.later_ms[r].load() - 1 < 1000);
  }
}

}  // namespace

TEST_CASE("a rank killed while the others wait in recv from it fails each recv, naming it") {
  run_p2p("tcp");
  run_p2p("auto");
}

TEST_CASE("a rank killed while the others wait in sends lent to it fails each send, naming it") {
  run_p2p("auto", true);
}

TEST_CASE("over TCP, a rank killed while its peers are idle fails every survivor's next call") {
  run({"tcp, idle", "tcp", "", 3, moment::idle});
}

TEST_CASE("over TCP, a rank killed in a loop of small allreduces fails every survivor soon") {
  run({"tcp, small allreduces", "tcp", "", 1, moment::small_loop});
}

TEST_CASE("over TCP, a rank killed in large allreduces (reader threads) fails every survivor") {
  run({"tcp, 4 MiB allreduces", "tcp", "", 2, moment::large_loop});
}

TEST_CASE("over TCP on the group actors, rank 0 killed fails every survivor soon") {
  run({"tcp, group actors", "tcp", "actors", 0, moment::small_loop});
}

TEST_CASE("a survivor that leaves at once after failing is not blamed; the killed rank is") {
  run({"tcp, one survivor leaves", "tcp", "", 2, moment::large_loop, 3});
  run({"group actors, one survivor leaves", "tcp", "actors", 1, moment::small_loop, 0});
  run({"shm, one survivor leaves", "auto", "", 0, moment::small_loop, 1});
}

TEST_CASE("over shared memory, a rank killed in small allreduces fails every survivor soon") {
  run({"shm, small allreduces", "auto", "", 1, moment::small_loop});
}

TEST_CASE(
    "across two emulated hosts, a rank killed in the hierarchical collectives fails every "
    "survivor soon") {
  // The sliced striped allreduce (slices of 4 KiB: 16 at once) and the
  // leaders' small one; the hierarchical reduce to a root on the other host
  // and on the victim's own; on the message engine and the group actors.
  run({"hosts, sliced hierarchy", "auto", "", 3, moment::large_loop, -1, "allreduce=hier_striped"});
  run({"hosts, leaders", "auto", "", 1, moment::small_loop, -1, "allreduce=hier_leaders"});
  run({"hosts, hier reduce", "auto", "", 3, moment::large_loop, -1, "reduce=hier", 1});
  run({"hosts, hier reduce, root beside", "auto", "", 0, moment::small_loop, -1, "reduce=hier", 1});
  run({"hosts, group actors", "tcp", "actors", 2, moment::large_loop, -1,
       "allreduce=hier_striped"});
  // Bruck's alltoall and the halving reduce_scatter (log n steps of packed
  // blocks; the fold of the ranks beyond a power of two does not apply at 4).
  run({"hosts, Bruck alltoall", "auto", "", 2, moment::small_loop, -1, "alltoall=bruck", -1,
       "alltoall"});
  run({"hosts, halving reduce_scatter", "auto", "", 1, moment::large_loop, -1,
       "reduce_scatter=halving", -1, "reduce_scatter"});
  // The hierarchical allgather and reduce_scatter (in slices where large),
  // on both engines.
  run({"hosts, hier allgather", "auto", "", 2, moment::large_loop, -1, "allgather=hier_striped", -1,
       "allgather"});
  run({"hosts, leaders allgather", "auto", "", 0, moment::small_loop, -1, "allgather=hier_leaders",
       -1, "allgather"});
  run({"hosts, hier reduce_scatter", "auto", "", 3, moment::large_loop, -1,
       "reduce_scatter=hier_striped", -1, "reduce_scatter"});
  run({"hosts, hier reduce_scatter, group actors", "tcp", "actors", 1, moment::large_loop, -1,
       "reduce_scatter=hier_leaders", -1, "reduce_scatter"});
}

TEST_CASE(
    "across two emulated hosts, a rank killed in the middle of a pipelined chain's call fails "
    "every survivor soon") {
  // The chains (a 64 MiB call in 64 segments of 1 MiB, passed rank to
  // rank): killed while its own call is under way, so the
  // ranks before it have segments in flight to it and the ranks after it
  // wait for segments from it; in the middle, at the tail, at a host's
  // first rank (the leaders' chain), the root's neighbour; both engines.
  run({"hosts, broadcast chain, middle", "auto", "", 1, moment::mid_call, -1, "broadcast=chain", 0,
       "broadcast"});
  run({"hosts, broadcast chain, tail", "auto", "", 3, moment::mid_call, -1, "broadcast=chain", 0,
       "broadcast"});
  run({"hosts, broadcast leaders' chain, a leader", "auto", "", 2, moment::mid_call, -1,
       "broadcast=chain_leaders", 1, "broadcast"});
  run({"hosts, reduce chain, middle", "auto", "", 2, moment::mid_call, -1, "reduce=chain", 0});
  run({"hosts, reduce chain, its far end", "auto", "", 0, moment::mid_call, -1, "reduce=chain", 3});
  run({"hosts, reduce leaders' chain, a leader", "auto", "", 2, moment::mid_call, -1,
       "reduce=chain_leaders", 1});
  run({"hosts, reduce chain, group actors", "tcp", "actors", 1, moment::mid_call, -1,
       "reduce=chain", 3});
  run({"hosts, broadcast chain between calls", "auto", "", 1, moment::large_loop, -1,
       "broadcast=chain", 3, "broadcast"});
}

namespace {

/// What the two processes of the split test tell each other.
struct split_board {
  std::atomic<int> lender_pid{0};
  std::atomic<int> stopping{0};
};

/// Whether process `pid` is stopped (state T in /proc/PID/stat).
bool is_stopped(int pid) {
  return test::process_state(pid) == 'T';
}

/// Two ranks in forked processes over `transport` on `engine`, the failure
/// detector set to `unresponsive_ms` ("": left as it is): after a barrier
/// rank 1 stops (SIGSTOP); once it is stopped rank 0 runs `body`, then
/// kills it. Checks that rank 0 exited 0 (body said right) and rank 1 was
/// killed.
void with_rank_1_stopped(const char* transport, const char* engine, const char* unresponsive_ms,
                         const std::function<bool(process_group&)>& body) {
  const auto path = test::temp_store_path();
  auto& b = *test::shared_page<split_board>();
  auto codes = test::fork_ranks(2, [&](int r) {
    ::setenv("TROUPE_TRANSPORT", transport, 1);
    ::setenv("TROUPE_ENGINE", engine, 1);
    if (*unresponsive_ms) ::setenv("TROUPE_UNRESPONSIVE_MS", unresponsive_ms, 1);
    auto s = std::make_shared<file_store>(path, 20s);
    world w{test::child_world(s, r, 2, 20s)};
    auto& pg = w.default_group();
    pg.barrier().wait();
    if (r == 1) {
      b.lender_pid = ::getpid();
      b.stopping = 1;
      ::raise(SIGSTOP);
      return false;  // not reached: rank 0 kills this process
    }
    while (b.stopping.load() == 0 || !is_stopped(b.lender_pid.load()))
      std::this_thread::sleep_for(1ms);
    const bool ok = body(pg);
    ::kill(b.lender_pid.load(), SIGKILL);
    return ok;
  });
  ::unlink(path.c_str());
  CHECK(codes == std::vector<int>{0, 128 + SIGKILL});
}

}  // namespace

TEST_CASE(
    "a lender that stops before copying its half of a very large message: the receive fails at "
    "its timeout naming it and what it waited for, or at once when the lender is killed") {
  // A lent message from mailbox::split_bytes is copied by both ends; the
  // receiver cannot finish while its lender has not copied its half. Here
  // the lender stops (SIGSTOP) right after lending: the receive must end at
  // its own timeout with an error naming the lender (not hang), or, when
  // the lender is killed while the receiver waits for its half, within
  // 2 s as a peer failure naming it.
  if (::sysconf(_SC_NPROCESSORS_ONLN) < 2) {
    MESSAGE("skipped: one CPU (messages are not copied by both ends there)");
    return;
  }
  for (bool killed : {false, true}) {
    CAPTURE(killed);
    const auto path = test::temp_store_path();
    auto& b = *test::shared_page<split_board>();
    auto codes = test::fork_ranks(2, [&](int r) {
      ::setenv("TROUPE_TRANSPORT", "shm", 1);
      ::unsetenv("TROUPE_ENGINE");
      ::unsetenv("TROUPE_FABRIC");  // its older name
      auto s = std::make_shared<file_store>(path, 20s);
      world w{test::child_world(s, r, 2, 20s)};
      auto& pg = w.default_group();
      const std::int64_t n = (4 << 20) / 4;
      auto big = tensor::empty_shared({n}, dtype::float32);
      pg.barrier().wait();
      if (r == 0) {
        b.lender_pid = ::getpid();
        auto sent = pg.send(big, 1, 7);
        b.stopping = 1;
        ::raise(SIGSTOP);
        sent.wait(20s);  // not reached: rank 1 kills this process
        return false;
      }
      bool ok = true;
      while (b.stopping.load() == 0 || !is_stopped(b.lender_pid.load()))
        std::this_thread::sleep_for(1ms);
      auto start = test::now_ns();
      auto received = pg.recv({big}, 0, p2p_options{.tag = 7, .timeout = killed ? 20s : 1s});
      if (killed) {
        std::this_thread::sleep_for(100ms);  // it asked for help and copied its half
        ::kill(b.lender_pid.load(), SIGKILL);
        start = test::now_ns();
      }
      try {
        received.wait(30s);
        ok &= expect(r, false, "the receive succeeded without the lender's half");
      } catch (const error& e) {
        const std::string what = e.what();
        ok &= expect(r, e.code() == (killed ? errc::peer_failure : errc::timeout),
                     "not the expected error: " + what);
        ok &=
            expect(r, what.find("rank 0") != std::string::npos, "the lender is not named: " + what);
        if (!killed)
          ok &= expect(r, what.find("copy its half") != std::string::npos,
                       "what it waited for is not said: " + what);
      }
      const auto took_ms = (test::now_ns() - start) / 1000000;
      ok &= expect(r, killed ? took_ms < 2000 : took_ms >= 900 && took_ms < 10000,
                   "the receive ended " + std::to_string(took_ms) + " ms after " +
                       (killed ? "the kill" : "it was issued (timeout: 1 s)"));
      if (!killed) ::kill(b.lender_pid.load(), SIGKILL);
      return ok;
    });
    ::unlink(path.c_str());
    CHECK(codes == std::vector<int>{128 + SIGKILL, 0});
  }
}

TEST_CASE("a write to a stopped peer fails at the operation's timeout, saying how long it ran") {
  // Over TCP on the message engine, rank 1 stops (SIGSTOP) and reads
  // nothing: rank 0's allreduce of 64 MiB fills the connection and its write
  // gives up at the call's 1 s timeout, failing rank 1 with what happened
  // and after how long (not a timeout it never waited for).
  with_rank_1_stopped("tcp", "messages", "", [](process_group& pg) {
    const int r = 0;
    bool ok = true;
    auto big = tensor::zeros({16 << 20}, dtype::float32);
    const auto start = test::now_ns();
    try {
      pg.allreduce(tensor_list{big}, {.timeout = 1000ms}).wait(30s);
      ok &= expect(r, false, "the allreduce with a stopped peer succeeded");
    } catch (const error& e) {
      const std::string what = e.what();
      const auto took_ms = (test::now_ns() - start) / 1000000;
      ok &= expect(r, what.find("world rank 1 (host") != std::string::npos,
                   "the stopped rank is not named: " + what);
      ok &= expect(r, took_ms >= 900 && took_ms < 10000,
                   "it failed " + std::to_string(took_ms) + " ms after the call (timeout: 1 s)");
      // Either the write gave up (saying after how long) or a receive did.
      const auto at = what.find("writing to it timed out after ");
      if (at != std::string::npos) {
        const auto ms = std::atol(what.c_str() + at + 30);
        ok &= expect(r, ms >= 500 && ms <= took_ms,
                     "the write says it ran " + std::to_string(ms) + " ms: " + what);
      } else {
        ok &= expect(r, e.code() == errc::timeout, "neither a write nor a timeout: " + what);
      }
      MESSAGE("a write to a stopped peer: " << what);
    }
    return ok;
  });
}

TEST_CASE("a send to a stopped peer ends at its timeout, on both engines, over TCP and the rings") {
  // Rank 1 stops (SIGSTOP), the failure detector off; rank 0 sends it 16
  // MiB over TCP (eager: written by the sender) and, on one host, sixty-four
  // 128 KiB messages (eager below 256 KiB: they fill the 4 MiB ring). Each
  // send ends by its 1 s timeout (plus a margin), failing, naming rank 1 and
  // saying its write timed out (before, the sender waited for ever).
  struct way {
    const char* transport;
    const char* engine;
    std::int64_t elements;  // float32 per message
    int messages;
  };
  for (const way w : {way{"tcp", "messages", 4 << 20, 1}, way{"auto", "messages", 32 << 10, 64},
                      way{"tcp", "actors", 4 << 20, 1}, way{"auto", "actors", 32 << 10, 64}}) {
    CAPTURE(std::string(w.transport));
    CAPTURE(std::string(w.engine));
    with_rank_1_stopped(w.transport, w.engine, "0", [&](process_group& pg) {
      const int r = 0;
      bool ok = true;
      auto t = tensor::zeros({w.elements}, dtype::float32);
      const auto start = test::now_ns();
      try {
        for (int i = 0; i < w.messages; ++i) pg.send(t, 1, {.tag = i, .timeout = 1000ms}).wait(30s);
        ok &= expect(r, false, "every send to a stopped peer succeeded");
      } catch (const error& e) {
        const std::string what = e.what();
        const auto took_ms = (test::now_ns() - start) / 1000000;
        ok &= expect(r, what.find("rank 1") != std::string::npos,
                     "the stopped rank is not named: " + what);
        ok &= expect(r, what.find("writing to it timed out after") != std::string::npos,
                     "the send does not say its write timed out: " + what);
        ok &= expect(r, took_ms < 5000,
                     "it failed " + std::to_string(took_ms) + " ms after the call (timeout: 1 s)");
        std::fprintf(stderr, "a send to a stopped peer, after %lld ms: %s\n",
                     static_cast<long long>(took_ms), what.c_str());
      }
      return ok;
    });
  }
}
