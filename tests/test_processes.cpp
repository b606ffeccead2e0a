// Ranks in several processes (fork): collectives over the data plane, by
// shared memory and by forced TCP, with one or two ranks per process; the
// job token; and a rank killed with SIGKILL, whose peers fail within 2 s
// naming it, its host and its pid.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <thread>

#include "../base/engine_setting.hpp"
#include "../inline/engine.hpp"
#include "../kernels/stream_copy.hpp"
#include "check_error.hpp"
#include "children.hpp"
#include "troupe/object_collectives.hpp"
#include "troupe/troupe.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

constexpr auto npos = std::string::npos;

/// Forks `processes` children; child p hosts world ranks p, p+P, ... (threads)
/// and runs body(world); returns each child's exit code (0: all checks passed).
template <class F, class G>
std::vector<int> run_processes(int processes, int ranks, const char* transport, F body,
                               G while_running) {
  const auto path = troupe::test::temp_store_path();
  std::vector<pid_t> pids;
  for (int p = 0; p < processes; ++p) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("TROUPE_TRANSPORT", transport, 1);
      ::setenv("TROUPE_JOB_TOKEN", "0123456789abcdef", 1);
      int failures = 0;
      std::vector<std::thread> threads;
      std::mutex mtx;
      for (int r = p; r < ranks; r += processes)
        threads.emplace_back([&, r] {
          try {
            auto s = std::make_shared<file_store>(path, 20s);
            world_options o;
            o.store = s;
            o.rank = r;
            o.world_size = ranks;
            o.timeout = 20s;
            world w{o};
            if (!body(w)) {
              std::lock_guard<std::mutex> g{mtx};
              ++failures;
            }
            w.default_group().barrier().wait();  // keep this world until the others are done
          } catch (const std::exception& e) {
            std::fprintf(stderr, "rank %d: %s\n", r, e.what());
            std::lock_guard<std::mutex> g{mtx};
            ++failures;
          }
        });
      for (auto& t : threads) t.join();
      std::fflush(stderr);
      ::_exit(failures == 0 ? 0 : 1);
    }
    pids.push_back(pid);
  }
  while_running(path, pids);
  auto codes = troupe::test::wait_for_children(pids);
  ::unlink(path.c_str());
  return codes;
}

template <class F>
std::vector<int> run_processes(int processes, int ranks, const char* transport, F body) {
  return run_processes(processes, ranks, transport, body,
                       [](const std::string&, const std::vector<pid_t>&) {});
}

/// A few collectives with checked results; false on any mismatch.
bool collectives(world& w) {
  auto& pg = w.default_group();
  const int n = w.size(), me = w.rank();
  bool ok = true;
  for (std::int64_t len : {0, 1, 1000, 300000}) {
    auto x = tensor::empty({len}, dtype::float32);
    for (std::int64_t i = 0; i < len; ++i) x.data_as<float>()[i] = float(me + i % 7);
    pg.allreduce(x).wait();
    for (std::int64_t i = 0; i < len; ++i)
      ok &= x.data_as<float>()[i] == float(n * (n - 1) / 2 + n * (i % 7));
    auto b = tensor::from_vector<std::int64_t>({me, 2 * me});
    pg.broadcast(b, n - 1).wait();
    ok &= b.to_vector<std::int64_t>() == std::vector<std::int64_t>{n - 1, 2 * (n - 1)};
  }
  // A large buffer reused: staged, then (over shared memory) shared in place.
  auto big = tensor::empty({(1 << 20) + 7}, dtype::float32);
  for (int use = 0; use < 3; ++use) {
    for (std::int64_t i = 0; i < big.numel(); ++i)
      big.data_as<float>()[i] = float(me + use + i % 3);
    pg.allreduce(big).wait();
    for (std::int64_t i = 0; i < big.numel(); i += 4001)
      ok &= big.data_as<float>()[i] == float(n * (n - 1) / 2 + n * (use + i % 3));
  }
  auto all = tensor::zeros({n}, dtype::int32);
  pg.allgather_into_tensor(all, tensor::from_vector<int>({me * 3})).wait();
  for (int r = 0; r < n; ++r) ok &= all.to_vector<int>()[static_cast<std::size_t>(r)] == r * 3;
  auto in = tensor::empty({n}, dtype::int32), out = tensor::zeros({n}, dtype::int32);
  for (int r = 0; r < n; ++r) in.data_as<int>()[r] = 100 * me + r;
  pg.alltoall_single(out, in).wait();
  for (int r = 0; r < n; ++r) ok &= out.data_as<int>()[r] == 100 * r + me;
  if (n > 1) {
    auto got = tensor::zeros({2}, dtype::float64);
    auto rv = pg.recv(got, (me + n - 1) % n);
    pg.send(tensor::from_vector<double>({double(me), 0.5}), (me + 1) % n).wait();
    rv.wait();
    ok &= got.to_vector<double>()[0] == double((me + n - 1) % n);
  }
  auto seq = pg.sequence_number();
  auto seqs = all_gather_object(pg, seq);
  for (auto s : seqs) ok &= s == seq;
  if (!ok) std::fprintf(stderr, "rank %d: a collective result was wrong\n", me);
  return ok;
}

/// Whether the case, which counts the shared-memory engine's copies, skips
/// (saying so): under another route (TROUPE_ENGINE, or its older name
/// TROUPE_FABRIC) every call still runs and checks its result in the other
/// cases.
bool skips_off_the_shared_engine() {
  if (detail::read_engine_setting() == detail::engine_setting::inline_engine) return false;
  MESSAGE("skipped: " << detail::engine_setting_source()
                      << " (the case counts the shared-memory engine's copies)");
  return true;
}

}  // namespace

TEST_CASE("collectives across 2 and 4 processes over shared memory and over TCP") {
  for (const char* transport : {"shm", "tcp"})
    for (int processes : {2, 4}) {
      const std::string via = transport;
      CAPTURE(via);
      CAPTURE(processes);
      auto codes = run_processes(processes, processes, transport, collectives);
      for (auto c : codes) CHECK(c == 0);
    }
}

TEST_CASE("several ranks per process, mixed with ranks in other processes") {
  auto codes = run_processes(2, 5, "auto", collectives);
  for (auto c : codes) CHECK(c == 0);
}

namespace {

/// Fills `x` with rank- and index-dependent floats; the sum over n ranks is
/// expected_sum(n, i).
void fill_rank(tensor& x, int me) {
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = float(me + i % 5);
}
bool summed(const tensor& x, int n) {
  bool ok = true;
  for (std::int64_t i = 0; i < x.numel(); ++i)
    ok &= x.data_as<float>()[i] == float(n * (n - 1) / 2 + n * (i % 5));
  return ok;
}

/// Says on stderr, and remembers, what went wrong on one rank.
struct verdict {
  int rank;
  bool ok = true;
  void operator()(bool good, const std::string& what) {
    if (!good) std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
    ok &= good;
  }
};

/// Runs body(world, verdict) on 2, then 4 processes over shared memory;
/// every process must pass.
template <class F>
void on_2_and_4_shm_processes(F body) {
  for (int processes : {2, 4}) {
    CAPTURE(processes);
    auto codes = run_processes(processes, processes, "shm", [&](world& w) {
      verdict v{w.rank()};
      body(w, v);
      return v.ok;
    });
    for (auto c : codes) CHECK(c == 0);
  }
}

/// Bytes copied per byte reduced by an allreduce across n processes: direct
/// (each rank writes its reduced part into the n-1 other buffers) and staged
/// (a buffer is not shared: stage, own part, gather; with 2 ranks each stages
/// its whole buffer).
std::pair<double, double> direct_and_staged_copies(int n) {
  return {double(n - 1) / n, n == 2 ? 1.0 : double(2 * n - 1) / n};
}

/// False (and says so) when `got` bytes copied per byte is not `want`.
bool copies_as_expected(int me, const char* what, double got, double want) {
  if (got > want - 0.01 && got < want + 0.01) return true;
  std::fprintf(stderr, "rank %d: %s: %.3f bytes copied per byte, expected %.3f\n", me, what, got,
               want);
  return false;
}

/// Bytes this process copied per byte it reduced during `f` (one rank per process).
template <class F>
double copies_per_byte(F&& f) {
  const auto c0 = detail::inline_stats().copied.load(), r0 = detail::inline_stats().reduced.load();
  f();
  const auto c = detail::inline_stats().copied.load() - c0;
  const auto r = detail::inline_stats().reduced.load() - r0;
  return r == 0 ? -1.0 : double(c) / double(r);
}

}  // namespace

TEST_CASE(
    "large broadcast, allgather, gather, scatter, reduce_scatter and alltoall between processes") {
  // Over shared memory through the segment's staging slots (256 KiB chunks,
  // 4 in flight); over TCP as segmented messages, copied into place by the
  // receiving thread: sizes of many chunks and segments, uneven counts, calls
  // in flight at once and interleaved with chunked allreduces.
  // Over shared memory also with every output streamed past the caches
  // (kernels/stream_copy.hpp; by default only outputs larger than the cache).
  for (const char* transport : {"shm", "tcp", "shm streamed"})
    for (int processes : {2, 4}) {
      const std::string via = transport;
      CAPTURE(via);
      CAPTURE(processes);
      const bool streamed = via == "shm streamed";
      detail::set_stream_threshold(streamed ? 1 : 0);  // the children inherit it
      auto codes = run_processes(processes, processes, streamed ? "shm" : transport, [](world& w) {
        auto& pg = w.default_group();
        const int n = w.size(), me = w.rank();
        bool ok = true;
        auto expect = [&](bool good, const char* what) {
          if (!good) std::fprintf(stderr, "rank %d: %s was wrong\n", me, what);
          ok &= good;
        };
        const std::int64_t len = 700001;  // 2.8 MB of float32: 11 chunks
        auto value = [](int r, std::int64_t i) { return float(r * 7 + i % 13); };
        // broadcast from the last rank, twice in flight, with an allreduce between.
        auto b1 = tensor::empty({len}, dtype::float32), b2 = tensor::empty({len}, dtype::float32);
        auto a = tensor::empty({len}, dtype::float32);
        for (std::int64_t i = 0; i < len; ++i) {
          b1.data_as<float>()[i] = b2.data_as<float>()[i] = value(me, i);
          a.data_as<float>()[i] = 1.f;
        }
        auto w1 = pg.broadcast(tensor_list{b1}, {.root_rank = n - 1});
        auto w2 = pg.allreduce(tensor_list{a});
        auto w3 = pg.broadcast(tensor_list{b2}, {.root_rank = 0});
        w1.wait(), w2.wait(), w3.wait();
        bool good = true;
        for (std::int64_t i = 0; i < len; ++i)
          good &= b1.data_as<float>()[i] == value(n - 1, i) &&
                  b2.data_as<float>()[i] == value(0, i) && a.data_as<float>()[i] == float(n);
        expect(good, "broadcast / allreduce");
        // allgatherv with uneven counts (rank r: len + 1000 r elements).
        std::vector<std::int64_t> counts;
        for (int r = 0; r < n; ++r) counts.push_back(len + 1000 * r);
        const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
        auto in = tensor::empty({counts[static_cast<std::size_t>(me)]}, dtype::float32);
        for (std::int64_t i = 0; i < in.numel(); ++i) in.data_as<float>()[i] = value(me, i);
        auto all = tensor::zeros({total}, dtype::float32);
        auto gathered = tensor::zeros({total}, dtype::float32);
        pg.allgatherv(all, in, counts).wait();
        pg.gatherv(gathered, in, counts, {.root_rank = 1}).wait();
        good = true;
        std::int64_t at = 0;
        for (int r = 0; r < n; ++r)
          for (std::int64_t i = 0; i < counts[static_cast<std::size_t>(r)]; ++i, ++at) {
            good &= all.data_as<float>()[at] == value(r, i);
            if (me == 1) good &= gathered.data_as<float>()[at] == value(r, i);
          }
        expect(good, "allgatherv / gatherv");
        // scatterv from rank 0: rank r gets its counts[r] elements of the whole.
        auto whole = tensor::empty({total}, dtype::float32);
        for (std::int64_t i = 0; i < total; ++i) whole.data_as<float>()[i] = float(i % 1009);
        auto part = tensor::zeros({counts[static_cast<std::size_t>(me)]}, dtype::float32);
        pg.scatterv(part, whole, counts, {.root_rank = 0}).wait();
        const auto first = std::accumulate(counts.begin(), counts.begin() + me, std::int64_t{0});
        good = true;
        for (std::int64_t i = 0; i < part.numel(); ++i)
          good &= part.data_as<float>()[i] == float((first + i) % 1009);
        expect(good, "scatterv");
        // reduce_scatter_tensor with AVG: block me of the average of every input.
        auto mine = tensor::empty({len * n}, dtype::float32);
        for (std::int64_t i = 0; i < len * n; ++i) mine.data_as<float>()[i] = float(me + i % 3);
        auto block = tensor::zeros({len}, dtype::float32);
        pg.reduce_scatter_tensor(block, mine, {.op = reduce_op::AVG}).wait();
        good = true;
        for (std::int64_t i = 0; i < len; ++i)
          good &= block.data_as<float>()[i] == float(n - 1) / 2.f + float((me * len + i) % 3);
        expect(good, "reduce_scatter_tensor AVG");
        // alltoall_single with uneven splits: rank s sends 100000 + 1000 s + d
        // elements to rank d.
        auto split = [](int from, int to) { return std::int64_t{100000} + 1000 * from + to; };
        std::vector<std::int64_t> in_splits, out_splits;
        for (int q = 0; q < n; ++q) {
          in_splits.push_back(split(me, q));
          out_splits.push_back(split(q, me));
        }
        auto sum = [](const std::vector<std::int64_t>& v) {
          return std::accumulate(v.begin(), v.end(), std::int64_t{0});
        };
        auto send = tensor::empty({sum(in_splits)}, dtype::float32);
        auto recv = tensor::zeros({sum(out_splits)}, dtype::float32);
        std::int64_t k = 0;
        for (int d = 0; d < n; ++d)
          for (std::int64_t i = 0; i < split(me, d); ++i, ++k)
            send.data_as<float>()[k] = float(me * 100 + d + i % 7);
        pg.alltoall_single(recv, send, out_splits, in_splits).wait();
        good = true;
        k = 0;
        for (int q = 0; q < n; ++q)
          for (std::int64_t i = 0; i < split(q, me); ++i, ++k)
            good &= recv.data_as<float>()[k] == float(q * 100 + me + i % 7);
        expect(good, "alltoall_single");
        return ok;
      });
      detail::set_stream_threshold(0);
      for (auto c : codes) CHECK(c == 0);
    }
}

TEST_CASE("allreduce between processes on empty_shared tensors reads the peers' buffers") {
  if (skips_off_the_shared_engine()) return;
  // Direct: each rank writes its reduced part into the n-1 other buffers,
  // (n-1)/n bytes per byte; staged (a buffer is not shared): (2n-1)/n, with
  // 2 ranks 1 (each stages its whole buffer, or copies it into its slot).
  for (int processes : {2, 4}) {
    CAPTURE(processes);
    auto codes = run_processes(processes, processes, "shm", [](world& w) {
      auto& pg = w.default_group();
      const int n = w.size(), me = w.rank();
      bool ok = true;
      auto report = [&](const char* what, double got, double want) {
        ok &= copies_as_expected(me, what, got, want);
      };
      const auto [direct, staged] = direct_and_staged_copies(n);
      // Above the slots (1 MiB with 2 ranks, 32 KiB with more): 4 MiB, three
      // times on the same tensor (mapped once), then a fresh one.
      for (int round = 0; round < 2; ++round) {
        auto x = tensor::empty_shared({1 << 20}, dtype::float32);
        for (int rep = 0; rep < 3; ++rep) {
          fill_rank(x, me);
          report("shared", copies_per_byte([&] { pg.allreduce(x).wait(); }), direct);
          ok &= summed(x, n);
        }
      }
      // More fresh buffers than a peer keeps mapped (32): the oldest are unmapped.
      for (int k = 0; k < 40; ++k) {
        auto y = tensor::empty_shared({(1 << 18) + 16}, dtype::float32);
        fill_rank(y, me + k);
        pg.allreduce(y).wait();
        for (std::int64_t i = 0; i < y.numel(); i += 4099)
          ok &= y.data_as<float>()[i] == float(n * (n - 1) / 2 + n * k + n * (i % 5));
      }
      // A slice of a shared allocation (an offset into it).
      auto big = tensor::empty_shared({3 << 20}, dtype::float32);
      auto part = big.flat_slice(1 << 20, 1 << 20);
      fill_rank(part, me);
      report("slice", copies_per_byte([&] { pg.allreduce(part).wait(); }), direct);
      ok &= summed(part, n);
      // One rank's buffer is private (borrowed memory cannot be shared in
      // place): every rank stages, results are the same.
      std::vector<float> own(1 << 20);
      auto mixed = me == n - 1 ? tensor::from_blob(own.data(), {1 << 20}, dtype::float32)
                               : tensor::empty_shared({1 << 20}, dtype::float32);
      fill_rank(mixed, me);
      report("mixed", copies_per_byte([&] { pg.allreduce(mixed).wait(); }), staged);
      ok &= summed(mixed, n);
      // Buffers that fit a slot (up to 1 MiB with 2 ranks): above 32 KiB they
      // go direct when every rank's is shared, and are copied into the slots
      // (one byte per byte with 2 ranks) only when one is private; up to
      // 32 KiB always through the slots in one step.
      for (const std::int64_t elems : {std::int64_t{(1 << 17) + 5}, std::int64_t{8192 + 64}}) {
        CAPTURE(elems);
        auto s = tensor::empty_shared({elems}, dtype::float32);
        fill_rank(s, me);
        report("shared, fits a slot", copies_per_byte([&] { pg.allreduce(s).wait(); }), direct);
        ok &= summed(s, n);
        std::vector<float> mine(static_cast<std::size_t>(elems));
        auto p = me == 0 ? tensor::from_blob(mine.data(), {elems}, dtype::float32)
                         : tensor::empty_shared({elems}, dtype::float32);
        fill_rank(p, me);
        report("one private, fits a slot", copies_per_byte([&] { pg.allreduce(p).wait(); }),
               staged);
        ok &= summed(p, n);
        fill_rank(p, me);
        pg.allreduce(p, reduce_op::AVG).wait();
        for (std::int64_t i = 0; i < elems; i += 97)
          ok &= p.data_as<float>()[i] == float(n * (n - 1) / 2 + n * (i % 5)) / float(n);
      }
      auto edge = tensor::empty_shared({8192}, dtype::float32);  // 32 KiB: one step
      fill_rank(edge, me);
      report("32 KiB", copies_per_byte([&] { pg.allreduce(edge).wait(); }), 1.0);
      ok &= summed(edge, n);
      if (!ok) std::fprintf(stderr, "rank %d: a shared allreduce went wrong\n", me);
      return ok;
    });
    for (auto c : codes) CHECK(c == 0);
  }
}

namespace {

/// Shared-memory descriptors (memfds of shared tensors) this process has open.
int open_memfds() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    n += std::filesystem::read_symlink(e.path(), ec).string().find("troupe-shared-tensor") !=
         std::string::npos;
  }
  return n;
}

}  // namespace

TEST_CASE(
    "a large tensor::empty buffer moves into shared memory in place on its second allreduce") {
  if (skips_off_the_shared_engine()) return;
  // The second allreduce between processes of a whole large allocation of
  // tensor::empty (64 KiB or more) makes it shared memory at the same address
  // with the same contents, and reads the peers' buffers (direct) from then
  // on; the first stages. A slice of an allocation, borrowed memory and
  // TROUPE_SHARE_IN_PLACE=off stay private (staged). Freed buffers release
  // their descriptors.
  on_2_and_4_shm_processes([](world& w, verdict& expect) {
    auto& pg = w.default_group();
    const int n = w.size(), me = w.rank();
    auto check_copies = [&](const char* what, double got, double want) {
      expect.ok &= copies_as_expected(me, what, got, want);
    };
    const auto [direct, staged] = direct_and_staged_copies(n);
    {
      auto x = tensor::empty({(1 << 20) + 3}, dtype::float32);  // 4 MiB and a ragged tail
      void* at = x.data();
      fill_rank(x, me);
      check_copies("first", copies_per_byte([&] { pg.allreduce(x).wait(); }), staged);
      expect(summed(x, n), "the first allreduce's result");
      fill_rank(x, me);
      check_copies("second", copies_per_byte([&] { pg.allreduce(x).wait(); }), direct);
      expect(x.data() == at && summed(x, n), "the second allreduce's result or address");
      fill_rank(x, me);
      check_copies("third", copies_per_byte([&] { pg.allreduce(x).wait(); }), direct);
      expect(summed(x, n), "the third allreduce's result");
      // The memory stays usable as ever: written and read here, reduced again.
      for (std::int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = 1.f;
      pg.allreduce(x, reduce_op::MAX).wait();
      expect(x.data_as<float>()[x.numel() - 1] == 1.f, "MAX after writing the shared buffer");
    }
    // A middle-sized buffer (from the pool of freed buffers, 512 KiB) too:
    // above the one-step slots with more than 2 ranks (32 KiB); with 2 ranks
    // it fits a slot (1 MiB) and is copied there only while it is private.
    {
      auto m = tensor::empty({1 << 17}, dtype::float32);
      for (int use = 0; use < 3; ++use) {
        fill_rank(m, me + use);
        const double want = use == 0 ? staged : direct;
        check_copies("middle", copies_per_byte([&] { pg.allreduce(m).wait(); }), want);
        for (std::int64_t i = 0; i < m.numel(); i += 1021)
          expect.ok &= m.data_as<float>()[i] == float(n * (n - 1) / 2 + n * use + n * (i % 5));
      }
    }
    // (The pool keeps the middle-sized buffer, and its memfd, for reuse.)
    const int fds = open_memfds();
    // A slice of a larger allocation stays private.
    auto big = tensor::empty({3 << 20}, dtype::float32);
    auto part = big.flat_slice(1 << 20, 1 << 20);
    fill_rank(part, me);
    for (int k = 0; k < 2; ++k) {
      fill_rank(part, me);
      check_copies("slice", copies_per_byte([&] { pg.allreduce(part).wait(); }), staged);
      expect(summed(part, n), "the slice's result");
    }
    // Switched off (read at each allreduce): staged, as before.
    ::setenv("TROUPE_SHARE_IN_PLACE", "off", 1);
    auto y = tensor::empty({1 << 20}, dtype::float32);
    for (int k = 0; k < 2; ++k) {
      fill_rank(y, me);
      check_copies("off", copies_per_byte([&] { pg.allreduce(y).wait(); }), staged);
      expect(summed(y, n), "the result with sharing off");
    }
    ::unsetenv("TROUPE_SHARE_IN_PLACE");
    // Many fresh buffers shared (used twice) and freed: no descriptor stays
    // open, and the peers unmap the oldest.
    for (int k = 0; k < 40; ++k) {
      auto z = tensor::empty({1 << 19}, dtype::float32);  // 2 MiB
      for (int use = 0; use < 2; ++use) {
        fill_rank(z, me + k);
        pg.allreduce(z).wait();
        expect(z.data_as<float>()[7] == float(n * (n - 1) / 2 + n * k + n * 2), "a fresh buffer");
      }
    }
    pg.barrier().wait();
    expect(open_memfds() == fds,
           "shared-memory descriptors open: " + std::to_string(open_memfds()) + ", before " +
               std::to_string(fds));
  });
}

TEST_CASE(
    "large collectives between processes on reused buffers: alltoall, reduce_scatter, gather and "
    "scatter pull") {
  if (skips_off_the_shared_engine()) return;
  // broadcast, allgather, gather, scatter, reduce_scatter and alltoall on
  // large tensor::empty inputs, twice each: the first call stages every byte
  // through the segment; at the second, alltoall, reduce_scatter and scatter
  // (their inputs now shared memory) copy straight from the peers' inputs,
  // each byte once: the ranks that staged copy fewer bytes (a scatter's
  // non-root copies its own block either way). A gather's root, its output
  // now shared, has the others write their blocks into it: it copies only
  // its own (they stage theirs, then write them, as many bytes). The results
  // are the same every time.
  on_2_and_4_shm_processes([](world& w, verdict& expect) {
    auto& pg = w.default_group();
    const int n = w.size(), me = w.rank();
    auto copied = [] { return detail::inline_stats().copied.load(); };
    // Runs `call` twice (results checked by `good`): the second copies less
    // on this rank when `pulls`, else as much.
    auto twice = [&](const char* what, auto call, auto good, bool pulls = false) {
      std::uint64_t bytes[2];
      for (int use = 0; use < 2; ++use) {
        const auto before = copied();
        call();
        bytes[use] = copied() - before;
        expect(good(), std::string(what) + ": a wrong result at use " + std::to_string(use + 1));
      }
      // Pulling, this rank copies less (it no longer stages); else the same.
      expect(pulls ? bytes[1] < bytes[0] : bytes[1] == bytes[0],
             std::string(what) + ": copied " + std::to_string(bytes[0]) + " then " +
                 std::to_string(bytes[1]) + " bytes");
    };
    const std::int64_t len = (1 << 19) + 3;  // 2 MiB of float32 and a ragged tail
    auto value = [](int r, std::int64_t i) { return float(r * 11 + i % 17); };
    auto fill = [&](tensor& t, int r) {
      for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = value(r, i);
    };
    // broadcast from the last rank (the root's buffer is the shared one).
    auto b = tensor::empty({len}, dtype::float32);
    twice(
        "broadcast",
        [&] {
          fill(b, me);
          pg.broadcast(b, n - 1).wait();
        },
        [&] {
          bool g = true;
          for (std::int64_t i = 0; i < len; i += 997) g &= b.data_as<float>()[i] == value(n - 1, i);
          return g && b.data_as<float>()[len - 1] == value(n - 1, len - 1);
        });
    // allgather and gather (to rank 1) of every rank's block.
    auto in = tensor::empty({len}, dtype::float32);
    fill(in, me);
    auto all = tensor::zeros({len * n}, dtype::float32),
         some = tensor::zeros({len * n}, dtype::float32);
    auto gathered = [&](const tensor& t) {
      bool g = true;
      for (int r = 0; r < n; ++r)
        for (std::int64_t i = 0; i < len; i += 1009)
          g &= t.data_as<float>()[r * len + i] == value(r, i);
      return g && t.data_as<float>()[n * len - 1] == value(n - 1, len - 1);
    };
    twice(
        "allgather", [&] { pg.allgather_into_tensor(all, in).wait(); },
        [&] { return gathered(all); });
    std::vector<std::int64_t> counts(static_cast<std::size_t>(n), len);
    twice(
        "gather", [&] { pg.gatherv(some, in, counts, {.root_rank = 1}).wait(); },
        [&] { return me != 1 || gathered(some); }, me == 1);
    // scatter from rank 0 and reduce_scatter of a whole of n blocks.
    auto whole = tensor::empty({len * n}, dtype::float32);
    for (std::int64_t i = 0; i < len * n; ++i) whole.data_as<float>()[i] = float(i % 1013);
    auto part = tensor::zeros({len}, dtype::float32);
    twice(
        "scatter", [&] { pg.scatterv(part, whole, counts, {.root_rank = 0}).wait(); },
        [&] {
          bool g = true;
          for (std::int64_t i = 0; i < len; i += 991)
            g &= part.data_as<float>()[i] == float((me * len + i) % 1013);
          return g;
        },
        me == 0);
    twice(
        "reduce_scatter", [&] { pg.reduce_scatter_tensor(part, whole).wait(); },
        [&] {
          bool g = true;
          for (std::int64_t i = 0; i < len; i += 991)
            g &= part.data_as<float>()[i] == float(n * ((me * len + i) % 1013));
          return g;
        },
        true);
    // alltoall: block d of rank s holds s * 100 + d.
    auto send = tensor::empty({len * n}, dtype::float32),
         recv = tensor::zeros({len * n}, dtype::float32);
    for (int d = 0; d < n; ++d)
      for (std::int64_t i = 0; i < len; ++i)
        send.data_as<float>()[d * len + i] = float(me * 100 + d);
    twice(
        "alltoall", [&] { pg.alltoall_single(recv, send).wait(); },
        [&] {
          bool g = true;
          for (int q = 0; q < n; ++q)
            g &= recv.data_as<float>()[q * len] == float(q * 100 + me) &&
                 recv.data_as<float>()[q * len + len - 1] == float(q * 100 + me);
          return g;
        },
        true);
  });
}

TEST_CASE("over TCP, large 2-rank allreduces are reduced by the receiving thread, exactly") {
  // Above 1 MiB the data plane's reader thread reduces each segment as it
  // arrives while the caller's thread sends: every op, several dtypes, a
  // length that leaves a short last segment, three calls in flight at once.
  auto codes = run_processes(2, 2, "tcp", [](world& w) {
    auto& pg = w.default_group();
    const int me = w.rank();
    const std::int64_t len = (std::int64_t{1} << 20) + 12345;  // 4 MiB float32 and more
    bool ok = true;
    auto fill = [&](dtype t) {
      auto x = tensor::empty({len}, t);
      for (std::int64_t i = 0; i < len; ++i) {
        const double v = (me + 1) * (i % 5);
        if (t == dtype::float32) x.data_as<float>()[i] = static_cast<float>(v);
        if (t == dtype::int64) x.data_as<std::int64_t>()[i] = static_cast<std::int64_t>(v);
        if (t == dtype::float64) x.data_as<double>()[i] = v;
      }
      return x;
    };
    auto value = [](const tensor& x, std::int64_t i) {
      if (x.scalar_type() == dtype::float32) return double(x.data_as<float>()[i]);
      if (x.scalar_type() == dtype::int64) return double(x.data_as<std::int64_t>()[i]);
      return x.data_as<double>()[i];
    };
    struct want {
      reduce_op op;
      dtype t;
      double factor;  // result = factor * (i % 5)
    };
    const std::vector<want> cases = {{reduce_op::SUM, dtype::float32, 3},
                                     {reduce_op::AVG, dtype::float32, 1.5},
                                     {reduce_op::premul_sum(0.5), dtype::float64, 1.5},
                                     {reduce_op::MAX, dtype::int64, 2},
                                     {reduce_op::MIN, dtype::float32, 1},
                                     {reduce_op::PRODUCT, dtype::int64, 0}};
    for (const auto& c : cases) {
      std::vector<tensor> xs;
      std::vector<work> works;
      for (int k = 0; k < 3; ++k) {
        xs.push_back(fill(c.t));
        works.push_back(pg.allreduce(tensor_list{xs.back()}, {.op = c.op}));
      }
      for (auto& wk : works) wk.wait();
      for (auto& x : xs)
        for (std::int64_t i = 0; i < len; ++i) {
          const double m = double(i % 5);
          const double expect = c.op.op() == reduce_op::PRODUCT ? 2 * m * m : c.factor * m;
          if (value(x, i) != expect) {
            std::fprintf(stderr, "rank %d: %s element %lld is %g, expected %g\n", me,
                         c.op.to_string().c_str(), static_cast<long long>(i), value(x, i), expect);
            ok = false;
            break;
          }
        }
    }
    return ok;
  });
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}

TEST_CASE("over TCP, large allreduces of different sizes fail on both ranks, naming the sizes") {
  auto codes = run_processes(2, 2, "tcp", [](world& w) {
    auto& pg = w.default_group();
    // 2 Mi against 2 Mi + 1000 elements: the same segment count, the last
    // segment larger on rank 1; found by whichever thread reduces it.
    const std::int64_t len = (std::int64_t{2} << 20) + (w.rank() == 1 ? 1000 : 0);
    auto x = tensor::zeros({len}, dtype::float32);
    const auto start = std::chrono::steady_clock::now();
    bool ok = false;
    try {
      pg.allreduce(tensor_list{x}, {.timeout = 5000ms}).wait();
      std::fprintf(stderr, "rank %d: no error\n", w.rank());
    } catch (const error& e) {
      const std::string what = e.what();
      ok = e.code() == errc::mismatch && what.find("allreduce") != npos &&
           what.find("2097152 float32 elements") != npos &&
           what.find("2098152 float32 elements") != npos &&
           std::chrono::steady_clock::now() - start < 4s;
      if (!ok) std::fprintf(stderr, "rank %d: unexpected: %s\n", w.rank(), what.c_str());
    }
    std::fflush(stderr);
    ::_exit(ok ? 0 : 1);
    return ok;
  });
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}

TEST_CASE("a rank killed with SIGKILL fails its peers' calls within 2 s, naming it") {
  // auto: the shared-memory inline engine sees the process end through a pidfd;
  // tcp: the message engine through the connection's end.
  for (const char* transport : {"auto", "tcp"}) {
    CAPTURE(std::string(transport));
    auto codes = run_processes(3, 3, transport, [](world& w) {
      auto& pg = w.default_group();
      pg.barrier().wait();
      // Rank 2 dies only once the others left the barrier: its last barrier
      // message may not have reached them when it is killed.
      auto& store = *w.get_store();
      if (w.rank() != 2) store.set("left_barrier/" + std::to_string(w.rank()), "1");
      if (w.rank() == 2) {
        store.wait({"left_barrier/0", "left_barrier/1"});
        ::kill(::getpid(), SIGKILL);
      }
      std::this_thread::sleep_for(50ms);
      const auto start = std::chrono::steady_clock::now();
      auto t = tensor::from_vector<float>({1.f});
      try {
        pg.allreduce(t).wait();
        return false;
      } catch (const error& e) {
        const std::string what = e.what();
        const bool fast = std::chrono::steady_clock::now() - start < 2s;
        const bool named = what.find("world rank 2") != std::string::npos &&
                           what.find("pid") != std::string::npos &&
                           what.find("host") != std::string::npos;
        if (!fast || !named || e.code() != errc::peer_failure)
          std::fprintf(stderr, "rank %d: unexpected failure: %s\n", w.rank(), what.c_str());
        // The barrier in run_processes fails too (rank 2 is gone): leave now.
        std::fflush(stderr);
        ::_exit(fast && named && e.code() == errc::peer_failure ? 0 : 1);
      }
    });
    CHECK(codes[0] == 0);
    CHECK(codes[1] == 0);
    CHECK(codes[2] == 128 + SIGKILL);
  }
}

namespace {

/// Waits up to 10 s for process `pid` to be in state `state`.
bool reaches(pid_t pid, char state) {
  for (int i = 0; i < 2000 && test::process_state(pid) != state; ++i)
    std::this_thread::sleep_for(5ms);
  return test::process_state(pid) == state;
}

}  // namespace

TEST_CASE("the rank that died first is named where a survivor it failed ended too") {
  // Rank 0 is stopped; rank 2 is killed; rank 1 fails because of it and
  // ends without a goodbye; then rank 0 goes on and finds both ends at once,
  // in either order. It must name rank 2 (it named rank 1 alone about half
  // the time before deaths were named after crash_grace).
  for (const char* transport : {"auto", "tcp"}) {
    CAPTURE(std::string(transport));
    bool orchestrated = false;
    auto codes = run_processes(
        3, 3, transport,
        [](world& w) {
          auto& pg = w.default_group();
          pg.barrier().wait();
          w.get_store()->set("ready/" + std::to_string(w.rank()), "1");
          if (w.rank() == 2)
            for (;;) ::pause();  // until it is killed
          auto t = tensor::from_vector<float>({1.f});
          try {
            pg.allreduce(t).wait();
          } catch (const error& e) {
            const std::string what = e.what();
            const bool named = e.code() == errc::peer_failure && what.find("world rank 2") != npos;
            if (!named)
              std::fprintf(stderr, "rank %d: unexpected failure: %s\n", w.rank(), e.what());
            std::fflush(stderr);
            ::_exit(named ? 0 : 1);  // no goodbye: as a crash
          }
          return false;
        },
        [&](const std::string& path, const std::vector<pid_t>& pids) {
          file_store s{path, 20s};
          s.wait({"ready/0", "ready/1", "ready/2"});
          std::this_thread::sleep_for(50ms);  // ranks 0 and 1 wait in their allreduce
          ::kill(pids[0], SIGSTOP);
          const bool stopped = reaches(pids[0], 'T');
          ::kill(pids[2], SIGKILL);
          const bool rank_1_ended = reaches(pids[1], 'Z');
          ::kill(pids[0], SIGCONT);
          orchestrated = stopped && rank_1_ended;
        });
    CHECK(orchestrated);
    CHECK(codes[0] == 0);
    CHECK(codes[1] == 0);
    CHECK(codes[2] == 128 + SIGKILL);
  }
}

TEST_CASE("over TCP, a large allreduce to a peer that takes nothing fails by its timeout") {
  // Rank 1 stops (SIGSTOP) without dying: its socket fills up and rank 0's
  // sends can never finish. They give up at the operation's deadline.
  auto codes = run_processes(2, 2, "tcp", [](world& w) {
    auto& pg = w.default_group();
    if (w.rank() == 1) {
      w.get_store()->set("stopped_pid", to_bytes(std::to_string(::getpid())));
      ::raise(SIGSTOP);
      ::_exit(1);  // not reached: rank 0 kills this process
    }
    const auto pid = std::stoi(troupe::to_string(w.get_store()->get("stopped_pid")));
    std::this_thread::sleep_for(100ms);
    auto t = tensor::empty({std::int64_t{16} << 20}, dtype::float32);  // 64 MiB
    const auto start = std::chrono::steady_clock::now();
    bool ok = false;
    try {
      pg.allreduce(tensor_list{t}, {.timeout = 1000ms}).wait();
    } catch (const error& e) {
      const auto took = std::chrono::steady_clock::now() - start;
      ok = (e.code() == errc::timeout || e.code() == errc::peer_failure) && took < 10s;
      if (!ok) std::fprintf(stderr, "unexpected: %s\n", e.what());
    }
    ::kill(pid, SIGKILL);
    std::fflush(stderr);
    ::_exit(ok ? 0 : 1);
    return ok;
  });
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 128 + SIGKILL);
}

TEST_CASE("over TCP, a small allreduce a peer never joins times out naming it; kinds are checked") {
  auto codes = run_processes(2, 2, "tcp", [](world& w) {
    auto& pg = w.default_group();
    auto t = tensor::from_vector<float>({1.f, 2.f});
    bool ok = true;
    // Rank 0 calls allreduce, rank 1 barrier, at the same sequence number:
    // both run on the message engine, and each names the other's call.
    try {
      if (w.rank() == 0)
        pg.allreduce(tensor_list{t}, {.timeout = 5000ms}).wait();
      else
        pg.barrier({.timeout = 5000ms}).wait();
      ok = false;
    } catch (const error& e) {
      const std::string what = e.what();
      const bool good = e.code() == errc::mismatch && what.find("collective mismatch") != npos;
      if (!good) std::fprintf(stderr, "rank %d: unexpected: %s\n", w.rank(), what.c_str());
      ok = good;
    }
    // Both ranks stepped past the refused call: the next one works.
    try {
      auto u = tensor::from_vector<float>({float(w.rank())});
      pg.allreduce(tensor_list{u}, {.timeout = 5000ms}).wait();
      ok = ok && u.to_vector<float>()[0] == 1.f;
    } catch (const error& e) {
      std::fprintf(stderr, "rank %d: after the mismatch: %s\n", w.rank(), e.what());
      ok = false;
    }
    std::fflush(stderr);
    ::_exit(ok ? 0 : 1);
    return ok;
  });
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
  auto timeouts = run_processes(2, 2, "tcp", [](world& w) {
    auto t = tensor::from_vector<float>({1.f});
    if (w.rank() == 1) {
      std::this_thread::sleep_for(1500ms);  // never joins
      ::_exit(0);
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      w.default_group().allreduce(tensor_list{t}, {.timeout = 300ms}).wait();
    } catch (const error& e) {
      const std::string what = e.what();
      const bool ok = e.code() == errc::timeout && what.find("Timed out after 300 ms") != npos &&
                      what.find("world rank 1") != npos &&
                      std::chrono::steady_clock::now() - start < 5s;
      if (!ok) std::fprintf(stderr, "unexpected: %s\n", what.c_str());
      std::fflush(stderr);
      ::_exit(ok ? 0 : 1);
    }
    ::_exit(1);
    return false;
  });
  CHECK(timeouts[0] == 0);
  CHECK(timeouts[1] == 0);
}

namespace {

/// Connects to host:port, writes `bytes`, and returns what the server answered
/// before closing ("" when it closed without a word).
std::string poke(const std::string& addr, const std::string& bytes) {
  auto sp = addr.find(' ');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(addr.substr(sp + 1))));
  ::inet_pton(AF_INET, addr.substr(0, sp).c_str(), &a.sin_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return "connect failed";
  }
  (void)!::write(fd, bytes.data(), bytes.size());
  ::shutdown(fd, SHUT_WR);
  timeval tv{8, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string answer;
  char buf[64];
  for (ssize_t r; (r = ::read(fd, buf, sizeof(buf))) > 0;)
    answer.append(buf, static_cast<std::size_t>(r));
  ::close(fd);
  return answer;
}

/// A handshake that claims `claimed_len` token bytes; with `complete`, also
/// the rank, pid, host, job and ring fields that follow the token.
std::string hello(const std::string& token, std::uint32_t claimed_len, bool complete = false) {
  std::string h = "TROUPEH1";
  h.append(reinterpret_cast<const char*>(&claimed_len), 4);
  h += token;
  if (!complete) return h;
  std::int32_t ids[2] = {0, 1};
  h.append(reinterpret_cast<const char*>(ids), sizeof(ids));
  for (std::string f : {"host", "job", ""}) {
    auto n = static_cast<std::uint16_t>(f.size());
    h.append(reinterpret_cast<const char*>(&n), 2);
    h += f;
  }
  return h;
}

}  // namespace

TEST_CASE(
    "the data plane refuses garbage, truncated handshakes and wrong tokens, and keeps working") {
  std::vector<std::string> answers;
  auto codes = run_processes(
      2, 2, "auto",
      [](world& w) {
        w.get_store()->wait({"attack_done"}, 20s);  // let the attacker try first
        return collectives(w);
      },
      [&](const std::string& path, const std::vector<pid_t>&) {
        file_store s{path, 20s};
        auto job = s.get_string("troupe/job/0");
        auto addr = s.get_string("troupe/" + job + "/addr/1");
        std::string noise(4096, '\0');
        for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<char>(i * 7919 + 13);
        answers.push_back(poke(addr, noise));                                // random bytes
        answers.push_back(poke(addr, "TROUPEH1"));                           // truncated
        answers.push_back(poke(addr, hello("0123456789abcdeX", 16, true)));  // wrong token
        answers.push_back(poke(addr, hello("0123456789abcdef", 16)));  // right token, truncated
        answers.push_back(poke(addr, hello("", 0xfffffff0u)));         // absurd length
        s.set("attack_done", "1");
      });
  for (auto c : codes) CHECK(c == 0);
  REQUIRE(answers.size() == 5);
  for (auto& a : answers) CHECK(a.empty());  // never an acknowledgement
}
