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
