// send, recv, recv_any_source, tags, batch_isend_irecv, receive timeouts and
// size mismatches.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>

#include "../base/arrival_queue.hpp"
#include "../base/engine_setting.hpp"
#include "../inline/engine.hpp"
#include "../inline/mailbox.hpp"
#include "check_error.hpp"
#include "collective_test.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::test::check_error;

TEST_CASE("send and recv around a ring, for 2, 3, 4 and 7 ranks") {
  for (int n : {2, 3, 4, 7}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int right = (w.rank() + 1) % n;
      const int left = (w.rank() + n - 1) % n;
      auto out = tensor::from_vector<double>({double(w.rank()), 0.5});
      auto in = ref::zeros({2}, dtype::float64);
      auto r = pg.recv(in, left);
      auto s = pg.send(out, right);
      s.wait();
      r.wait();
      CHECK(in.to_vector<double>() == std::vector<double>{double(left), 0.5});
      CHECK(r.source_rank() == left);
    });
  }
}

TEST_CASE("messages with different tags are matched by tag, in order per tag") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    if (w.rank() == 0) {
      pg.send(tensor::from_vector<int>({1}), 1, 5).wait();
      pg.send(tensor::from_vector<int>({2}), 1, 7).wait();
      pg.send(tensor::from_vector<int>({3}), 1, 5).wait();
    } else {
      auto a = ref::zeros({1}, dtype::int32), b = ref::zeros({1}, dtype::int32),
           c = ref::zeros({1}, dtype::int32);
      pg.recv(a, 0, 7).wait();
      pg.recv(b, 0, 5).wait();
      pg.recv(c, 0, 5).wait();
      CHECK(a.to_vector<int>()[0] == 2);
      CHECK(b.to_vector<int>()[0] == 1);
      CHECK(c.to_vector<int>()[0] == 3);
    }
  });
}

TEST_CASE("the mailbox's arrival queue keeps arrival order through takes at the front and within") {
  detail::arrival_queue<std::string> q;
  std::vector<std::string> model;  // what a plain vector would hold
  auto same = [&] { return std::vector<std::string>(q.begin(), q.end()) == model; };
  int next = 0;
  for (int round = 0; round < 300; ++round) {
    for (int i = 0; i < 1 + round % 7; ++i) {
      q.push_back(std::to_string(next));
      model.push_back(std::to_string(next++));
    }
    CHECK(q.back() == model.back());
    // Take the first (usual), or the second (a receive of another tag).
    const auto at = round % 3 == 0 && q.size() > 1 ? 1 : 0;
    auto after = q.erase(q.begin() + at);
    model.erase(model.begin() + at);
    REQUIRE(same());
    REQUIRE(q.size() == model.size());
    CHECK(after == q.begin() + at);
  }
  // A backlog taken whole from the front (its taken front dropped now and
  // then): in order to the last, then empty, and usable again.
  REQUIRE(q.size() > 100);
  for (auto i = q.begin(); i != q.end();) {
    i = q.erase(i);
    model.erase(model.begin());
    REQUIRE(same());
    REQUIRE(i == q.begin());
  }
  CHECK(q.empty());
  q.push_back("again");
  CHECK(std::vector<std::string>(q.begin(), q.end()) == std::vector<std::string>{"again"});
  q.clear();
  CHECK(q.empty());
}

// Messages and receives wait in arrival (post) order and are mostly taken
// from the front: a long backlog is taken in order, whether each match is
// the first one waiting or one further in (another tag first).
TEST_CASE("a receiver far behind its sender takes the backlog in order per tag") {
  constexpr int n = 2000;
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    // Messages first: both tags interleaved; tag 2 taken first (each one past
    // a tag-1 message), then tag 1 (each the first waiting).
    if (w.rank() == 0) {
      std::vector<work> sends;
      for (int i = 0; i < n; ++i)
        sends.push_back(pg.send(tensor::from_vector<int>({i}), 1, 1 + i % 2));
      pg.barrier().wait();
      for (auto& s : sends) s.wait();
    } else {
      pg.barrier().wait();
      auto t = ref::zeros({1}, dtype::int32);
      for (int tag : {2, 1})
        for (int i = tag - 1; i < n; i += 2) {
          pg.recv(t, 0, tag).wait();
          REQUIRE(t.to_vector<int>()[0] == i);
        }
    }
    // Receives first: every one posted before the first message comes.
    if (w.rank() == 1) {
      std::vector<tensor> bufs;
      std::vector<work> recvs;
      for (int i = 0; i < n; ++i) {
        bufs.push_back(ref::zeros({1}, dtype::int32));
        recvs.push_back(pg.recv(bufs.back(), 0, 3));
      }
      pg.barrier().wait();
      for (int i = 0; i < n; ++i) {
        recvs[static_cast<std::size_t>(i)].wait();
        REQUIRE(bufs[static_cast<std::size_t>(i)].to_vector<int>()[0] == i);
      }
    } else {
      pg.barrier().wait();
      for (int i = 0; i < n; ++i) pg.send(tensor::from_vector<int>({i}), 1, 3).wait();
    }
  });
}

TEST_CASE("recv_any_source tells which rank sent") {
  testing::run_ranks(4, [](world& w) {
    auto& pg = w.default_group();
    if (w.rank() != 0) {
      pg.send(tensor::from_vector<int>({w.rank() * 10}), 0, 3).wait();
      return;
    }
    std::vector<int> seen;
    for (int i = 0; i < 3; ++i) {
      auto t = ref::zeros({1}, dtype::int32);
      auto wk = pg.recv_any_source(t, 3);
      wk.wait();
      CHECK(t.to_vector<int>()[0] == wk.source_rank() * 10);
      seen.push_back(wk.source_rank());
    }
    std::sort(seen.begin(), seen.end());
    CHECK(seen == std::vector<int>{1, 2, 3});
  });
}

TEST_CASE("batch_isend_irecv issues every op and completes as one work") {
  for (int n : {2, 3, 7}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      const int right = (w.rank() + 1) % n, left = (w.rank() + n - 1) % n;
      auto from_left = ref::zeros({3}, dtype::float32);
      auto from_right = ref::zeros({3}, dtype::float32);
      auto mine = tensor::from_vector<float>({float(w.rank()), 1, 2});
      std::vector<p2p_op> ops{{p2p_op::irecv, from_left, left, 0},
                              {p2p_op::irecv, from_right, right, 1},
                              {p2p_op::isend, mine, right, 0},
                              {p2p_op::isend, mine, left, 1}};
      auto all = w.default_group().batch_isend_irecv(ops);
      all.wait();
      CHECK(from_left.to_vector<float>()[0] == float(left));
      CHECK(from_right.to_vector<float>()[0] == float(right));
      // Its result: every op's buffer, in the order of the ops.
      const auto out = all.result();
      REQUIRE(out.size() == ops.size());
      for (std::size_t i = 0; i < ops.size(); ++i) CHECK(out[i].data() == ops[i].buffer.data());
    });
  }
}

TEST_CASE("a batch whose receive fails fails naming both sizes; its other receive still arrives") {
  // Between processes a batch's receives share one work: the failure of one
  // fails it, and the others still take their messages.
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    if (w.rank() == 1) {
      pg.send(tensor::from_vector<float>({1, 2, 3, 4}), 0, 1).wait();
      pg.send(tensor::from_vector<float>({5, 6}), 0, 2).wait();
      pg.send(tensor::from_vector<float>({7}), 0, 3).wait();
      pg.barrier().wait();
      return;
    }
    auto small = ref::zeros({3}, dtype::float32);
    auto second = tensor::zeros({2}, dtype::float32);
    std::vector<p2p_op> ops{{p2p_op::irecv, small, 1, 1}, {p2p_op::irecv, second, 1, 2}};
    check_error([&] { pg.batch_isend_irecv(ops).wait(10s); }, errc::invalid_argument,
                {"recv", "tag 1", "16 bytes", "12 bytes"});
    // Tag 3 came after tag 2 from the same sender: once it is here, so is 2.
    auto last = tensor::zeros({1}, dtype::float32);
    pg.recv(last, 1, 3).wait(10s);
    CHECK(last.to_vector<float>()[0] == 7);
    CHECK(second.to_vector<float>() == std::vector<float>{5, 6});
    pg.barrier().wait();
  });
}

TEST_CASE("recv fails after its timeout, naming the peer and tag") {
  testing::run_ranks(2, [](world& w) {
    if (w.rank() != 0) return;
    auto t = ref::zeros({1}, dtype::int32);
    auto wk = w.default_group().recv({t}, 1, {.tag = 9, .timeout = 200ms});
    try {
      wk.wait(10s);
      FAIL("recv should time out");
    } catch (const error& e) {
      CHECK(e.code() == errc::timeout);
      std::string what = e.what();
      CHECK(what.find("Timed out") != std::string::npos);
      CHECK(what.find("rank 1") != std::string::npos);
      CHECK(what.find("tag 9") != std::string::npos);
    }
  });
}

TEST_CASE("recv into a buffer of the wrong size fails and names both sizes") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    if (w.rank() == 0) {
      pg.send(ref::zeros({4}, dtype::float32), 1).wait();
    } else {
      auto t = ref::zeros({3}, dtype::float32);
      auto wk = pg.recv(t, 0);
      try {
        wk.wait(10s);
        FAIL("recv should fail");
      } catch (const error& e) {
        CHECK(e.code() == errc::invalid_argument);
        std::string what = e.what();
        CHECK(what.find("16 bytes") != std::string::npos);
        CHECK(what.find("12 bytes") != std::string::npos);
      }
    }
  });
}

namespace {

/// A tensor of `n` floats (on the suites' device) that tells sender and size apart.
tensor pattern(int sender, std::int64_t n) {
  auto t = tensor::empty({n}, dtype::float32);
  auto* p = t.data_as<float>();
  for (std::int64_t i = 0; i < n; ++i) p[i] = float(sender * 1000 + i % 977);
  if (ref::device() == t.get_device()) return t;
  auto d = ref::empty({n}, dtype::float32);
  d.copy_from(t);
  return d;
}

bool holds_pattern(const tensor& got, int sender) {
  const auto t = ref::host(got);
  const auto* p = t.data_as<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (p[i] != float(sender * 1000 + i % 977)) return false;
  return true;
}

}  // namespace

// Small messages are copied, large ones lent (in one process) or read
// straight into the receive's buffer (between processes): each way must
// deliver the same bytes, in order, whichever comes first.
TEST_CASE("messages of every size arrive whole whether the receive or the message comes first") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int right = (w.rank() + 1) % n, left = (w.rank() + n - 1) % n;
      for (std::int64_t count :
           {std::int64_t{1}, std::int64_t{4097}, std::int64_t{16385}, std::int64_t{262144}}) {
        CAPTURE(count);
        // The receive first: posted before any rank sends.
        auto in = ref::zeros({count}, dtype::float32);
        auto r = pg.recv(in, left, 1);
        pg.barrier().wait();
        auto s = pg.send(pattern(w.rank(), count), right, 1);
        r.wait();
        s.wait();
        CHECK(holds_pattern(in, left));
        // The messages first: two of them, taken in the order sent.
        auto a = ref::zeros({count}, dtype::float32), b = ref::zeros({count}, dtype::float32);
        auto s1 = pg.send(pattern(w.rank(), count), right, 2);
        auto s2 = pg.send(pattern(w.rank() + 7, count), right, 2);
        pg.barrier().wait();
        auto r1 = pg.recv(a, left, 2);
        auto r2 = pg.recv(b, left, 2);
        r1.wait();
        r2.wait();
        s1.wait();
        s2.wait();
        CHECK(holds_pattern(a, left));
        CHECK(holds_pattern(b, left + 7));
        CHECK(r2.source_rank() == left);
      }
    });
  }
}

namespace {

/// Whether large sends from shareable buffers are lent between this run's
/// processes (troupe-run over shared memory, the mailbox's path).
/// Whether calls run on the group actors (TROUPE_ENGINE=actors, or its
/// former name TROUPE_FABRIC=off), whose sends are all eager.
bool on_group_actors() {
  return detail::read_engine_setting() == detail::engine_setting::actors;
}

bool lends_between_processes() {
  const char* transport = std::getenv("TROUPE_TRANSPORT");
  return std::getenv("RANK") && !(transport && std::string(transport) == "tcp") &&
         !on_group_actors();
}

/// `t` filled with pattern(sender, ...) (t: a CPU tensor of floats).
tensor& fill_pattern(tensor& t, int sender) {
  auto* p = t.data_as<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = float(sender * 1000 + i % 977);
  return t;
}

/// Buffers of `count` floats for lent_round: one from empty_shared, one
/// from tensor::empty (shared in place from its second use), two to receive.
struct lent_buffers {
  explicit lent_buffers(std::int64_t count)
      : shared(tensor::empty_shared({count}, dtype::float32)),
        reused(tensor::empty({count}, dtype::float32)),
        a(tensor::empty({count}, dtype::float32)),
        b(tensor::empty({count}, dtype::float32)) {}
  tensor shared, reused, a, b;
};

/// One round of messages to the right neighbour and from the left: the
/// receive first, then two messages with one tag before their receives
/// (taken in the order sent, recv_any_source naming the sender).
void lent_round(process_group& pg, int left, int right, lent_buffers& x, int round) {
  const int me = pg.rank();
  auto r = pg.recv(x.a, left, 1);
  pg.barrier().wait();
  auto s = pg.send(fill_pattern(x.shared, me + round), right, 1);
  r.wait();
  s.wait();
  CHECK(holds_pattern(x.a, left + round));
  auto s1 = pg.send(fill_pattern(x.shared, me), right, 2);
  auto s2 = pg.send(fill_pattern(x.reused, me + 7), right, 2);
  pg.barrier().wait();
  auto r1 = pg.recv_any_source(x.a, 2);
  auto r2 = pg.recv(x.b, left, 2);
  r1.wait();
  r2.wait();
  s1.wait();
  s2.wait();
  CHECK(r1.source_rank() == left);
  CHECK(holds_pattern(x.a, left));
  CHECK(holds_pattern(x.b, left + 7));
}

}  // namespace

// Between processes of one host, a large message from a buffer the receiver
// can map (tensor::empty_shared, or a tensor::empty buffer reused) is lent:
// the receiver copies it once from the sender's buffer and returns the loan.
// Whichever comes first, in order per tag, recv_any_source naming the
// sender; each receive takes exactly one loan.
// A thread that waits for a collective reads its peers' messages too, once
// the process exchanged any (shm_medium::read_rings_of): what arrives then
// must complete its receive, run its callback, and a message larger than a
// ring holds must stream through while both sides wait in collectives.
// A receive that completed stops reading its sender's connection without
// waking the reader thread (in a loop of calls the next one reads again):
// a message that comes while nobody waits must still be taken in by it
// within milliseconds, so that a receive posted later finds it there. (A
// shared-memory ring's reader runs at the lowest priority by design: on a
// loaded machine it may not run for longer, and the receive then completes
// when its rank waits; there only the message's arrival is checked.)
TEST_CASE("a message that comes while nobody waits is taken in before its receive") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int right = (w.rank() + 1) % n, left = (w.rank() + n - 1) % n;
      for (int round = 0; round < 3; ++round) {
        auto first = tensor::zeros({16}, dtype::float32);
        auto r = pg.recv(first, left, 9);
        auto s = pg.send(pattern(w.rank(), 16), right, 9);
        r.wait();
        s.wait();
        // Nobody here waits for anything while the next message comes (its
        // sender sends once this rank's receive surely ended). Issuing the
        // send writes it; the sender says so through the store (its own
        // connection, not the ranks'), so that a sender slow to run on a
        // loaded machine is not taken for a message left unread.
        std::this_thread::sleep_for(20ms);
        auto s2 = pg.send(pattern(w.rank() + 1, 16), right, 10);
        const auto key = [&](int rank) {
          return "p2p-idle/" + std::to_string(n) + "/" + std::to_string(round) + "/" +
                 std::to_string(rank);
        };
        // Where each rank runs (host name and process) comes with it: a
        // sender on this host in another process reaches this rank by a
        // shared-memory ring, unless TROUPE_TRANSPORT=tcp.
        char name[256] = {};
        ::gethostname(name, sizeof name - 1);
        const std::string here = std::string(name) + " " + std::to_string(::getpid());
        w.get_store()->set(key(w.rank()), here);
        const auto there = troupe::to_string(w.get_store()->get(key(left)));
        const char* transport = std::getenv("TROUPE_TRANSPORT");
        const bool ring = there != here &&
                          there.substr(0, there.rfind(' ')) == here.substr(0, here.rfind(' ')) &&
                          !(transport && std::string(transport) == "tcp");
        std::this_thread::sleep_for(100ms);
        auto second = tensor::zeros({16}, dtype::float32);
        auto r2 = pg.recv(second, left, 10);
        // (The group actors complete a receive by a message of their own.)
        if (detail::read_engine_setting() != detail::engine_setting::actors && !ring)
          CHECK(r2.is_completed());
        r2.wait();
        s2.wait();
        CHECK(holds_pattern(second, left + 1));
        pg.barrier().wait();
      }
    });
  }
}

TEST_CASE("messages that arrive while their receiver waits in collectives arrive whole") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int right = (w.rank() + 1) % n, left = (w.rank() + n - 1) % n;
      for (std::int64_t count : {std::int64_t{1}, std::int64_t{2048}, std::int64_t{1} << 21}) {
        CAPTURE(count);
        auto out = pattern(w.rank(), count);
        auto got = tensor::zeros({count}, dtype::float32);
        std::atomic<int> called{0};
        auto r = pg.recv(got, left, 5);
        r.on_complete([&called](const work&) { ++called; });
        auto s = pg.send(out, right, 5);
        auto sum = tensor::from_vector<float>({1.f});
        for (int i = 0; i < 3; ++i) {
          pg.barrier().wait();
          pg.allreduce(sum).wait();
        }
        CHECK(sum.to_vector<float>()[0] == float(n * n * n));
        r.wait();
        s.wait();
        CHECK(holds_pattern(got, left));
        const auto until = std::chrono::steady_clock::now() + 10s;
        while (called.load() == 0 && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(1ms);
        CHECK(called.load() == 1);
        pg.barrier().wait();
      }
    });
  }
}

TEST_CASE("large messages from shareable buffers are lent, taken once, whole and in order") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int right = (w.rank() + 1) % n, left = (w.rank() + n - 1) % n;
      const std::int64_t count = 1 << 17;  // 512 KiB of floats
      lent_buffers x{count};
      const auto taken0 = detail::inline_stats().loans_taken.load();
      std::uint64_t receives = 0;
      for (int round = 0; round < 3; ++round) {
        CAPTURE(round);
        lent_round(pg, left, right, x, round);
        receives += 3;
        pg.barrier().wait();  // the buffers are written again next round
      }
      const auto taken = detail::inline_stats().loans_taken.load() - taken0;
      // A tensor::empty buffer is lent from its second use; every process
      // here has one rank.
      if (lends_between_processes()) CHECK(taken >= receives - 1);
      if (!std::getenv("RANK")) CHECK(taken == 0);  // ranks of one process copy directly
    });
  }
}

// From mailbox::split_bytes, a lent message whose receive buffer can be
// shared too is copied by both ends, each half straight into the receive
// buffer: the bytes must be the same whichever comes first, for odd sizes
// (halves on a page boundary) and receive buffers that cannot be shared (a
// slice of a larger buffer: copied whole by the receiver).
TEST_CASE("very large lent messages are copied by both ends, whole and in order") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int right = (w.rank() + 1) % n, left = (w.rank() + n - 1) % n;
      const auto split_floats =
          static_cast<std::int64_t>(detail::mailbox::split_bytes / sizeof(float));
      const std::int64_t count = split_floats + 1027;  // not a page multiple
      lent_buffers x{count};
      auto big = tensor::empty({count + 4096}, dtype::float32);
      const auto split0 = detail::inline_stats().loans_split.load();
      for (int round = 0; round < 3; ++round) {
        CAPTURE(round);
        lent_round(pg, left, right, x, round);
        pg.barrier().wait();
        // A receive buffer that cannot be shared: a slice of a larger one.
        auto slice = big.flat_slice(4096, count);
        auto r3 = pg.recv(slice, left, 3);
        auto s3 = pg.send(fill_pattern(x.shared, w.rank() + 3), right, 3);
        r3.wait();
        s3.wait();
        CHECK(holds_pattern(slice, left + 3));
        pg.barrier().wait();  // the buffers are written again next round
      }
      const auto split = detail::inline_stats().loans_split.load() - split0;
      // Receive buffers a and b are tensor::empty's: shared from their
      // second use, so at least the later rounds' receives into them split
      // (where every process has a CPU).
      if (lends_between_processes() && w.size() <= ::sysconf(_SC_NPROCESSORS_ONLN))
        CHECK(split >= 4);
      if (!std::getenv("RANK")) CHECK(split == 0);
    });
  }
}

TEST_CASE(
    "a lent message of the wrong size fails its receive, names both sizes, and the send "
    "completes") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    if (w.rank() == 0) {
      auto big = tensor::empty_shared({300000}, dtype::float32);
      pg.send(fill_pattern(big, 0), 1).wait(20s);
      pg.send(tensor::from_vector<int>({5}), 1, 3).wait();
    } else {
      auto t = tensor::empty({299999}, dtype::float32);
      check_error([&] { pg.recv(t, 0).wait(); }, errc::invalid_argument,
                  {"recv", "1200000 bytes", "1199996 bytes"});
      auto next = ref::zeros({1}, dtype::int32);
      pg.recv(next, 0, 3).wait();
      CHECK(next.to_vector<int>()[0] == 5);
    }
  });
}

// In one process a message of split_bytes and more is copied by the thread
// that matched it together with the threads waiting for its send, its
// receive or the batch they are in (kernels/shared_copy.hpp): a halo of
// batches, where each rank's batch takes two such copies at once, with more
// ranks than CPUs too.
TEST_CASE("very large messages between ranks of one process arrive whole in batches") {
  for (int n : {2, 4, 7}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int right = (w.rank() + 1) % n, left = (w.rank() + n - 1) % n;
      const auto count =
          static_cast<std::int64_t>(detail::mailbox::split_bytes / sizeof(float)) * 2 + 1027;
      auto to_right = pattern(w.rank(), count), to_left = pattern(w.rank() + 50, count);
      for (int round = 0; round < 3; ++round) {
        CAPTURE(round);
        auto from_left = ref::zeros({count}, dtype::float32);
        auto from_right = ref::zeros({count}, dtype::float32);
        std::vector<p2p_op> ops{{p2p_op::irecv, from_left, left, 0},
                                {p2p_op::irecv, from_right, right, 1},
                                {p2p_op::isend, to_right, right, 0},
                                {p2p_op::isend, to_left, left, 1}};
        pg.batch_isend_irecv(ops).wait();
        CHECK(holds_pattern(from_left, left));
        CHECK(holds_pattern(from_right, right + 50));
      }
    });
  }
}

// A lent send at its deadline is withdrawn: the receiver drops it, so that
// a later receive with its tag gets the next message, and the send fails
// naming the peer and tag.
TEST_CASE("a lent send nobody receives fails at its deadline and is never received") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    // Lent: between processes (lends_between_processes), and on the
    // mailbox in one process; the group actors' sends are eager.
    const bool waits = std::getenv("RANK") ? lends_between_processes() : !on_group_actors();
    if (w.rank() == 0) {
      auto big = tensor::empty_shared({1 << 18}, dtype::float32);
      auto s = pg.send({big}, 1, {.tag = 4, .timeout = 300ms});
      if (waits)
        check_error([&] { s.wait(20s); }, errc::timeout, {"send", "rank 1", "tag 4"});
      else
        s.wait(20s);  // written out eagerly (TCP, or the group actors' path)
    }
    pg.barrier().wait();
    if (w.rank() == 0) pg.send(tensor::from_vector<int>({9}), 1, 4).wait();
    if (w.rank() == 1 && waits) {
      auto small = ref::zeros({1}, dtype::int32);
      pg.recv(small, 0, 4).wait(20s);
      CHECK(small.to_vector<int>()[0] == 9);
    } else if (w.rank() == 1) {
      auto big = tensor::empty({1 << 18}, dtype::float32);
      auto small = ref::zeros({1}, dtype::int32);
      pg.recv(big, 0, 4).wait(20s);
      pg.recv(small, 0, 4).wait(20s);
      CHECK(small.to_vector<int>()[0] == 9);
    }
  });
}

TEST_CASE("a large message of the wrong size fails its receive and names both sizes") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    if (w.rank() == 0) {
      pg.send(ref::zeros({100000}, dtype::float32), 1).wait();
      pg.send(tensor::from_vector<int>({5}), 1, 3).wait();
    } else {
      auto t = ref::zeros({99999}, dtype::float32);
      check_error([&] { pg.recv(t, 0).wait(); }, errc::invalid_argument,
                  {"recv", "400000 bytes", "399996 bytes"});
      // What follows still arrives.
      auto next = ref::zeros({1}, dtype::int32);
      pg.recv(next, 0, 3).wait();
      CHECK(next.to_vector<int>()[0] == 5);
    }
  });
}

TEST_CASE("a send nobody receives fails at its deadline, naming the peer and tag") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    if (w.rank() == 0) {
      // Large enough to be lent in one process (it waits for its receive);
      // between processes it is written out eagerly and completes.
      auto big = ref::zeros({1 << 18}, dtype::float32);
      auto s = pg.send({big}, 1, {.tag = 4, .timeout = 300ms});
      try {
        s.wait(20s);
      } catch (const error& e) {
        CHECK(e.code() == errc::timeout);
        const std::string what = e.what();
        CHECK(what.find("send") != std::string::npos);
        CHECK(what.find("rank 1") != std::string::npos);
        CHECK(what.find("tag 4") != std::string::npos);
      }
    }
    pg.barrier().wait();
    // A message that timed out is not delivered later: the next one with
    // that tag is the one received.
    if (w.rank() == 0) pg.send(tensor::from_vector<int>({9}), 1, 4).wait();
    if (w.rank() == 1) {
      auto big = ref::zeros({1 << 18}, dtype::float32);
      auto small = ref::zeros({1}, dtype::int32);
      // Across processes the eager large message is there first.
      auto wk = pg.recv(small, 0, 4);
      try {
        wk.wait(20s);
        CHECK(small.to_vector<int>()[0] == 9);
      } catch (const error& e) {
        CHECK(e.code() == errc::invalid_argument);  // it was the large one
        pg.recv(small, 0, 4).wait();
        CHECK(small.to_vector<int>()[0] == 9);
      }
    }
  });
}

TEST_CASE("a rank whose group is destroyed fails the sends waiting for it to receive") {
  // Lent messages exist between ranks of one process, on the mailbox (not
  // the group actors' path, whose sends are all eager).
  if (std::getenv("RANK") || on_group_actors()) return;
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    auto g = w.new_group({0, 1});
    if (w.rank() == 0) {
      auto s = g->send(ref::zeros({1 << 18}, dtype::float32), 1, 6);
      pg.barrier().wait();  // rank 1 destroys its group meanwhile
      pg.barrier().wait();
      check_error([&] { s.wait(20s); }, errc::peer_failure, {"send", "left"});
    } else {
      pg.barrier().wait();
      w.destroy_process_group(g);
      pg.barrier().wait();
    }
  });
}

// A message that waits for its receive counts against its sender's bound
// (1 GiB of waiting payload, transport/frame.hpp) until a receive takes it:
// 17 messages of 64 MiB, each there before its receive, are 1088 MiB in all
// but never more than one at a time.
TEST_CASE("messages that waited for their receive stop counting against the bound once taken") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    const std::int64_t count = 16 << 20;  // floats: 64 MiB
    auto buf = ref::zeros({count}, dtype::float32);
    for (int i = 0; i < 17; ++i) {
      CAPTURE(i);
      if (w.rank() == 0) {
        auto s = pg.send(buf, 1, 8);
        pg.barrier().wait();
        s.wait();
      } else {
        pg.barrier().wait();
        pg.recv(buf, 0, 8).wait();
      }
    }
  });
}

// Ranks of one process: the copies a sender's small messages wait in for
// their receive are bounded as a peer in another process is (max_waiting_messages,
// transport/frame.hpp): past it a send is lent, and completes only once its
// receive took it, so that a sender far ahead of its receiver waits instead
// of filling the receiver's memory. Between processes a peer past the bound
// is failed (test_peer_frames).
TEST_CASE("a sender in this process past the bound of waiting messages waits for its receive") {
  // Every process skips it alike; the group actors (TROUPE_ENGINE=actors) do not bound it.
  if (std::getenv("RANK") || on_group_actors()) return;
  constexpr auto bound = static_cast<int>(detail::max_waiting_messages);
  testing::run_ranks(2, [&](world& w) {
    auto& pg = w.default_group();
    if (w.rank() == 0) {
      for (int i = 0; i < bound; ++i) {
        auto s = pg.send(tensor::from_vector<int>({i}), 1, 4);
        REQUIRE(s.is_completed());  // copied: completed as it returns
      }
      auto past = pg.send(tensor::from_vector<int>({bound}), 1, 4);
      auto other_tag = pg.send(tensor::from_vector<int>({-1}), 1, 5);
      CHECK_FALSE(past.is_completed());
      CHECK_FALSE(other_tag.is_completed());
      pg.barrier().wait();
      past.wait();
      other_tag.wait();
      // Taken: room again.
      CHECK(pg.send(tensor::from_vector<int>({bound + 1}), 1, 4).is_completed());
    } else {
      pg.barrier().wait();
      // On the CPU in the gpu-labelled run too: 65,538 receives into a cuda
      // buffer (two device copies each, with to_vector) can outlast the
      // sends' 60 s timeout on a GPU shared by many test processes.
      auto t = tensor::zeros({1}, dtype::int32);
      pg.recv(t, 0, 5).wait();
      CHECK(t.to_vector<int>()[0] == -1);
      for (int i = 0; i <= bound + 1; ++i) {
        pg.recv(t, 0, 4).wait();
        REQUIRE(t.to_vector<int>()[0] == i);
      }
    }
  });
}

// A receive's callbacks do not run on the thread that completed it when
// that thread is the sender's (ranks of one process) or the one reading the
// sender's frames: a callback that waits for the sender's next message would
// otherwise wait for itself.
TEST_CASE("a receive's callback may wait for the next message from the same sender") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    auto a = ref::zeros({4}, dtype::float32), b = ref::zeros({4}, dtype::float32);
    if (w.rank() == 0) {
      pg.send(pattern(0, 4), 1, 1).wait();
      pg.send(pattern(5, 4), 1, 2).wait();
    } else {
      std::promise<std::string> outcome;
      pg.recv(a, 0, 1).on_complete([&](const work&) {
        try {
          pg.recv({b}, 0, {.tag = 2, .timeout = 10s}).wait();
          outcome.set_value("received");
        } catch (const std::exception& e) {
          outcome.set_value(e.what());
        }
      });
      auto f = outcome.get_future();
      REQUIRE(f.wait_for(30s) == std::future_status::ready);
      CHECK(f.get() == "received");
      CHECK(holds_pattern(a, 0));
      CHECK(holds_pattern(b, 5));
    }
    pg.barrier().wait();
  });
}

// The same for a batch of one process's ranks: its parts complete in the
// sender's thread, which completes the batch there at once (no hand-over to
// another thread for the batch's own bookkeeping), but the batch's callbacks
// and a `then` of it still run elsewhere.
TEST_CASE("a batch's callback may wait for the next message from the same sender") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    auto a = ref::zeros({4}, dtype::float32), b = ref::zeros({4}, dtype::float32);
    auto c = ref::zeros({4}, dtype::float32);
    if (w.rank() == 0) {
      pg.send(pattern(0, 4), 1, 1).wait();
      pg.send(pattern(5, 4), 1, 2).wait();
      pg.send(pattern(9, 4), 1, 3).wait();
    } else {
      std::promise<std::string> outcome, chained;
      auto batch = pg.batch_isend_irecv({{p2p_op::irecv, a, 0, 1}});
      batch.on_complete([&](const work&) {
        try {
          pg.recv({b}, 0, {.tag = 2, .timeout = 10s}).wait();
          outcome.set_value("received");
        } catch (const std::exception& e) {
          outcome.set_value(e.what());
        }
      });
      auto next = batch.then([&](const work&) {
        pg.recv({c}, 0, {.tag = 3, .timeout = 10s}).wait();
        return tensor_list{c};
      });
      next.on_complete(
          [&](const work& done) { chained.set_value(done.is_success() ? "received" : "failed"); });
      auto f = outcome.get_future(), g = chained.get_future();
      REQUIRE(f.wait_for(30s) == std::future_status::ready);
      REQUIRE(g.wait_for(30s) == std::future_status::ready);
      CHECK(f.get() == "received");
      CHECK(g.get() == "received");
      CHECK(holds_pattern(a, 0));
      CHECK(holds_pattern(b, 5));
      CHECK(holds_pattern(c, 9));
    }
    pg.barrier().wait();
  });
}
