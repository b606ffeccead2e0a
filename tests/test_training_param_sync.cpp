// Parameter sync: broadcast_coalesced through flat buckets (1 byte, exactly
// one tensor, 1 MiB) counted by the group's sequence numbers,
// sync_module_states with its ignore set and broadcast_buffers,
// verify_param_shapes_across_processes failing every rank, and the helpers of
// torch.distributed.utils: state_dict and replace_by_prefix, apply_to_tensors,
// cast_floating_tensors, move_to_device.

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "check_error.hpp"
#include "troupe/apply_to_tensors.hpp"
#include "troupe/param_sync.hpp"
#include "troupe/state_dict.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using troupe::test::check_error;
using troupe::test::check_exact_error;

namespace {

const int rank_counts[] = {1, 2, 3, 4, 7};

/// Five float32 tensors of 16 elements and two float64 tensors of 8 (64 bytes
/// each), interleaved, with values that depend on the rank.
tensor_list model_states(int rank) {
  tensor_list ts;
  for (int i = 0; i < 7; ++i) {
    if (i == 2 || i == 5) {
      std::vector<double> v(8);
      for (int k = 0; k < 8; ++k) v[static_cast<std::size_t>(k)] = rank * 100.0 + i * 10 + k;
      ts.push_back(tensor::from_vector(v));
    } else {
      std::vector<float> v(16);
      for (int k = 0; k < 16; ++k) v[static_cast<std::size_t>(k)] = rank * 100.0f + i * 10 + k;
      ts.push_back(tensor::from_vector(v).view({4, 4}));
    }
  }
  return ts;
}

void check_states(const tensor_list& got, int want_rank) {
  auto want = model_states(want_rank);
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    if (got[i].scalar_type() == dtype::float64)
      CHECK(got[i].to_vector<double>() == want[i].to_vector<double>());
    else
      CHECK(got[i].to_vector<float>() == want[i].to_vector<float>());
  }
}

struct layer {
  std::string name;
  tensor weight;
  std::optional<tensor> bias;
  int units = 0;
};

template <class Inspector>
auto inspect(Inspector& f, layer& l) {
  return f(l.name, l.weight, l.bias, l.units);
}

}  // namespace

TEST_CASE("broadcast_coalesced: one broadcast per bucket, at 1 byte, one tensor and 1 MiB") {
  struct sizing {
    std::size_t bytes;
    std::uint64_t broadcasts;
  };
  // 1 byte and 64 bytes (exactly one tensor) close a bucket at every tensor;
  // 1 MiB puts each dtype in one bucket.
  const sizing cases[] = {{1, 7}, {64, 7}, {1024 * 1024, 2}};
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n, &cases](world& w) {
      auto& pg = w.default_group();
      for (auto c : cases) {
        CAPTURE(c.bytes);
        auto states = model_states(w.rank());
        const auto before = pg.sequence_number();
        broadcast_coalesced(pg, states, c.bytes, n - 1);
        CHECK(pg.sequence_number() - before == c.broadcasts);
        check_states(states, n - 1);
      }
      // sync_params_and_buffers: the same from rank 0; nothing to send is no call.
      auto states = model_states(w.rank());
      sync_params_and_buffers(pg, states, 1024 * 1024);
      check_states(states, 0);
      const auto before = pg.sequence_number();
      sync_params_and_buffers(pg, {}, 1024);
      CHECK(pg.sequence_number() == before);
    });
  }
}

TEST_CASE("sync_module_states skips ignored names and, when asked, buffers") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [](world& w) {
      auto& pg = w.default_group();
      const float r = static_cast<float>(w.rank());
      auto make = [&] {
        state_dict params{{"fc1.weight", tensor::from_vector<float>({r, r})},
                          {"fc1.bias", tensor::from_vector<float>({r})},
                          {"fc2.weight", tensor::from_vector<float>({r, r, r})}};
        state_dict buffers{{"bn.running_mean", tensor::from_vector<float>({r})},
                           {"bn.num_batches", tensor::from_vector<std::int64_t>({w.rank()})}};
        return std::pair{params, buffers};
      };
      auto [params, buffers] = make();
      sync_module_states(
          pg, params, buffers,
          {.broadcast_bucket_bytes = 8, .params_and_buffers_to_ignore = {"fc1.bias"}});
      CHECK(params.at("fc1.weight").to_vector<float>() == std::vector<float>{0, 0});
      CHECK(params.at("fc1.bias").to_vector<float>() == std::vector<float>{r});  // ignored
      CHECK(params.at("fc2.weight").to_vector<float>() == std::vector<float>{0, 0, 0});
      CHECK(buffers.at("bn.running_mean").to_vector<float>() == std::vector<float>{0});
      CHECK(buffers.at("bn.num_batches").to_vector<std::int64_t>() == std::vector<std::int64_t>{0});

      auto [p2, b2] = make();
      sync_module_states(pg, p2, b2, {.src = w.size() - 1, .broadcast_buffers = false});
      const float last = static_cast<float>(w.size() - 1);
      CHECK(p2.at("fc1.bias").to_vector<float>() == std::vector<float>{last});
      CHECK(b2.at("bn.running_mean").to_vector<float>() == std::vector<float>{r});  // not sent
    });
  }
}

TEST_CASE("verify_param_shapes_across_processes fails every rank naming the rank and the param") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      state_dict same{{"fc.weight", tensor::empty({4, 3}, dtype::float32)},
                      {"fc.bias", tensor::empty({4}, dtype::float32)}};
      verify_param_shapes_across_processes(pg, same);  // passes
      if (n < 2) return;
      // The last rank's weight is transposed.
      const bool odd = w.rank() == n - 1;
      state_dict p{
          {"fc.weight", tensor::empty(odd ? shape_t{3, 4} : shape_t{4, 3}, dtype::float32)},
          {"fc.bias", tensor::empty({4}, dtype::float32)}};
      check_exact_error([&] { verify_param_shapes_across_processes(pg, p); }, errc::mismatch,
                        "verify_param_shapes_across_processes: rank " + std::to_string(n - 1) +
                            "'s params[0] (fc.weight) has sizes [3, 4], dtype float32 on cpu, "
                            "which does not match sizes [4, 3], dtype float32 on cpu of the same "
                            "param on rank 0.");
      // A dtype differs.
      tensor_list q{tensor::empty({2}, w.rank() == 1 ? dtype::float64 : dtype::float32)};
      check_error([&] { verify_param_shapes_across_processes(pg, q); }, errc::mismatch,
                  {"rank 1's params[0]", "dtype float64", "dtype float32"});
      // A rank with one parameter fewer.
      tensor_list c(w.rank() == 1 ? 1u : 2u, tensor::empty({2}, dtype::float32));
      check_exact_error([&] { verify_param_shapes_across_processes(pg, c); }, errc::mismatch,
                        "verify_param_shapes_across_processes: DDP expects same model across all "
                        "ranks, but rank 0 has 2 params, while rank 1 has inconsistent 1 params.");
    });
  }
}

TEST_CASE("state_dict keeps definition order; replace_by_prefix as c10d's _replace_by_prefix") {
  auto t = [](float v) { return tensor::from_vector<float>({v}); };
  state_dict sd{{"module.fc1.weight", t(1)}, {"other", t(2)}, {"module.fc2.weight", t(3)}};
  CHECK(sd.names() == std::vector<std::string>{"module.fc1.weight", "other", "module.fc2.weight"});
  replace_by_prefix(sd, "module.", "");
  // Renamed keys move to the end, in the order they were visited.
  CHECK(sd.names() == std::vector<std::string>{"other", "fc1.weight", "fc2.weight"});
  CHECK(sd.at("fc2.weight").to_vector<float>()[0] == 3);
  // A renamed key that already exists replaces that entry's tensor where it stands.
  state_dict c{{"a.x", t(1)}, {"b.x", t(2)}, {"c", t(3)}};
  replace_by_prefix(c, "a.", "b.");
  CHECK(c.names() == std::vector<std::string>{"b.x", "c"});
  CHECK(c.at("b.x").to_vector<float>()[0] == 1);
  check_exact_error([&] { replace_by_prefix(sd, "x", "x"); }, errc::invalid_argument,
                    "replace_by_prefix: old_prefix and new_prefix must be distinct");
  check_error([&] { (void)sd.at("nope"); }, errc::invalid_argument, {"state_dict.at", "nope"});
  check_error(
      [&] {
        state_dict d{{"a", t(1)}, {"a", t(2)}};
      },
      errc::invalid_argument, {"'a' given twice"});
  state_dict copy = sd;
  copy.set("other", t(9));
  CHECK(sd.at("other").to_vector<float>()[0] == 2);
  CHECK(copy.names() == sd.names());
  CHECK(copy.erase("other"));
  CHECK_FALSE(copy.erase("other"));
  CHECK(copy.size() == 2);
}

TEST_CASE("apply_to_tensors walks nested containers and inspect structs") {
  std::vector<layer> net{
      {"fc1", tensor::from_vector<float>({1, 2}), tensor::from_vector<float>({3}), 2},
      {"fc2", tensor::from_vector<float>({4}), std::nullopt, 1}};
  std::map<std::string, std::pair<tensor, std::vector<tensor>>> extra{
      {"k", {tensor::from_vector<float>({5}), {tensor::from_vector<float>({6}), tensor{}}}}};
  int visits = 0;
  auto doubled = [&](const tensor& x) {
    ++visits;
    auto r = x.clone();
    for (std::int64_t i = 0; i < r.numel(); ++i) r.data_as<float>()[i] *= 2;
    return r;
  };
  auto net2 = apply_to_tensors(doubled, net);
  CHECK(visits == 3);
  CHECK(net2[0].weight.to_vector<float>() == std::vector<float>{2, 4});
  CHECK(net2[0].bias->to_vector<float>() == std::vector<float>{6});
  CHECK_FALSE(net2[1].bias.has_value());
  CHECK(net2[0].name == "fc1");
  CHECK(net[0].weight.to_vector<float>() == std::vector<float>{1, 2});  // the input is a copy
  auto extra2 = apply_to_tensors(doubled, extra);
  CHECK(visits == 5);  // undefined tensors are skipped
  CHECK(extra2["k"].second[0].to_vector<float>() == std::vector<float>{12});
  state_dict sd{{"w", tensor::from_vector<float>({1})}};
  CHECK(apply_to_tensors(doubled, sd).at("w").to_vector<float>() == std::vector<float>{2});
}

TEST_CASE("cast_floating_tensors casts floating tensors only; move_to_device keeps cpu tensors") {
  std::pair<tensor, std::vector<tensor>> inputs{
      tensor::from_vector<float>({1.5f, -2.25f}),
      {tensor::from_vector<std::int64_t>({7}), tensor::from_vector<double>({0.1})}};
  auto half = cast_floating_tensors(dtype::float16, inputs);
  CHECK(half.first.scalar_type() == dtype::float16);
  CHECK(static_cast<float>(half.first.to_vector<float16_t>()[1]) == -2.25f);
  CHECK(half.second[0].scalar_type() == dtype::int64);
  CHECK(half.second[0].is_same(inputs.second[0]));
  CHECK(half.second[1].scalar_type() == dtype::float16);
  auto same = cast_floating_tensors(dtype::float32, inputs);
  CHECK(same.first.is_same(inputs.first));  // already float32: not copied
  auto bf = to_dtype(tensor::from_vector<float>({3.0f}), dtype::bfloat16);
  CHECK(static_cast<float>(bf.to_vector<bfloat16_t>()[0]) == 3.0f);
  check_error([&] { (void)to_dtype(inputs.second[0], dtype::float32); }, errc::invalid_argument,
              {"to_dtype", "int64"});
  auto moved = move_to_device(device::cpu(), inputs);
  CHECK(moved.first.is_same(inputs.first));
}

TEST_CASE("float32 <-> float16 / bfloat16 casts of whole buffers match the scalar conversions") {
  // More than a vector's worth, with the awkward values: halfway cases,
  // subnormals, overflow, infinities, NaN, signed zero.
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -2.5f,
                          65504.0f,
                          65520.0f,
                          1e9f,
                          -1e9f,
                          std::ldexp(1.0f, -24),
                          std::ldexp(1.0f, -25),
                          std::ldexp(3.0f, -26),
                          1.0f + std::ldexp(1.0f, -11),
                          1.0f + std::ldexp(3.0f, -11),
                          1.0f + std::ldexp(1.0f, -8),
                          1.0f + std::ldexp(3.0f, -8),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          3.0e38f};
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-100.0f, 100.0f);
  for (int i = 0; i < 1000; ++i) v.push_back(u(gen) * std::ldexp(1.0f, i % 40 - 20));
  auto src = tensor::from_vector(v);
  auto h = to_dtype(src, dtype::float16).to_vector<float16_t>();
  auto b = to_dtype(src, dtype::bfloat16).to_vector<bfloat16_t>();
  for (std::size_t i = 0; i < v.size(); ++i) {
    CAPTURE(i);
    CAPTURE(v[i]);
    CHECK(h[i].bits == float16_t(v[i]).bits);
    CHECK(b[i].bits == bfloat16_t(v[i]).bits);
  }
  auto hf = to_dtype(to_dtype(src, dtype::float16), dtype::float32).to_vector<float>();
  auto bf = to_dtype(to_dtype(src, dtype::bfloat16), dtype::float32).to_vector<float>();
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float wh = static_cast<float>(float16_t(v[i])), wb = static_cast<float>(bfloat16_t(v[i]));
    CHECK((std::isnan(wh) ? std::isnan(hf[i]) : hf[i] == wh));
    CHECK((std::isnan(wb) ? std::isnan(bf[i]) : bf[i] == wb));
  }
}
