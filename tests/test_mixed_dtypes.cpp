// Calls whose tensors have dtypes of their own: allgather_coalesced and
// allgather_into_tensor_coalesced with a dtype per input (as c10d's
// ProcessGroup takes them; troupe moves their bytes exactly), and complex
// tensors mixed with real ones of their element type in the reducing
// coalesced calls (reduced as the pairs of reals they are made of, as c10d
// views them) and in buckets. Ranks that disagree fail alike, named. 1-7
// ranks, 0 elements, uneven sizes, on every engine (the suite also runs
// across 2 and 4 processes over shared memory and TCP).

#include <bit>
#include <cstring>
#include <limits>

#include "check_error.hpp"
#include "collective_test.hpp"
#include "scoped_env.hpp"
#include "troupe/bucket_assignment.hpp"
#include "troupe/default_hooks.hpp"
#include "troupe/param_sync.hpp"
#include "troupe/reducer.hpp"

using namespace troupe;
using troupe::test::check_error;
using troupe::test::scoped_env;

namespace {

/// The engines a call can run on in one process: the default (shared
/// memory, straight between the ranks' buffers), messages only, and the
/// group actors. Under a launcher each process sets the same.
const char* const engines[] = {"inline", "messages", "actors"};

/// One input per dtype, with uneven sizes (one empty, one of two dimensions).
struct mixed_inputs {
  std::vector<dtype> types{dtype::float32,  dtype::int64, dtype::complex64, dtype::bool_,
                           dtype::bfloat16, dtype::uint8, dtype::float64,   dtype::int16};
  std::vector<std::int64_t> lens{3, 5, 2, 0, 4, 1, 7, 6};
  /// values[i][r]: rank r's input i.
  std::vector<std::vector<ref::values>> values;

  explicit mixed_inputs(int n) {
    for (std::size_t i = 0; i < types.size(); ++i)
      values.push_back(ct::per_rank(types[i], n, lens[i], 70 + static_cast<int>(i)));
  }
  tensor_list of_rank(int r) const {
    tensor_list ts;
    for (std::size_t i = 0; i < types.size(); ++i) {
      const auto& v = values[i][static_cast<std::size_t>(r)];
      ts.push_back(i == 1 ? ref::make(types[i], v).view({5, 1}) : ref::make(types[i], v));
    }
    return ts;
  }
  tensor_list zeros(std::int64_t times = 1) const {
    tensor_list ts;
    for (std::size_t i = 0; i < types.size(); ++i)
      ts.push_back(ref::zeros({lens[i] * times}, types[i]));
    return ts;
  }
};

/// Bits of a tensor on the host.
std::vector<std::uint8_t> bytes_of(const tensor& t) {
  auto h = ref::host(t);
  std::vector<std::uint8_t> b(h.nbytes());
  if (!b.empty()) std::memcpy(b.data(), h.data(), b.size());
  return b;
}

}  // namespace

// -- allgather_coalesced ---------------------------------------------------------------------

TEST_CASE("allgather_coalesced of inputs of several dtypes, on every engine") {
  for (const char* engine : engines) {
    scoped_env env{"TROUPE_ENGINE", engine};
    for (int n : ct::rank_counts) {
      CAPTURE(std::string(engine));
      CAPTURE(n);
      testing::run_ranks(n, [n](world& w) {
        const mixed_inputs m{n};
        auto ins = m.of_rank(w.rank());
        std::vector<tensor_list> outs;
        for (int r = 0; r < n; ++r) outs.push_back(m.zeros());
        auto work = w.default_group().allgather_coalesced(outs, ins);
        work.wait();
        CHECK(work.result().size() == m.types.size() * static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r)
          for (std::size_t i = 0; i < m.types.size(); ++i) {
            const auto& got = outs[static_cast<std::size_t>(r)][i];
            CHECK(got.scalar_type() == m.types[i]);
            ref::check_close(got, m.values[i][static_cast<std::size_t>(r)],
                             ct::name("allgather_coalesced", m.types[i], m.lens[i]) +
                                 " from rank " + std::to_string(r));
          }
        // The group goes on with calls of one dtype.
        auto x = ref::make(dtype::float32, {ref::value(1, 0)});
        w.default_group().allreduce(x).wait();
        ref::check_close(x, {ref::value(n, 0)}, "allreduce after");
      });
    }
  }
}

TEST_CASE("allgather_into_tensor_coalesced of inputs of several dtypes") {
  for (const char* engine : engines) {
    scoped_env env{"TROUPE_ENGINE", engine};
    for (int n : ct::rank_counts) {
      CAPTURE(std::string(engine));
      CAPTURE(n);
      testing::run_ranks(n, [n](world& w) {
        const mixed_inputs m{n};
        auto ins = m.of_rank(w.rank());
        auto outs = m.zeros(n);
        w.default_group().allgather_into_tensor_coalesced(outs, ins).wait();
        for (std::size_t i = 0; i < m.types.size(); ++i)
          ref::check_close(outs[i], ref::concat(m.values[i]),
                           ct::name("allgather_into_tensor_coalesced", m.types[i], m.lens[i]));
      });
    }
  }
}

TEST_CASE("inputs of several dtypes travel as their bytes: exact where a common dtype is not") {
  // Gloo casts them to one promoted dtype (int64 2^40 + 1 comes back as 2^40
  // through float32); troupe moves every input's bytes as they are.
  for (int n : {2, 3}) {
    testing::run_ranks(n, [n](world& w) {
      const std::int64_t big = (std::int64_t{1} << 53) + 1 + w.rank();
      const auto nan_bits = std::uint32_t{0x7fc00001u} + static_cast<std::uint32_t>(w.rank());
      auto i64 = tensor::from_vector<std::int64_t>({big, -big});
      auto f32 = tensor::from_vector<float>({std::bit_cast<float>(nan_bits), -0.0f});
      std::vector<tensor_list> outs;
      for (int r = 0; r < n; ++r)
        outs.push_back({tensor::zeros({2}, dtype::int64), tensor::zeros({2}, dtype::float32)});
      w.default_group().allgather_coalesced(outs, {i64, f32}).wait();
      for (int r = 0; r < n; ++r) {
        const std::int64_t want = (std::int64_t{1} << 53) + 1 + r;
        CHECK(outs[static_cast<std::size_t>(r)][0].to_vector<std::int64_t>() ==
              std::vector<std::int64_t>{want, -want});
        const auto f = outs[static_cast<std::size_t>(r)][1].to_vector<float>();
        CHECK(std::bit_cast<std::uint32_t>(f[0]) == 0x7fc00001u + static_cast<std::uint32_t>(r));
        CHECK(std::bit_cast<std::uint32_t>(f[1]) == 0x80000000u);
      }
    });
  }
}

TEST_CASE("ranks whose inputs differ in dtypes, in blocks of one size, fail alike naming them") {
  for (const char* engine : engines) {
    scoped_env env{"TROUPE_ENGINE", engine};
    for (int n : {2, 3, 4, 7}) {
      CAPTURE(std::string(engine));
      CAPTURE(n);
      testing::run_ranks(n, [n](world& w) {
        // Odd ranks swap the two dtypes: as many bytes, another layout.
        const bool odd = w.rank() % 2 == 1;
        tensor_list ins{tensor::zeros({2}, odd ? dtype::int32 : dtype::float32),
                        tensor::zeros({2}, odd ? dtype::float32 : dtype::int32)};
        std::vector<tensor_list> outs;
        for (int r = 0; r < n; ++r)
          outs.push_back(
              {tensor::zeros({2}, ins[0].scalar_type()), tensor::zeros({2}, ins[1].scalar_type())});
        std::string evens = "rank 0", odds = "rank 1";
        if (n > 2) evens = "ranks 0, 2";
        if (n > 3) odds = "ranks 1, 3";
        if (n == 7) {
          evens = "ranks 0, 2, 4, 6";
          odds = "ranks 1, 3, 5";
        }
        check_error([&] { w.default_group().allgather_coalesced(outs, ins).wait(); },
                    errc::mismatch,
                    {"collective mismatch: allgather_coalesced: " + evens +
                         " passed tensors (float32 x 2, int32 x 2); " + odds +
                         " passed tensors (int32 x 2, float32 x 2)",
                     "dtypes or element counts"});
        // No output was written, and the group goes on.
        for (auto& per_rank : outs)
          for (auto& o : per_rank)
            for (auto b : bytes_of(o)) CHECK(b == 0);
        auto x = tensor::from_vector<float>({1.0f});
        w.default_group().allreduce(x).wait();
        CHECK(x.to_vector<float>()[0] == float(n));
      });
    }
  }
}

TEST_CASE("ranks passing different numbers of tensors in blocks of one size see one text") {
  testing::run_ranks(2, [](world& w) {
    // 3 words of layout and 16 bytes of data; 4 words and 8 bytes.
    const auto ins =
        w.rank() == 0
            ? tensor_list{tensor::zeros({2}, dtype::float32), tensor::zeros({2}, dtype::int32)}
            : tensor_list{tensor::zeros({1}, dtype::float32), tensor::zeros({1}, dtype::int32),
                          tensor::zeros({0}, dtype::uint8)};
    std::vector<tensor_list> outs(2);
    for (auto& o : outs)
      for (auto& t : ins) o.push_back(tensor::zeros({t.numel()}, t.scalar_type()));
    check_error([&] { w.default_group().allgather_coalesced(outs, ins).wait(); }, errc::mismatch,
                {"collective mismatch: allgather_coalesced: rank 0 passed tensors (float32 x 2, "
                 "int32 x 2); rank 1 passed tensors (float32 x 1, int32 x 1, uint8 x 0)"});
  });
}

TEST_CASE("ranks whose blocks differ in size, or that pass one dtype, fail with the agreement") {
  testing::run_ranks(3, [](world& w) {
    auto& pg = w.default_group();
    // Rank 1's first input holds one element more.
    const std::int64_t len = w.rank() == 1 ? 3 : 2;
    tensor_list ins{tensor::zeros({len}, dtype::float32), tensor::zeros({1}, dtype::int64)};
    std::vector<tensor_list> outs(3);
    for (auto& o : outs)
      o = {tensor::zeros({len}, dtype::float32), tensor::zeros({1}, dtype::int64)};
    check_error([&] { pg.allgather_coalesced(outs, ins).wait(); }, errc::mismatch,
                {"collective mismatch", "ranks 0, 2", "rank 1", "the counts per rank"});
    // Rank 2 passes one dtype where the others mix two.
    tensor_list same{tensor::zeros({2}, dtype::float32),
                     tensor::zeros({1}, w.rank() == 2 ? dtype::float32 : dtype::int64)};
    for (auto& o : outs)
      o = {tensor::zeros({2}, dtype::float32), tensor::zeros({1}, same[1].scalar_type())};
    check_error([&] { pg.allgather_coalesced(outs, same).wait(); }, errc::mismatch,
                {"collective mismatch", "ranks 0, 1", "rank 2", "the dtype"});
    pg.barrier().wait();
  });
}

TEST_CASE("allgather_coalesced checks each output against its input, position by position") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    tensor_list ins{tensor::zeros({2}, dtype::float32), tensor::zeros({1}, dtype::int64)};
    std::vector<tensor_list> outs{
        {tensor::zeros({2}, dtype::float32), tensor::zeros({1}, dtype::int64)},
        {tensor::zeros({2}, dtype::float32), tensor::zeros({1}, dtype::float64)}};
    check_error([&] { pg.allgather_coalesced(outs, ins); }, errc::invalid_argument,
                {"allgather_coalesced: output_tensor_lists[1][1] is float64 but input_tensors[1] "
                 "is int64: each output has its input's dtype"});
    outs[1][1] = tensor::zeros({2}, dtype::int64);
    check_error([&] { pg.allgather_coalesced(outs, ins); }, errc::invalid_argument,
                {"allgather_coalesced", "has 2 elements, expected 1"});
    tensor_list flats{tensor::zeros({4}, dtype::float32), tensor::zeros({2}, dtype::int32)};
    check_error([&] { pg.allgather_into_tensor_coalesced(flats, ins); }, errc::invalid_argument,
                {"allgather_into_tensor_coalesced: outputs[1] is int32 but inputs[1] is int64"});
    CHECK(pg.sequence_number() == 0);  // nothing issued
  });
}

// -- complex with real -----------------------------------------------------------------------

TEST_CASE("allreduce_coalesced of complex tensors with real ones of their element type") {
  for (const char* engine : engines) {
    scoped_env env{"TROUPE_ENGINE", engine};
    for (int n : ct::rank_counts) {
      CAPTURE(std::string(engine));
      CAPTURE(n);
      testing::run_ranks(n, [n](world& w) {
        for (auto [c, r] : {std::pair{dtype::complex64, dtype::float32},
                            std::pair{dtype::complex128, dtype::float64}}) {
          for (auto op :
               {reduce_op(reduce_op::SUM), reduce_op(reduce_op::AVG), reduce_op::premul_sum(0.5)}) {
            CAPTURE(op.to_string());
            const std::vector<dtype> types{c, r, c, r};
            const std::vector<std::int64_t> lens{3, 4, 0, 1};
            std::vector<std::vector<ref::values>> all;
            tensor_list ts;
            for (std::size_t i = 0; i < types.size(); ++i) {
              all.push_back(ct::per_rank(types[i], n, lens[i], 90 + static_cast<int>(i)));
              ts.push_back(ref::make(types[i], all[i][static_cast<std::size_t>(w.rank())]));
            }
            const auto mine = ts;
            w.default_group().allreduce_coalesced(ts, {.op = op}).wait();
            for (std::size_t i = 0; i < types.size(); ++i) {
              CHECK(mine[i].scalar_type() == types[i]);  // written in place, as they are
              ref::check_close(mine[i], ref::reduce(all[i], op, types[i]),
                               ct::name("allreduce_coalesced", types[i], lens[i]));
            }
          }
        }
      });
    }
  }
}

TEST_CASE("complex with real: the ops c10d refuses for complex tensors, and other dtypes") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    auto c = tensor::zeros({2}, dtype::complex64);
    auto f = tensor::zeros({2}, dtype::float32);
    for (auto k : {reduce_op::MAX, reduce_op::MIN, reduce_op::PRODUCT}) {
      CAPTURE(to_string(k));
      check_error(
          [&] {
            pg.allreduce_coalesced({c, f}, {.op = k});
          },
          errc::invalid_argument,
          {"allreduce_coalesced: ReduceOp " + std::string(to_string(k)) +
           " is not supported on complex tensors mixed with real ones"});
    }
    check_error(
        [&] {
          pg.allreduce_coalesced({c, tensor::zeros({2}, dtype::float64)});
        },
        errc::invalid_argument,
        {"allreduce_coalesced: tensors with different dtypes: complex64 and float64",
         "complex64 with float32, complex128 with float64"});
    check_error(
        [&] {
          pg.allreduce_coalesced({tensor::zeros({2}, dtype::complex128), f});
        },
        errc::invalid_argument, {"complex128 and float32"});
    check_error(
        [&] {
          pg.allreduce_coalesced({f, tensor::zeros({2}, dtype::int32)});
        },
        errc::invalid_argument, {"float32 and int32"});
    CHECK(pg.sequence_number() == 0);
    // Complex tensors alone reduce as complex values: PRODUCT is theirs.
    auto z = tensor::from_vector<std::complex<float>>({{1.0f, 1.0f + w.rank()}});
    auto y = tensor::from_vector<std::complex<float>>({{0.0f, 1.0f}});
    pg.allreduce_coalesced({z, y}, {.op = reduce_op::PRODUCT}).wait();
    CHECK(z.to_vector<std::complex<float>>()[0] ==
          std::complex<float>(1, 1) * std::complex<float>(1, 2));
    CHECK(y.to_vector<std::complex<float>>()[0] == std::complex<float>(-1, 0));
  });
}

TEST_CASE("reduce_scatter_tensor_coalesced of complex tensors with real ones") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      const std::vector<dtype> types{dtype::complex64, dtype::float32};
      const std::vector<std::int64_t> lens{2, 3};  // per rank
      std::vector<std::vector<ref::values>> all;
      tensor_list ins, outs;
      for (std::size_t i = 0; i < types.size(); ++i) {
        all.push_back(ct::per_rank(types[i], n, lens[i] * n, 110 + static_cast<int>(i)));
        ins.push_back(ref::make(types[i], all[i][static_cast<std::size_t>(w.rank())]));
        outs.push_back(ref::zeros({lens[i]}, types[i]));
      }
      w.default_group().reduce_scatter_tensor_coalesced(outs, ins, {.op = reduce_op::AVG}).wait();
      for (std::size_t i = 0; i < types.size(); ++i) {
        auto sum = ref::reduce(all[i], reduce_op::AVG, types[i]);
        ref::check_close(outs[i], ref::slice(sum, lens[i] * w.rank(), lens[i]),
                         ct::name("reduce_scatter_tensor_coalesced", types[i], lens[i]));
      }
    });
  }
}

TEST_CASE("buckets of complex and real gradients: one dtype per bucket, averaged") {
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      // A real weight, a complex one, a real bias, a complex128 one.
      tensor_list grads{tensor::zeros({3}, dtype::float32), tensor::zeros({2}, dtype::complex64),
                        tensor::zeros({1}, dtype::float32), tensor::zeros({2}, dtype::complex128)};
      const auto assignment = compute_bucket_assignment_by_size(grads, {1 << 20});
      CHECK(assignment.buckets.size() == 3);  // float32, complex64, complex128 apart
      for (auto hook : {0, 1, 2}) {
        CAPTURE(hook);
        reducer red{w.default_group(), grads};
        if (hook == 1) red.register_comm_hook(fp16_compress_hook(w.default_group()));
        if (hook == 2) red.register_comm_hook(bf16_compress_hook(w.default_group()));
        CHECK(red.bucket_count() == 3);
        const float k = float(w.rank());
        for (std::size_t i = grads.size(); i-- > 0;) {
          auto& g = grads[i];
          for (std::int64_t e = 0; e < g.numel(); ++e) {
            if (g.scalar_type() == dtype::float32) g.data_as<float>()[e] = k + e;
            if (g.scalar_type() == dtype::complex64)
              g.data_as<std::complex<float>>()[e] = {k, -2 * k + e};
            if (g.scalar_type() == dtype::complex128)
              g.data_as<std::complex<double>>()[e] = {2 * k, double(e)};
          }
          red.mark_ready(i);
        }
        red.finish_step();
        const float mean = float(n - 1) / 2;
        CHECK(grads[0].to_vector<float>() == std::vector<float>{mean, mean + 1, mean + 2});
        CHECK(grads[2].to_vector<float>() == std::vector<float>{mean});
        const auto c = grads[1].to_vector<std::complex<float>>();
        CHECK(c[0] == std::complex<float>(mean, -2 * mean));
        CHECK(c[1] == std::complex<float>(mean, -2 * mean + 1));  // the imaginary parts too
        const auto z = grads[3].to_vector<std::complex<double>>();
        CHECK(z[1] == std::complex<double>(2 * mean, 1));
      }
    });
  }
}

TEST_CASE("broadcast_coalesced of complex and real tensors") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      const int src = n - 1;
      auto mine = [&](int r) {
        return tensor_list{
            tensor::from_vector<std::complex<float>>({{1.0f * r, 2.0f}, {3.0f, -1.0f * r}}),
            tensor::from_vector<float>({5.0f * r}),
            tensor::from_vector<std::complex<double>>({{0.5 * r, 0.25}}),
            tensor::from_vector<float>({1.0f, 2.0f * r})};
      };
      auto ts = mine(w.rank());
      broadcast_coalesced(w.default_group(), ts, 16, src);
      const auto want = mine(src);
      CHECK(ts[0].to_vector<std::complex<float>>() == want[0].to_vector<std::complex<float>>());
      CHECK(ts[1].to_vector<float>() == want[1].to_vector<float>());
      CHECK(ts[2].to_vector<std::complex<double>>() == want[2].to_vector<std::complex<double>>());
      CHECK(ts[3].to_vector<float>() == want[3].to_vector<float>());
    });
  }
}

TEST_CASE("allgather_coalesced of complex and real tensors") {
  testing::run_ranks(3, [](world& w) {
    auto z = tensor::from_vector<std::complex<double>>({{1.0 * w.rank(), -1.0}});
    auto f = tensor::from_vector<double>({2.0 * w.rank(), 3.0});
    std::vector<tensor_list> outs;
    for (int r = 0; r < 3; ++r)
      outs.push_back({tensor::zeros({1}, dtype::complex128), tensor::zeros({2}, dtype::float64)});
    w.default_group().allgather_coalesced(outs, {z, f}).wait();
    for (int r = 0; r < 3; ++r) {
      CHECK(outs[static_cast<std::size_t>(r)][0].to_vector<std::complex<double>>()[0] ==
            std::complex<double>(r, -1.0));
      CHECK(outs[static_cast<std::size_t>(r)][1].to_vector<double>() ==
            std::vector<double>{2.0 * r, 3.0});
    }
  });
}
