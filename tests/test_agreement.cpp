// The agreement check: ranks whose calls differ in the collective, count,
// dtype, reduce op, root, counts per rank or alltoall splits all fail the
// call with errc::mismatch and the same text (naming the ranks and what
// differs), at once rather than at a timeout, and the group works afterwards.
// Run on every engine in one process (the shared segment, the message engine
// with TROUPE_ENGINE=messages, the group actors with TROUPE_ENGINE=actors) and
// by ctest under troupe-run across 2 and 4 processes, over shared memory and
// TCP.

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/agreement.hpp"
#include "base/call.hpp"
#include "base/wait_chain.hpp"
#include "inline/engine.hpp"
#include "scoped_env.hpp"
#include "troupe/error.hpp"
#include "troupe/object_collectives.hpp"
#include "troupe/process_group.hpp"
#include "troupe/store.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

tensor f32(std::int64_t n) {
  return tensor::zeros({n}, dtype::float32);
}

/// A root's list of `n` tensors of `k` elements each.
tensor_list blocks(int n, std::int64_t k) {
  tensor_list l;
  for (int i = 0; i < n; ++i) l.push_back(f32(k));
  return l;
}

struct disagreement {
  const char* what;
  int min_ranks;                   ///< the case needs this many ranks
  std::vector<std::string> words;  ///< every rank's error names these
  std::function<work(int rank, int n, process_group&)> call;
};

constexpr auto t_out = 10000ms;  // far beyond the time a refusal takes

const std::vector<disagreement>& cases() {
  static const std::vector<disagreement> all = {
      {"allreduce counts",
       2,
       {"element count", "5 float32 elements", "4 float32 elements"},
       [](int r, int n, process_group& pg) {
         return pg.allreduce(f32(r == n - 1 ? 5 : 4), {.timeout = t_out});
       }},
      {"allreduce dtypes",
       2,
       {"the dtype", "float64", "float32"},
       [](int r, int, process_group& pg) {
         return pg.allreduce(tensor::zeros({4}, r == 1 ? dtype::float64 : dtype::float32),
                             {.timeout = t_out});
       }},
      {"allreduce ops",
       2,
       {"the reduce op", "(MAX)", "(SUM)"},
       [](int r, int, process_group& pg) {
         return pg.allreduce(f32(4),
                             {.op = r == 1 ? reduce_op::MAX : reduce_op::SUM, .timeout = t_out});
       }},
      {"allreduce AVG against SUM",
       2,
       {"the reduce op", "(AVG)", "(SUM)"},
       [](int r, int, process_group& pg) {
         return pg.allreduce(f32(4),
                             {.op = r == 0 ? reduce_op::AVG : reduce_op::SUM, .timeout = t_out});
       }},
      {"allreduce PREMUL_SUM scale kinds",
       2,
       {"PREMUL_SUM with a tensor scale", "scalar scale"},
       [](int r, int, process_group& pg) {
         auto op = r == 0 ? reduce_op::premul_sum(tensor::from_vector<float>({2.f}))
                          : reduce_op::premul_sum(2.0);
         return pg.allreduce(tensor_list{f32(4)}, {.op = op, .timeout = t_out});
       }},
      {"allreduce large counts",
       2,
       {"element count", "300001 float32", "300000 float32"},
       [](int r, int n, process_group& pg) {
         return pg.allreduce(f32(r == n - 1 ? 300001 : 300000), {.timeout = t_out});
       }},
      // Across the segment's tiny lane limit (1 KiB): the ranks post on
      // different lanes and must still find each other's call.
      {"allreduce counts across the tiny lane",
       2,
       {"element count", "256 float32", "257 float32"},
       [](int r, int n, process_group& pg) {
         return pg.allreduce(f32(r == n - 1 ? 257 : 256), {.timeout = t_out});
       }},
      {"reduce counts across the tiny lane, the larger first",
       2,
       {"element count", "4 float32", "5000 float32"},
       [](int r, int, process_group& pg) {
         return pg.reduce(f32(r == 0 ? 5000 : 4), {.root_rank = 0, .timeout = t_out});
       }},
      {"broadcast counts across the tiny lane",
       2,
       {"element count", "4 float32", "300 float32"},
       [](int r, int, process_group& pg) {
         return pg.broadcast(f32(r == 0 ? 300 : 4), {.root_rank = 0, .timeout = t_out});
       }},
      {"allgather counts across the tiny lane",
       2,
       {"allgather"},
       [](int r, int n, process_group& pg) {
         const std::int64_t k = r == 1 ? 300 : 4;
         return pg.allgather_into_tensor(f32(k * n), f32(k), {.timeout = t_out});
       }},
      {"barrier against a large allreduce",
       2,
       {"the collective", "barrier", "allreduce"},
       [](int r, int, process_group& pg) {
         return r == 1 ? pg.allreduce(f32(3000), {.timeout = t_out})
                       : pg.barrier({.timeout = t_out});
       }},
      {"broadcast roots",
       2,
       {"the root", "from root 1", "from root 0"},
       [](int r, int, process_group& pg) {
         return pg.broadcast(f32(4), {.root_rank = r == 0 ? 0 : 1, .timeout = t_out});
       }},
      {"broadcast counts",
       2,
       {"element count"},
       [](int r, int n, process_group& pg) {
         return pg.broadcast(f32(r == n - 1 ? 5 : 4), {.root_rank = 0, .timeout = t_out});
       }},
      {"reduce roots",
       2,
       {"the root", "to root 0", "to root 1"},
       [](int r, int, process_group& pg) {
         return pg.reduce(f32(4), {.root_rank = r == 0 ? 0 : 1, .timeout = t_out});
       }},
      {"collective kinds",
       2,
       {"the collective", "broadcast", "allreduce"},
       [](int r, int, process_group& pg) {
         auto t = f32(4);
         return r == 0 ? pg.broadcast(t, {.root_rank = 0, .timeout = t_out})
                       : pg.allreduce(t, {.timeout = t_out});
       }},
      {"barrier against allreduce",
       2,
       {"the collective", "barrier", "allreduce"},
       [](int r, int, process_group& pg) {
         return r == 0 ? pg.barrier({.timeout = t_out}) : pg.allreduce(f32(1), {.timeout = t_out});
       }},
      {"allgatherv counts",
       2,
       {"counts per rank"},
       [](int r, int n, process_group& pg) {
         std::vector<std::int64_t> counts(static_cast<std::size_t>(n), 2);
         if (r == n - 1) counts[0] = 3;
         std::int64_t total = 0;
         for (auto c : counts) total += c;
         return pg.allgatherv(f32(total), f32(counts[static_cast<std::size_t>(r)]), counts,
                              {.timeout = t_out});
       }},
      {"allgather counts",
       2,
       {"counts per rank"},
       [](int r, int n, process_group& pg) {
         const std::int64_t k = r == 0 ? 3 : 2;
         return pg.allgather_into_tensor(f32(k * n), f32(k), {.timeout = t_out});
       }},
      {"reduce_scatter ops",
       2,
       {"the reduce op", "(MAX)", "(SUM)"},
       [](int r, int n, process_group& pg) {
         return pg.reduce_scatter_tensor(
             f32(2), f32(2 * n),
             {.op = r == 1 ? reduce_op::MAX : reduce_op::SUM, .timeout = t_out});
       }},
      {"reduce_scatter dtypes",
       2,
       {"the dtype", "float64", "float32"},
       [](int r, int n, process_group& pg) {
         const auto t = r == 0 ? dtype::float64 : dtype::float32;
         return pg.reduce_scatter_tensor(tensor::zeros({2}, t), tensor::zeros({2 * n}, t),
                                         {.timeout = t_out});
       }},
      {"gatherv counts into a root's output the others write",
       2,
       {"counts per rank"},
       [](int r, int n, process_group& pg) {
         std::vector<std::int64_t> counts(static_cast<std::size_t>(n), 20000);
         if (r == n - 1) counts[0] = 20001;
         std::int64_t total = 0;
         for (auto c : counts) total += c;
         return pg.gatherv(f32(total), f32(counts[static_cast<std::size_t>(r)]), counts,
                           {.root_rank = 0, .timeout = t_out});
       }},
      {"gather roots",
       2,
       {"the root"},
       [](int r, int n, process_group& pg) {
         return pg.gatherv(f32(n), f32(1),
                           std::vector<std::int64_t>(static_cast<std::size_t>(n), 1),
                           {.root_rank = r == 0 ? 0 : 1, .timeout = t_out});
       }},
      {"scatter roots",
       2,
       {"the root"},
       [](int r, int n, process_group& pg) {
         return pg.scatterv(f32(1), f32(n),
                            std::vector<std::int64_t>(static_cast<std::size_t>(n), 1),
                            {.root_rank = r == 0 ? 0 : 1, .timeout = t_out});
       }},
      // gather and scatter of one tensor per rank, whose root passes a list.
      {"gather of one tensor: roots",
       2,
       {"the root"},
       [](int r, int n, process_group& pg) {
         const int root = r == 0 ? 0 : 1;
         return pg.gather(r == root ? blocks(n, 2) : tensor_list{}, f32(2),
                          {.root_rank = root, .timeout = t_out});
       }},
      {"gather of one tensor: sizes",
       2,
       {"counts per rank"},
       [](int r, int n, process_group& pg) {
         return pg.gather(r == 0 ? blocks(n, 2) : tensor_list{}, f32(r == n - 1 ? 3 : 2),
                          {.root_rank = 0, .timeout = t_out});
       }},
      {"gather of one tensor: sizes across the tiny lane",
       2,
       {"counts per rank"},
       [](int r, int n, process_group& pg) {
         return pg.gather(r == 0 ? blocks(n, 2) : tensor_list{}, f32(r == 1 ? 300 : 2),
                          {.root_rank = 0, .timeout = t_out});
       }},
      {"scatter of one tensor: roots",
       2,
       {"the root"},
       [](int r, int n, process_group& pg) {
         const int root = r == 0 ? 0 : 1;
         return pg.scatter(f32(2), r == root ? blocks(n, 2) : tensor_list{},
                           {.root_rank = root, .timeout = t_out});
       }},
      {"scatter of one tensor: sizes",
       2,
       {"counts per rank"},
       [](int r, int n, process_group& pg) {
         return pg.scatter(f32(r == n - 1 ? 3 : 2), r == 0 ? blocks(n, 2) : tensor_list{},
                           {.root_rank = 0, .timeout = t_out});
       }},
      {"scatter of one tensor: sizes across the tiny lane",
       2,
       {"counts per rank"},
       [](int r, int n, process_group& pg) {
         return pg.scatter(f32(r == 1 ? 300 : 2), r == 0 ? blocks(n, 2) : tensor_list{},
                           {.root_rank = 0, .timeout = t_out});
       }},
      {"alltoall splits",
       2,
       {"alltoall: rank 0 sends 2 elements to rank 1, which expects 1 from it"},
       [](int r, int n, process_group& pg) {
         std::vector<std::int64_t> in(static_cast<std::size_t>(n), 1), out = in;
         if (r == 0) in[1] = 2;
         std::int64_t total = 0;
         for (auto c : in) total += c;
         return pg.alltoall_single(f32(n), f32(total), out, in, {.timeout = t_out});
       }},
      {"alltoall without split sizes: sizes",
       2,
       {"alltoall: rank", "which expects"},
       [](int r, int n, process_group& pg) {
         const int each = r == n - 1 ? 2 : 1;
         return pg.alltoall_single(f32(each * n), f32(each * n), {}, {}, {.timeout = t_out});
       }},
      {"alltoall without split sizes: sizes across the tiny lane",
       2,
       {"alltoall: rank", "which expects"},
       [](int r, int n, process_group& pg) {
         const int each = r == 1 ? 300 : 1;
         return pg.alltoall_single(f32(each * n), f32(each * n), {}, {}, {.timeout = t_out});
       }},
      {"alltoall splits between two other ranks",
       3,
       {"alltoall: rank 1 sends 2 elements to rank 2, which expects 1 from it"},
       [](int r, int n, process_group& pg) {
         std::vector<std::int64_t> in(static_cast<std::size_t>(n), 1), out = in;
         if (r == 1) in[2] = 2;
         std::int64_t total = 0;
         for (auto c : in) total += c;
         return pg.alltoall_single(f32(n), f32(total), out, in, {.timeout = t_out});
       }},
  };
  return all;
}

/// Runs every case on `n` ranks: each rank must fail with errc::mismatch,
/// quickly, naming the case's words, with the same cause on every rank; the
/// group then works (a broadcast from the last rank).
void run_matrix(int n, const std::vector<disagreement>& which = cases()) {
  for (const auto& c : which) {
    if (n < c.min_ranks) continue;
    CAPTURE(c.what);
    CAPTURE(n);
    testing::run_ranks(n, [&](world& w) {
      auto& pg = w.default_group();
      const auto start = std::chrono::steady_clock::now();
      std::string cause = "no error";
      errc code = errc::internal;
      try {
        c.call(w.rank(), n, pg).wait();
      } catch (const error& e) {
        const std::string what = e.what();
        code = e.code();
        const auto at = what.find("failed: ");
        cause = at == std::string::npos ? what : what.substr(at + 8);
      }
      const auto took = std::chrono::steady_clock::now() - start;
      CAPTURE(cause);
      CHECK(code == errc::mismatch);
      CHECK(cause.find("collective mismatch") != std::string::npos);
      for (const auto& word : c.words) CHECK_MESSAGE(cause.find(word) != std::string::npos, word);
      CHECK(took < 5s);  // refused at once, not at the 10 s timeout
      // Every rank reports the same cause, and the group still works.
      auto causes = all_gather_object(pg, cause);
      for (const auto& other : causes) CHECK(other == cause);
      auto t = tensor::from_vector<float>({float(w.rank())});
      pg.broadcast(t, {.root_rank = n - 1}).wait();
      CHECK(t.to_vector<float>()[0] == float(n - 1));
    });
  }
}

bool under_launcher() {
  return std::getenv("WORLD_SIZE") != nullptr;
}

}  // namespace

TEST_CASE("calls that disagree fail on every rank alike: the default engines") {
  for (int n : {2, 3, 4}) run_matrix(n);
}

TEST_CASE("calls that disagree fail on every rank alike: the message engine") {
  troupe::test::scoped_env s{"TROUPE_ENGINE", "messages"};
  for (int n : under_launcher() ? std::vector<int>{4} : std::vector<int>{2, 3, 4}) run_matrix(n);
}

TEST_CASE("calls that disagree fail on every rank alike: the group actors") {
  troupe::test::scoped_env s{"TROUPE_ENGINE", "actors"};
  for (int n : under_launcher() ? std::vector<int>{4} : std::vector<int>{2, 3, 4}) run_matrix(n);
}

TEST_CASE("a rank that never joins is named at the timeout, not its neighbour") {
  if (under_launcher()) return;  // the inline engine stops after a timeout: no closing barrier
  for (const char* setting : {"messages", "actors"}) {
    CAPTURE(setting);
    troupe::test::scoped_env s{"TROUPE_ENGINE", setting};
    testing::run_ranks(4, [](world& w) {
      auto& pg = w.default_group();
      if (w.rank() == 2) {
        // Joins only the collective after the one the others time out in.
        std::this_thread::sleep_for(700ms);
      } else {
        std::string what;
        try {
          pg.allreduce(f32(1 << 18), {.timeout = 400ms}).wait();
        } catch (const error& e) {
          what = e.what();
          CHECK(e.code() == errc::timeout);
        }
        CAPTURE(what);
        CHECK(what.find("rank 2") != std::string::npos);
        CHECK(what.find("to join this allreduce") != std::string::npos);
      }
    });
  }
}

TEST_CASE("riding the data, calls that disagree still fail on every rank alike") {
  // From TROUPE_AGREEMENT_RING_FROM ranks (17) the fingerprints ride with the
  // data and the ring; a disagreement switches every rank to the full
  // exchange. The inline engine on messages and the group actors.
  for (const char* setting : {"messages", "actors"}) {
    CAPTURE(std::string(setting));
    troupe::test::scoped_env engine{"TROUPE_ENGINE", setting};
    if (!under_launcher()) run_matrix(17);
    troupe::test::scoped_env ring{"TROUPE_AGREEMENT_RING_FROM", "3"};
    for (int n : under_launcher() ? std::vector<int>{4} : std::vector<int>{3, 4}) run_matrix(n);
  }
}

namespace {

/// 17 ranks, the agreement riding the data: rank 2 joins only the call
/// after the allreduce the others time out in.
void never_joins_among_17() {
  testing::run_ranks(17, [](world& w) {
    auto& pg = w.default_group();
    if (w.rank() == 2) {
      std::this_thread::sleep_for(900ms);  // joins only the next collective
      return;
    }
    std::string what;
    try {
      pg.allreduce(f32(1 << 16), {.timeout = 400ms}).wait();
    } catch (const error& e) {
      what = e.what();
      CHECK(e.code() == errc::timeout);
    }
    CAPTURE(what);
    // Its waiters name it; the others name whom they wait for, and the
    // chain of waits to it.
    // (The inline engine describes it: "rank 2 (world rank 2) to join".)
    CHECK((what.find("rank 2 (world rank 2) to join this allreduce") != std::string::npos ||
           what.find("rank 2 to join this allreduce") != std::string::npos));
    // Riding, rank 2 comes first too: as where the chain of waits starts.
    CHECK(what.substr(0, std::min(what.find(", where a chain"), what.find(';')))
              .find("waiting for rank 2 ") != std::string::npos);
    if (what.find(", where a chain") != std::string::npos)
      CHECK(what.find("the wait starts there") != std::string::npos);
  });
}

}  // namespace

TEST_CASE("riding the data, a rank that never joins is named at the end of the wait chain") {
  if (under_launcher()) return;  // the inline engine stops after a timeout: no closing barrier
  for (const char* setting : {"messages", "actors"}) {
    CAPTURE(std::string(setting));
    troupe::test::scoped_env engine{"TROUPE_ENGINE", setting};
    never_joins_among_17();
  }
}

TEST_CASE("riding the data, a call's agreement costs n or n log n messages, not n^2") {
  if (under_launcher()) return;  // counts this process's messages
  troupe::test::scoped_env engine{"TROUPE_ENGINE", "messages"};
  constexpr int n = 24, calls = 10;
  // Messages that carry only the agreement, over `calls` small allreduces,
  // allgathers, barriers, alltoalls on Bruck's steps (n at most each) and
  // broadcasts (dissemination's ceil(log2 24) = 5 rounds: 5n), and the two
  // barriers around them.
  troupe::test::scoped_env bruck{"TROUPE_ALGORITHMS", "alltoall=bruck"};
  auto described = [&](const char* ring_from) {
    troupe::test::scoped_env ring{"TROUPE_AGREEMENT_RING_FROM", ring_from};
    std::uint64_t before = 0, after = 0;
    testing::run_ranks(n, [&](world& w) {
      auto& pg = w.default_group();
      pg.barrier().wait();
      if (w.rank() == 0) before = detail::inline_stats().described.load();
      pg.barrier().wait();
      for (int i = 0; i < calls; ++i) {
        auto t = tensor::from_vector<float>({float(w.rank())});
        pg.allreduce(t).wait();
        CHECK(t.to_vector<float>()[0] == float(n * (n - 1) / 2));
        auto all = f32(n);
        pg.allgather_into_tensor(all, tensor::from_vector<float>({float(w.rank())})).wait();
        CHECK(all.to_vector<float>()[n - 1] == float(n - 1));
        pg.barrier().wait();
        auto b = tensor::from_vector<float>({float(w.rank())});
        pg.broadcast(b, {.root_rank = i % n}).wait();
        CHECK(b.to_vector<float>()[0] == float(i % n));
        auto from = f32(n), to = f32(n);
        for (int q = 0; q < n; ++q) from.data_as<float>()[q] = float(w.rank() * 100 + q);
        pg.alltoall_single(to, from).wait();
        CHECK(to.to_vector<float>()[n - 1] == float((n - 1) * 100 + w.rank()));
      }
      pg.barrier().wait();
      if (w.rank() == 0) after = detail::inline_stats().described.load();
      pg.barrier().wait();
    });
    return after - before;
  };
  const auto riding = described("17"), everyone = described("1000");
  MESSAGE("the agreement's own messages in " << 5 * calls + 2 << " calls of " << n
                                             << " ranks: " << riding << " riding the data, "
                                             << everyone << " telling every peer");
  CHECK(riding <= std::uint64_t{calls * (4 * n + 5 * n) + 3 * n});
  CHECK(everyone >= std::uint64_t{5 * calls * n * (n / 2)});
}

TEST_CASE("an alltoall on Bruck's steps: a rank that passed split sizes disagrees, on every rank") {
  // Bruck's steps need every rank's blocks of one size, which only a call
  // without split sizes promises (as Gloo's alltoall and MPI_Alltoall): a
  // rank that passed them (even ones) runs the pairwise exchange, and every
  // rank is told, not left waiting.
  const std::vector<disagreement> bruck = {
      {"alltoall: split sizes on one rank only",
       3,
       {"whether split sizes were passed", "1 float32 elements to each rank"},
       [](int r, int n, process_group& pg) {
         const std::vector<std::int64_t> even(static_cast<std::size_t>(n), 1);
         return r == 1 ? pg.alltoall_single(f32(n), f32(n), even, even, {.timeout = t_out})
                       : pg.alltoall_single(f32(n), f32(n), {}, {}, {.timeout = t_out});
       }},
      {"alltoall without split sizes on Bruck's steps: an output of another size",
       3,
       {"the elements each rank receives from each",
        "1 float32 elements to each rank, 2 from each"},
       [](int r, int n, process_group& pg) {
         return pg.alltoall_single(f32((r == 1 ? 2 : 1) * n), f32(n), {}, {}, {.timeout = t_out});
       }},
      {"alltoall without split sizes on Bruck's steps: sizes",
       3,
       {"the element count", "2 float32 elements to each rank", "1 float32 elements to each rank"},
       [](int r, int n, process_group& pg) {
         const int each = r == n - 1 ? 2 : 1;
         return pg.alltoall_single(f32(each * n), f32(each * n), {}, {}, {.timeout = t_out});
       }},
  };
  troupe::test::scoped_env forced{"TROUPE_ALGORITHMS", "alltoall=bruck"};
  for (const char* engine : {"messages", "actors"})
    for (const char* ring_from : {"1000", "3"}) {
      CAPTURE(std::string(engine));
      CAPTURE(std::string(ring_from));
      troupe::test::scoped_env e{"TROUPE_ENGINE", engine};
      troupe::test::scoped_env ring{"TROUPE_AGREEMENT_RING_FROM", ring_from};
      for (int n : under_launcher() ? std::vector<int>{4} : std::vector<int>{3, 7})
        run_matrix(n, bruck);
    }
}

TEST_CASE("calls that run on different engines fail with a mismatch on both") {
  // SUM runs on the shared segment, PREMUL_SUM on messages: neither engine
  // sees the other's call, but each sees what the other rank announced.
  if (under_launcher()) return;  // the inline engines stop: no closing barrier
  // The default engines, whatever engine or fabric the environment names
  // (with TROUPE_FABRIC=off both calls run on messages).
  troupe::test::scoped_env engine{"TROUPE_ENGINE", nullptr};
  troupe::test::scoped_env fabric{"TROUPE_FABRIC", nullptr};
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    auto op = w.rank() == 0 ? reduce_op::premul_sum(2.0) : reduce_op(reduce_op::SUM);
    std::string what;
    try {
      pg.allreduce(f32(4), {.op = op, .timeout = t_out}).wait();
    } catch (const error& e) {
      what = e.what();
      CHECK(e.code() == errc::mismatch);
    }
    CAPTURE(what);
    CHECK(what.find("collective mismatch") != std::string::npos);
    CHECK(what.find("another engine") != std::string::npos);
  });
}

TEST_CASE(
    "an alltoall on Bruck's steps whose every output is of another size fails on every rank") {
  if (under_launcher()) return;
  troupe::test::scoped_env forced{"TROUPE_ALGORITHMS", "alltoall=bruck"};
  troupe::test::scoped_env engine{"TROUPE_ENGINE", "messages"};
  testing::run_ranks(3, [](world& w) {
    auto& pg = w.default_group();
    const auto start = std::chrono::steady_clock::now();
    std::string what;
    try {
      pg.alltoall_single(f32(6), f32(3), {}, {}, {.timeout = t_out}).wait();
    } catch (const error& e) {
      what = e.what();
      CHECK(e.code() == errc::invalid_argument);
    }
    CAPTURE(what);
    CHECK(what.find("sends every rank 1 elements but expects to receive 2") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - start < 5s);  // not at the timeout
  });
}

TEST_CASE("a chain of waits is followed to the rank that told none, through a cycle too") {
  // What each rank of call 9 told (base/wait_chain.hpp): "PEER WHAT".
  using namespace std::chrono_literals;
  auto name = [](int r) { return "rank " + std::to_string(r); };
  auto told = [](hash_store& s, int rank, int peer, const std::string& what) {
    s.set("engines/waits/9/" + std::to_string(rank), to_bytes(std::to_string(peer) + " " + what));
  };
  SUBCASE("a straight chain ends at the rank that waits for nobody") {
    auto s = std::make_shared<hash_store>();
    told(*s, 2, 3, "send its data");
    const auto t = detail::wait_chain(s, 9, 1, 5, 2, "send its data", name, 1000ms);
    CHECK(t.start == 3);
    CHECK(t.chain.find("rank 2 was itself waiting for rank 3 to send its data, which has not timed "
                       "out on this call") != std::string::npos);
    CHECK(detail::blame("waiting for rank 2 to send its data", t, name)
              .rfind("waiting for rank 3, where a chain of waits starts", 0) == 0);
  }
  SUBCASE("a cycle of live ranks held up by one outside it: that one starts the wait") {
    // Ranks 1 -> 6 -> 5 -> 1 wait for messages still in flight; rank 3
    // gave up writing to rank 4, which told nothing (stopped).
    auto s = std::make_shared<hash_store>();
    told(*s, 6, 5, "join (agreement round 0)");
    told(*s, 5, 1, "join (agreement round 2)");
    told(*s, 3, 4, "take what it was sent (writing to it timed out)");
    const auto t = detail::wait_chain(s, 9, 1, 7, 6, "join (agreement round 1)", name, 1000ms);
    CHECK(t.start == 4);
    CHECK(t.chain.find("in a cycle, held up where rank 3 was waiting for rank 4 to take what it "
                       "was sent") != std::string::npos);
  }
  SUBCASE("a rank that has not timed out yet but told its wait early is followed through") {
    // Rank 2 issued later (its timeout comes later): at half its timeout it
    // told that it still waited for rank 3 to take its data.
    auto s = std::make_shared<hash_store>();
    detail::tell_wait_early(s, 9, 2, 3, "take what it was sent", 1000ms);
    const auto t = detail::wait_chain(s, 9, 1, 5, 2, "send its data", name, 1000ms);
    CHECK(t.start == 3);
    CHECK(t.chain.find("rank 2 was itself waiting for rank 3 to take what it was sent (still "
                       "waiting after 500 ms, half its call's timeout), which has not timed out") !=
          std::string::npos);
    // Its timeout's word replaces the early one.
    const auto later = detail::wait_chain(s, 9, 2, 5, 4, "send its data", name, 1000ms);
    CHECK(to_string(s->get("engines/waits/9/2")) == "4 send its data");
    CHECK(later.start == -1);
  }
  SUBCASE("a cycle held up by nobody who told: no rank is blamed") {
    auto s = std::make_shared<hash_store>();
    told(*s, 2, 1, "send its data");
    const auto t = detail::wait_chain(s, 9, 1, 3, 2, "send its data", name, 1000ms);
    CHECK(t.start == -1);
    CHECK(t.chain.find("wait for each other in a cycle") != std::string::npos);
  }
}

namespace {

/// A store whose server stopped: every call waits `stall` before it fails.
class stalled_store final : public store {
 public:
  explicit stalled_store(duration stall) : store(stall), stall_(stall) {}
  void set(const std::string&, const bytes&) override { stall(); }
  bytes get(const std::string&) override { stall(); }
  std::int64_t add(const std::string&, std::int64_t) override { stall(); }
  bytes compare_set(const std::string&, const bytes&, const bytes&) override { stall(); }
  bool check(const std::vector<std::string>&) override { stall(); }
  void wait(const std::vector<std::string>&, duration) override { stall(); }
  bool delete_key(const std::string&) override { stall(); }
  std::int64_t num_keys() override { stall(); }
  void append(const std::string&, const bytes&) override { stall(); }
  std::vector<bytes> multi_get(const std::vector<std::string>&) override { stall(); }
  void multi_set(const std::vector<std::string>&, const std::vector<bytes>&) override { stall(); }
  using store::wait;

 private:
  [[noreturn]] void stall() {
    std::this_thread::sleep_for(stall_);
    throw error(errc::timeout, "stalled_store: Timed out");
  }
  duration stall_;
};

}  // namespace

TEST_CASE("a store that does not answer holds neither a told wait nor a timeout's chain") {
  // The store's server stopped (a rank hosting it, as under torchrun): its
  // calls wait for the store's timeout (here 3 s), far past a call's.
  using namespace std::chrono_literals;
  auto s = std::make_shared<stalled_store>(3s);
  auto name = [](int r) { return "rank " + std::to_string(r); };
  const auto start = std::chrono::steady_clock::now();
  detail::tell_wait_early(s, 9, 2, 3, "take what it was sent", 1000ms);
  CHECK(std::chrono::steady_clock::now() - start < 100ms);  // told from a thread of its own
  const auto t = detail::wait_chain(s, 9, 1, 5, 2, "send its data", name, 1000ms);
  CHECK(t.start == -1);
  CHECK(t.chain.empty());
  // A tenth of the timeout (100 ms) and the store's slack (500 ms), not 3 s.
  CHECK(std::chrono::steady_clock::now() - start < 1500ms);
}
