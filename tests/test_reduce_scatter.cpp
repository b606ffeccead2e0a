// reduce_scatter (list), reduce_scatter_tensor, reduce_scatter_tensor_coalesced
// and reduce_scatterv against the serial reference: 1-7 ranks, every op of
// representative dtypes, 0 and uneven element counts.

#include "collective_test.hpp"

using namespace troupe;

namespace {

std::vector<reduce_op> ops_for(dtype t) {
  std::vector<reduce_op> ok;
  for (auto op :
       {reduce_op(reduce_op::SUM), reduce_op(reduce_op::AVG), reduce_op(reduce_op::PRODUCT),
        reduce_op(reduce_op::MIN), reduce_op(reduce_op::MAX), reduce_op(reduce_op::BXOR),
        reduce_op::premul_sum(2.0)})
    try {
      check_reduce_supported("test", op, t);
      ok.push_back(op);
    } catch (const error&) {
    }
  return ok;
}

/// Each rank's full input (n blocks of `len`), as values.
std::vector<ref::values> inputs(dtype t, int n, std::int64_t total, const reduce_op& op, int salt) {
  std::vector<ref::values> r;
  for (int i = 0; i < n; ++i)
    r.push_back(ref::random_values(t, total, ct::seed(i, n, total, salt), op.op()));
  return r;
}

}  // namespace

TEST_CASE("reduce_scatter_tensor and reduce_scatter (list) match the reference") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      const auto me = static_cast<std::size_t>(w.rank());
      for (auto t : {dtype::float32, dtype::int32, dtype::float16, dtype::complex64})
        for (auto& op : ops_for(t))
          for (std::int64_t len : {0, 3}) {
            auto in = inputs(t, n, len * n, op, 11);
            auto expected = ref::slice(ref::reduce(in, op, t), len * w.rank(), len);
            auto out = ref::zeros({len}, t);
            w.default_group().reduce_scatter_tensor(out, ref::make(t, in[me]), {.op = op}).wait();
            ref::check_close(out, expected, "reduce_scatter_tensor " + op.to_string());
            tensor_list blocks;
            for (int r = 0; r < n; ++r)
              blocks.push_back(ref::make(t, ref::slice(in[me], len * r, len)));
            auto out2 = ref::zeros({len}, t);
            w.default_group().reduce_scatter(out2, blocks, {.op = op}).wait();
            ref::check_close(out2, expected, "reduce_scatter " + op.to_string());
          }
    });
  }
}

TEST_CASE("reduce_scatter_tensor_coalesced reduces several tensors in one call") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      const auto me = static_cast<std::size_t>(w.rank());
      std::vector<std::int64_t> lens{1, 0, 4};
      tensor_list ins, outs;
      std::vector<ref::values> expected;
      for (std::size_t i = 0; i < lens.size(); ++i) {
        auto in = inputs(dtype::float64, n, lens[i] * n, reduce_op::SUM, int(i) + 20);
        expected.push_back(ref::slice(ref::reduce(in, reduce_op::SUM, dtype::float64),
                                      lens[i] * w.rank(), lens[i]));
        ins.push_back(ref::make(dtype::float64, in[me]));
        outs.push_back(ref::zeros({lens[i]}, dtype::float64));
      }
      w.default_group().reduce_scatter_tensor_coalesced(outs, ins).wait();
      for (std::size_t i = 0; i < lens.size(); ++i)
        ref::check_close(outs[i], expected[i], "reduce_scatter_tensor_coalesced");
    });
  }
}

TEST_CASE("reduce_scatterv reduces uneven blocks, zeros included") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto counts = ct::uneven_counts(n);
      std::int64_t total = 0, offset = 0;
      for (int r = 0; r < n; ++r) {
        if (r < w.rank()) offset += counts[static_cast<std::size_t>(r)];
        total += counts[static_cast<std::size_t>(r)];
      }
      for (auto& op : {reduce_op(reduce_op::SUM), reduce_op(reduce_op::MAX)}) {
        auto in = inputs(dtype::int64, n, total, op, 30);
        auto out = ref::zeros({counts[static_cast<std::size_t>(w.rank())]}, dtype::int64);
        w.default_group()
            .reduce_scatterv(out, ref::make(dtype::int64, in[static_cast<std::size_t>(w.rank())]),
                             counts, {.op = op})
            .wait();
        ref::check_close(out,
                         ref::slice(ref::reduce(in, op, dtype::int64), offset,
                                    counts[static_cast<std::size_t>(w.rank())]),
                         "reduce_scatterv " + op.to_string());
      }
    });
  }
}

TEST_CASE("reduce_scatter_tensor in place: the output is the rank's block of the input") {
  // Large enough for several staging chunks between processes.
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      const std::int64_t len = 100003;
      auto in = tensor::empty({len * n}, dtype::float32);
      for (std::int64_t i = 0; i < len * n; ++i)
        in.data_as<float>()[i] = float(w.rank() + 1) * float(i % 5);
      auto out = in.flat_slice(len * w.rank(), len);
      w.default_group().reduce_scatter_tensor(out, in).wait();
      const float ranks_sum = float(n * (n + 1) / 2);
      bool good = true;
      for (std::int64_t i = 0; i < len; ++i)
        good &= out.data_as<float>()[i] == ranks_sum * float((len * w.rank() + i) % 5);
      CHECK(good);
    });
  }
}

// Inputs of 4-64 KiB travel through the segment's small slots, or (in one
// process from 32 KiB, between processes when shared) are read where they
// are while their rank waits: every element, every size, buffers reused.
TEST_CASE("reduce_scatter of inputs around the small slots' size, every element") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      const int me = w.rank();
      for (std::int64_t block : {512, 2048, 4096, 5000, 8192}) {
        CAPTURE(block);
        auto in = tensor::empty({n * block}, dtype::float32);
        auto out = tensor::empty({block}, dtype::float32);
        for (int round = 0; round < 3; ++round) {
          for (std::int64_t i = 0; i < n * block; ++i)
            in.data_as<float>()[i] = float((me + 1) * (round + 1) + i % 101);
          w.default_group().reduce_scatter_tensor(out, in).wait();
          std::int64_t wrong = 0;
          const float ranks_sum = float(n * (n + 1) / 2 * (round + 1));
          for (std::int64_t i = 0; i < block; ++i)
            wrong += out.data_as<float>()[i] != ranks_sum + float(n * ((me * block + i) % 101));
          CHECK(wrong == 0);
        }
      }
    });
  }
}
