// allreduce, allreduce_coalesced and reduce against the serial reference:
// 1, 2, 3, 4 and 7 ranks, every dtype, every op the dtype supports, 0 and
// uneven element counts, every root.

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "collective_test.hpp"
#include "reference.hpp"
#include "troupe/testing.hpp"

using namespace troupe;

namespace {

const int rank_counts[] = {1, 2, 3, 4, 7};
const std::int64_t sizes[] = {0, 1, 5, 37};

std::vector<dtype> all_dtypes() {
  std::vector<dtype> r;
  for (int i = 0; i < dtype_count; ++i) r.push_back(static_cast<dtype>(i));
  return r;
}

}  // namespace

TEST_CASE("allreduce matches the serial reference for every dtype and op") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      for (auto t : all_dtypes())
        for (auto& op : ct::ops_for(t))
          for (auto size : sizes) {
            std::vector<ref::values> inputs;
            for (int r = 0; r < n; ++r)
              inputs.push_back(ref::random_values(t, size, ct::seed(r, n, size, int(t)), op.op()));
            auto x = ref::make(t, inputs[static_cast<std::size_t>(w.rank())]);
            pg.allreduce(x, op).wait();
            ref::check_close(x, ref::reduce(inputs, op, t),
                             "allreduce " + op.to_string() + " " + std::string(to_string(t)) +
                                 " n=" + std::to_string(size));
          }
    });
  }
}

TEST_CASE("allreduce of several local tensors reduces all of them and fills every one") {
  testing::run_ranks(3, [](world& w) {
    auto a = tensor::from_vector<float>({1.f * (w.rank() + 1), 2.f});
    auto b = tensor::from_vector<float>({10.f, 20.f * (w.rank() + 1)});
    w.default_group().allreduce(tensor_list{a, b}).wait();
    CHECK(a.to_vector<float>() == std::vector<float>{36.f, 126.f});
    CHECK(b.to_vector<float>() == std::vector<float>{36.f, 126.f});
    auto c = tensor::from_vector<double>({2.0});
    auto d = tensor::from_vector<double>({4.0});
    w.default_group().allreduce(tensor_list{c, d}, {.op = reduce_op::AVG}).wait();
    CHECK(c.to_vector<double>()[0] == doctest::Approx(3.0));
  });
}

TEST_CASE("allreduce with a tensor scale for PREMUL_SUM") {
  testing::run_ranks(4, [](world& w) {
    auto scale = tensor::from_vector<double>({0.25});
    auto x = tensor::from_vector<float>({4.f * (w.rank() + 1)});
    w.default_group().allreduce(x, reduce_op::premul_sum(scale)).wait();
    CHECK(x.to_vector<float>()[0] == doctest::Approx(10.f));
  });
}

TEST_CASE("allreduce_coalesced reduces tensors of different sizes in one call") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      std::vector<std::int64_t> lens{3, 0, 9, 1};
      std::vector<std::vector<ref::values>> inputs(lens.size());
      tensor_list mine;
      for (std::size_t i = 0; i < lens.size(); ++i) {
        for (int r = 0; r < n; ++r)
          inputs[i].push_back(
              ref::random_values(dtype::int64, lens[i], ct::seed(r, n, lens[i], 7)));
        mine.push_back(ref::make(dtype::int64, inputs[i][static_cast<std::size_t>(w.rank())]));
      }
      w.default_group().allreduce_coalesced(mine, {.op = reduce_op::MAX}).wait();
      for (std::size_t i = 0; i < lens.size(); ++i)
        ref::check_close(mine[i], ref::reduce(inputs[i], reduce_op::MAX, dtype::int64),
                         "allreduce_coalesced tensor " + std::to_string(i));
    });
  }
}

TEST_CASE("reduce delivers the reduction to every root and leaves the others' inputs alone") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      for (int root = 0; root < n; ++root)
        for (auto t : {dtype::float32, dtype::int32, dtype::bfloat16, dtype::complex128})
          for (auto& op : ct::ops_for(t))
            for (auto size : {std::int64_t{0}, std::int64_t{6}}) {
              std::vector<ref::values> inputs;
              for (int r = 0; r < n; ++r)
                inputs.push_back(
                    ref::random_values(t, size, ct::seed(r, n, size, root + 3), op.op()));
              auto& mine = inputs[static_cast<std::size_t>(w.rank())];
              auto x = ref::make(t, mine);
              pg.reduce(x, root, op).wait();
              if (w.rank() == root)
                ref::check_close(x, ref::reduce(inputs, op, t), "reduce root " + op.to_string());
              else
                ref::check_close(x, ref::read(ref::make(t, mine)), "reduce non-root untouched");
            }
    });
  }
}

// Large buffers take the other paths of the shared-memory reduce: straight
// between buffers (one process, or shared buffers), staged in chunks (2
// ranks, and 3 or more) between processes.
TEST_CASE("reduce of large buffers, private and shared, writes the root's buffer alone") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      for (bool shared : {false, true})
        for (std::int64_t size : {std::int64_t{20000}, std::int64_t{700001}})
          for (auto op : {reduce_op{reduce_op::SUM}, reduce_op{reduce_op::AVG}}) {
            CAPTURE(shared);
            CAPTURE(size);
            const int root = static_cast<int>(size % n);
            const auto e = ct::expected_for(dtype::float32, op, n, size, 11);
            const auto& mine = e->input(w.rank());
            auto x = ref::make(dtype::float32, mine);
            if (shared && x.is_cpu()) {
              auto s = tensor::empty_shared({size}, dtype::float32);
              s.copy_from(x);
              x = s;
            }
            pg.reduce(x, root, op).wait();
            if (w.rank() == root)
              ref::check_close(x, e->result, "reduce root");
            else
              ref::check_close(x, mine, "reduce non-root untouched");
          }
    });
  }
}

TEST_CASE("allreduce of buffers above the direct-algorithm threshold runs the ring") {
  // 70001 elements exceed 64 KiB for every dtype, so without the shared-memory
  // engine (TROUPE_ENGINE=actors; across hosts) the ring runs (small buffers take
  // the one-step direct algorithm); 2500001 elements make chunks of several
  // 1 MiB segments for float32 on up to 7 ranks (the pipelined ring).
  ::setenv("TROUPE_ENGINE", "actors", 1);
  struct restore {
    ~restore() { ::unsetenv("TROUPE_ENGINE"); }
  } restore_engine;
  for (std::int64_t len : {std::int64_t{70001}, std::int64_t{2500001}})
    for (int n : {2, 3, 4, 7}) {
      if (len > 70001 && n == 4) continue;
      CAPTURE(n);
      CAPTURE(len);
      testing::run_ranks(n, [n, len](world& w) {
        for (auto t : {dtype::float32, dtype::int64, dtype::uint8, dtype::bfloat16})
          for (auto& op : ct::ops_for(t)) {
            if (op.op() != reduce_op::SUM && op.op() != reduce_op::MAX &&
                op.op() != reduce_op::AVG && op.op() != reduce_op::PREMUL_SUM)
              continue;
            // One dtype and two ops suffice for segments.
            if (len > 70001 && (t != dtype::float32 ||
                                (op.op() != reduce_op::SUM && op.op() != reduce_op::PREMUL_SUM)))
              continue;
            const auto e = ct::expected_for(t, op, n, len, int(t));
            auto x = ref::make(t, e->input(w.rank()));
            w.default_group().allreduce(x, op).wait();
            ref::check_close(x, e->result,
                             "ring allreduce " + op.to_string() + " " + std::string(to_string(t)));
          }
      });
    }
}
