// alltoall (lists) and alltoall_single with equal and uneven split sizes.

#include "collective_test.hpp"

using namespace troupe;

namespace {

/// The values rank `from` sends to rank `to`: `len` elements, distinct per pair.
ref::values block(int from, int to, std::int64_t len) {
  ref::values v;
  for (std::int64_t i = 0; i < len; ++i) v.emplace_back(100 * from + 10 * to + i, 0);
  return v;
}

/// Rows rank `from` sends to rank `to` in the uneven test (zeros included).
std::int64_t rows(int from, int to) {
  return (from + 2 * to) % 3;
}

}  // namespace

TEST_CASE("alltoall exchanges one tensor per pair of ranks") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      tensor_list ins, outs;
      for (int p = 0; p < n; ++p) {
        ins.push_back(ref::make(dtype::int32, block(w.rank(), p, 1 + p % 2)));
        outs.push_back(ref::zeros({1 + w.rank() % 2}, dtype::int32));
      }
      w.default_group().alltoall(outs, ins).wait();
      for (int p = 0; p < n; ++p)
        ref::check_close(outs[static_cast<std::size_t>(p)], block(p, w.rank(), 1 + w.rank() % 2),
                         "alltoall from rank " + std::to_string(p));
    });
  }
}

TEST_CASE("alltoall_single with equal splits and with uneven split sizes") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      const int me = w.rank();
      // Equal splits: 2 rows of 3 columns per peer.
      {
        ref::values in, expected;
        for (int p = 0; p < n; ++p) {
          auto b = block(me, p, 6);
          in.insert(in.end(), b.begin(), b.end());
          auto e = block(p, me, 6);
          expected.insert(expected.end(), e.begin(), e.end());
        }
        auto out = ref::zeros({2 * n, 3}, dtype::float32);
        w.default_group().alltoall_single(out, ref::make(dtype::float32, in, {2 * n, 3})).wait();
        ref::check_close(out, expected, "alltoall_single equal");
      }
      // Uneven splits (rows of 2 columns), zeros included.
      {
        std::vector<std::int64_t> in_splits, out_splits;
        ref::values in, expected;
        for (int p = 0; p < n; ++p) {
          in_splits.push_back(rows(me, p));
          out_splits.push_back(rows(p, me));
          auto b = block(me, p, 2 * rows(me, p));
          in.insert(in.end(), b.begin(), b.end());
          auto e = block(p, me, 2 * rows(p, me));
          expected.insert(expected.end(), e.begin(), e.end());
        }
        std::int64_t in_rows = 0, out_rows = 0;
        for (auto r : in_splits) in_rows += r;
        for (auto r : out_splits) out_rows += r;
        auto out = ref::zeros({out_rows, 2}, dtype::int64);
        w.default_group()
            .alltoall_single(out, ref::make(dtype::int64, in, {in_rows, 2}), out_splits, in_splits)
            .wait();
        ref::check_close(out, expected, "alltoall_single uneven");
      }
    });
  }
}

TEST_CASE("alltoall_single in place: the output is the input tensor") {
  // Every rank reads the others' inputs while it writes its output: in place
  // the blocks must not be overwritten before everyone has them. Large
  // enough for several staging chunks between processes.
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      const std::int64_t len = 100003;  // per pair
      ref::values mine;
      for (int p = 0; p < n; ++p) {
        auto b = block(w.rank(), p, len);
        mine.insert(mine.end(), b.begin(), b.end());
      }
      auto t = ref::make(dtype::float32, mine);
      w.default_group().alltoall_single(t, t).wait();
      ref::values expect;
      for (int p = 0; p < n; ++p) {
        auto b = block(p, w.rank(), len);
        expect.insert(expect.end(), b.begin(), b.end());
      }
      ref::check_close(t, expect, "alltoall_single in place");
    });
  }
}

// Each rank chooses the segment's tiny lane from its own sizes (an input and
// output of at most 1 KiB with the splits): with uneven splits one rank may
// choose it while another cannot. Rank 0 keeps 300 floats and sends 1, the
// others exchange a few: rank 0 posts in the slots, the others on their tiny
// lanes, which they leave for the slots. Many times, then equal small splits
// again (the tiny lane for every rank), then uneven splits that disagree.
TEST_CASE("alltoall whose ranks' sizes fall on both sides of the tiny lane's limit") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int me = w.rank();
      auto len = [](int from, int to) -> std::int64_t {
        return from == 0 && to == 0 ? 300 : 1 + (from + to) % 2;
      };
      std::vector<std::int64_t> in_splits, out_splits;
      ref::values in, expected;
      for (int p = 0; p < n; ++p) {
        in_splits.push_back(len(me, p));
        out_splits.push_back(len(p, me));
        auto b = block(me, p, len(me, p));
        in.insert(in.end(), b.begin(), b.end());
        auto e = block(p, me, len(p, me));
        expected.insert(expected.end(), e.begin(), e.end());
      }
      std::int64_t out_len = 0;
      for (auto r : out_splits) out_len += r;
      auto input = ref::make(dtype::float32, in);
      for (int round = 0; round < 20; ++round) {
        CAPTURE(round);
        auto out = ref::zeros({out_len}, dtype::float32);
        pg.alltoall_single(out, input, out_splits, in_splits).wait();
        ref::check_close(out, expected, "alltoall_single across the tiny lane's limit");
        // Equal small splits: every rank on its tiny lane.
        auto small_in = ref::make(dtype::float32, block(me, me, n));
        auto small_out = ref::zeros({n}, dtype::float32);
        pg.alltoall_single(small_out, small_in).wait();
      }
      // Splits that disagree (rank 1 expects one element more from rank 0
      // than rank 0 sends): every rank reports the mismatch.
      if (n < 2) return;
      auto bad_out = out_splits;
      if (me == 1) bad_out[0] += 1;
      std::int64_t bad_len = 0;
      for (auto r : bad_out) bad_len += r;
      auto out = ref::zeros({bad_len}, dtype::float32);
      try {
        pg.alltoall_single(out, input, bad_out, in_splits).wait();
        CHECK_MESSAGE(false, "the alltoall with disagreeing splits succeeded");
      } catch (const error& e) {
        CHECK(e.code() == errc::mismatch);
      }
      pg.barrier().wait();
      // All on the tiny lane, splits that disagree: rank 1 expects 2
      // elements from rank 0, which sends it 1.
      std::vector<std::int64_t> ones(static_cast<std::size_t>(n), 1), recv = ones;
      if (me == 1) recv[0] = 2;
      auto small_out = ref::zeros({me == 1 ? n + 1 : n}, dtype::float32);
      try {
        pg.alltoall_single(small_out, ref::make(dtype::float32, block(me, me, n)), recv, ones)
            .wait();
        CHECK_MESSAGE(false, "the small alltoall with disagreeing splits succeeded");
      } catch (const error& e) {
        CHECK(e.code() == errc::mismatch);
        CHECK(std::string(e.what()).find("rank 1") != std::string::npos);
      }
      pg.barrier().wait();
    });
  }
}

// alltoall_single without split sizes posts on the tiny lane without a
// planned call (inline/shm/tiny_direct.cpp); a rank that passes split sizes
// for the same call may go to the slots (rank 0 keeps 300 floats for
// itself and sends 1 to each other rank, which sends 1 to each): the ranks
// without split sizes find it there and follow it. Rounds of that, and of
// every rank without split sizes (all on the tiny lane), and the other way
// round (rank 0 the only one without), each checked.
TEST_CASE(
    "alltoall_single without split sizes beside a rank whose split sizes take it past the "
    "tiny lane") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int me = w.rank();
      auto len = [](int from, int to) -> std::int64_t { return from == 0 && to == 0 ? 300 : 1; };
      ref::values in, expected;
      std::vector<std::int64_t> splits;
      for (int p = 0; p < n; ++p) {
        auto b = block(me, p, len(me, p));
        in.insert(in.end(), b.begin(), b.end());
        auto e = block(p, me, len(p, me));
        expected.insert(expected.end(), e.begin(), e.end());
        splits.push_back(len(me, p));
      }
      const auto total = static_cast<std::int64_t>(expected.size());
      auto input = ref::make(dtype::float32, in);
      ref::values even_in, even_expected;
      for (int p = 0; p < n; ++p) {
        auto b = block(me, p, 2);
        even_in.insert(even_in.end(), b.begin(), b.end());
        auto e = block(p, me, 2);
        even_expected.insert(even_expected.end(), e.begin(), e.end());
      }
      auto even_input = ref::make(dtype::float32, even_in);
      for (int round = 0; round < 20; ++round) {
        CAPTURE(round);
        auto out = ref::zeros({total}, dtype::float32);
        if (me == 0)
          pg.alltoall_single(out, input, splits, splits).wait();
        else
          pg.alltoall_single(out, input).wait();
        ref::check_close(out, expected, "alltoall_single beside the slots");
        auto even_out = ref::zeros({2 * n}, dtype::float32);
        pg.alltoall_single(even_out, even_input).wait();
        ref::check_close(even_out, even_expected, "alltoall_single on the tiny lane");
        // Split sizes everywhere but rank 0, which passes none (even).
        std::vector<std::int64_t> twos(static_cast<std::size_t>(n), 2);
        auto mixed_out = ref::zeros({2 * n}, dtype::float32);
        if (me == 0)
          pg.alltoall_single(mixed_out, even_input).wait();
        else
          pg.alltoall_single(mixed_out, even_input, twos, twos).wait();
        ref::check_close(mixed_out, even_expected, "alltoall_single, split sizes but on rank 0");
        // Rank 0 keeps 3 for itself and sends 2 to each other rank: split
        // sizes that agree with the others' even ones (none passed), on the
        // tiny lane too, where its header says uneven and theirs even.
        std::vector<std::int64_t> own3 = twos;
        own3[0] = 3;
        ref::values own3_in, own3_expected;
        for (int p = 0; p < n; ++p) {
          const auto k = me == 0 && p == 0 ? 3 : 2;
          auto b = block(me, p, k);
          own3_in.insert(own3_in.end(), b.begin(), b.end());
          auto e = block(p, me, k);
          own3_expected.insert(own3_expected.end(), e.begin(), e.end());
        }
        auto own3_out = ref::zeros({me == 0 ? 2 * n + 1 : 2 * n}, dtype::float32);
        if (me == 0)
          pg.alltoall_single(own3_out, ref::make(dtype::float32, own3_in), own3, own3).wait();
        else
          pg.alltoall_single(own3_out, ref::make(dtype::float32, own3_in)).wait();
        ref::check_close(own3_out, own3_expected, "alltoall_single, rank 0 keeps more");
      }
    });
  }
}
