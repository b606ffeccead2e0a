// The direct plan (backends/direct_plan.hpp) run with the CPU kernels: every
// collective family on 1, 2, 3, 4 and 7 ranks, the ranks' shares run in
// several orders (shares are disjoint, so the order must not matter), in
// place and not, and the checks that the ranks' calls agree. On a GPU the
// same steps run as kernels (backends/device_exchange.cpp).

#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>

#include "../backends/direct_plan.hpp"
#include "check_error.hpp"
#include "reference.hpp"

using namespace troupe;
using troupe::detail::collective_call;
using troupe::detail::op_code;
using troupe::test::check_error;

namespace {

using calls_t = std::vector<std::shared_ptr<collective_call>>;

std::vector<const collective_call*> view(const calls_t& calls) {
  std::vector<const collective_call*> v;
  for (auto& c : calls) v.push_back(c.get());
  return v;
}

/// Runs every rank's share, in rank order, reversed or shuffled.
void run_all(const calls_t& calls, int order) {
  auto v = view(calls);
  troupe::detail::check_calls_agree(v);
  std::vector<int> ranks(calls.size());
  std::iota(ranks.begin(), ranks.end(), 0);
  if (order == 1) std::reverse(ranks.begin(), ranks.end());
  if (order == 2) std::shuffle(ranks.begin(), ranks.end(), std::mt19937{7});
  for (int r : ranks) troupe::detail::run_on_cpu(troupe::detail::direct_plan(v, r));
}

std::shared_ptr<collective_call> call(op_code code, const char* name) {
  auto c = std::make_shared<collective_call>();
  c->code = code;
  c->name = name;
  return c;
}

const int rank_counts[] = {1, 2, 3, 4, 7};
const std::int64_t sizes[] = {0, 1, 5, 1001};

}  // namespace

TEST_CASE("direct plan: allreduce and reduce, every op, in place") {
  const reduce_op ops[] = {reduce_op::SUM, reduce_op::AVG, reduce_op::MAX, reduce_op::PRODUCT,
                           reduce_op::premul_sum(0.5)};
  for (int n : rank_counts)
    for (auto len : sizes)
      for (auto& op : ops)
        for (auto code : {op_code::allreduce, op_code::reduce})
          for (int order = 0; order < 3; ++order) {
            const auto t = op.op() == reduce_op::MAX ? dtype::int32 : dtype::float32;
            const int root = n - 1;
            calls_t calls;
            std::vector<ref::values> in;
            for (int r = 0; r < n; ++r) {
              in.push_back(
                  ref::random_values(t, len, static_cast<std::uint64_t>(r * 31 + len), op.op()));
              auto c = call(code, code == op_code::allreduce ? "allreduce" : "reduce");
              c->op = op;
              c->root = root;
              c->input = c->output = ref::make(t, in.back());
              calls.push_back(c);
            }
            run_all(calls, order);
            auto expected = ref::reduce(in, op, t);
            for (int r = 0; r < n; ++r) {
              const bool written = code == op_code::allreduce || r == root;
              ref::check_close(calls[static_cast<std::size_t>(r)]->output,
                               written ? expected : in[static_cast<std::size_t>(r)],
                               std::string(to_string(code)) + " n=" + std::to_string(n) +
                                   " len=" + std::to_string(len) + " op=" + op.to_string() +
                                   " rank " + std::to_string(r));
            }
          }
}

TEST_CASE("direct plan: AVG over several local tensors divides by ranks times tensors") {
  calls_t calls;
  for (int r = 0; r < 3; ++r) {
    auto c = call(op_code::allreduce, "allreduce");
    c->op = reduce_op::AVG;
    c->avg_local = 2;
    c->input = c->output = tensor::from_vector<float>({6.0f * static_cast<float>(r + 1)});
    calls.push_back(c);
  }
  run_all(calls, 0);
  for (auto& c : calls) CHECK(c->output.to_vector<float>()[0] == doctest::Approx(36.0 / 6.0));
}

TEST_CASE("direct plan: broadcast, gathers, scatters and alltoall") {
  for (int n : rank_counts)
    for (auto len : sizes)
      for (int order = 0; order < 3; ++order) {
        const int root = n / 2;
        const auto t = dtype::float64;
        auto info = "n=" + std::to_string(n) + " len=" + std::to_string(len);
        // Per-rank counts that differ (v-forms): rank r has len + r elements.
        std::vector<std::int64_t> counts;
        for (int r = 0; r < n; ++r) counts.push_back(len + r);
        const auto total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
        std::vector<ref::values> in;
        for (int r = 0; r < n; ++r)
          in.push_back(ref::random_values(t, counts[static_cast<std::size_t>(r)],
                                          static_cast<std::uint64_t>(r + 5)));
        ref::values all;
        for (auto& v : in) all.insert(all.end(), v.begin(), v.end());

        // broadcast (the root's buffer, len elements, into every rank's)
        calls_t b;
        for (int r = 0; r < n; ++r) {
          auto c = call(op_code::broadcast, "broadcast");
          c->root = root;
          auto v = ref::random_values(t, len, static_cast<std::uint64_t>(r + 100));
          if (r == root) v = ref::values(all.begin(), all.begin() + len);
          c->input = c->output = ref::make(t, v);
          b.push_back(c);
        }
        run_all(b, order);
        for (auto& c : b)
          ref::check_close(c->output, ref::values(all.begin(), all.begin() + len),
                           "broadcast " + info);

        // allgatherv and gatherv
        for (auto code : {op_code::allgatherv, op_code::gatherv}) {
          calls_t g;
          for (int r = 0; r < n; ++r) {
            auto c = call(code, "gather");
            c->root = root;
            c->counts = counts;
            c->input = ref::make(t, in[static_cast<std::size_t>(r)]);
            c->output = tensor::zeros({total}, t);
            g.push_back(c);
          }
          run_all(g, order);
          for (int r = 0; r < n; ++r)
            if (code == op_code::allgatherv || r == root)
              ref::check_close(g[static_cast<std::size_t>(r)]->output, all,
                               std::string(to_string(code)) + " " + info);
        }

        // scatterv (the root's concatenation, block r to rank r)
        calls_t s;
        for (int r = 0; r < n; ++r) {
          auto c = call(op_code::scatterv, "scatterv");
          c->root = root;
          c->counts = counts;
          c->output = tensor::zeros({counts[static_cast<std::size_t>(r)]}, t);
          c->input = r == root ? ref::make(t, all) : c->output;
          s.push_back(c);
        }
        run_all(s, order);
        for (int r = 0; r < n; ++r)
          ref::check_close(s[static_cast<std::size_t>(r)]->output, in[static_cast<std::size_t>(r)],
                           "scatterv " + info);

        // reduce_scatterv (block r of the sum to rank r)
        calls_t rs;
        std::vector<ref::values> full;
        for (int r = 0; r < n; ++r) {
          full.push_back(ref::random_values(t, total, static_cast<std::uint64_t>(r + 40)));
          auto c = call(op_code::reduce_scatterv, "reduce_scatterv");
          c->counts = counts;
          c->input = ref::make(t, full.back());
          c->output = tensor::zeros({counts[static_cast<std::size_t>(r)]}, t);
          rs.push_back(c);
        }
        run_all(rs, order);
        auto sum = ref::reduce(full, reduce_op::SUM, t);
        std::int64_t off = 0;
        for (int r = 0; r < n; ++r) {
          auto cnt = counts[static_cast<std::size_t>(r)];
          ref::check_close(rs[static_cast<std::size_t>(r)]->output,
                           ref::values(sum.begin() + off, sum.begin() + off + cnt),
                           "reduce_scatterv " + info);
          off += cnt;
        }

        // alltoallv: rank i sends (i + j) % 3 + len elements to rank j
        calls_t a;
        auto sends = [&](int i, int j) { return static_cast<std::int64_t>((i + j) % 3) + len; };
        std::vector<ref::values> sent;
        for (int i = 0; i < n; ++i) {
          auto c = call(op_code::alltoallv, "alltoall");
          std::int64_t out_total = 0;
          for (int j = 0; j < n; ++j) {
            c->counts.push_back(sends(i, j));
            c->recv_counts.push_back(sends(j, i));
            out_total += sends(j, i);
          }
          sent.push_back(ref::random_values(
              t, std::accumulate(c->counts.begin(), c->counts.end(), std::int64_t{0}),
              static_cast<std::uint64_t>(i + 70)));
          c->input = ref::make(t, sent.back());
          c->output = tensor::zeros({out_total}, t);
          a.push_back(c);
        }
        run_all(a, order);
        for (int j = 0; j < n; ++j) {
          ref::values expected;
          for (int i = 0; i < n; ++i) {
            std::int64_t from = 0;
            for (int k = 0; k < j; ++k) from += sends(i, k);
            auto& v = sent[static_cast<std::size_t>(i)];
            expected.insert(expected.end(), v.begin() + from, v.begin() + from + sends(i, j));
          }
          ref::check_close(a[static_cast<std::size_t>(j)]->output, expected, "alltoallv " + info);
        }
      }
}

TEST_CASE("direct plan: the ranks' calls must agree") {
  auto two = [](op_code c0, op_code c1) {
    calls_t calls;
    for (auto code : {c0, c1}) {
      auto c = call(code, code == op_code::allreduce ? "allreduce" : "broadcast");
      c->input = c->output = tensor::zeros({4}, dtype::float32);
      calls.push_back(c);
    }
    return calls;
  };
  check_error(
      [&] { troupe::detail::check_calls_agree(view(two(op_code::allreduce, op_code::broadcast))); },
      errc::mismatch,
      {"collective mismatch", "rank 1 called broadcast", "rank 0 called allreduce"});
  auto calls = two(op_code::allreduce, op_code::allreduce);
  calls[1]->input = calls[1]->output = tensor::zeros({5}, dtype::float32);
  check_error([&] { troupe::detail::check_calls_agree(view(calls)); }, errc::mismatch,
              {"rank 0 called allreduce (SUM) of 4 float32 elements",
               "rank 1 called allreduce (SUM) of 5 float32 elements", "the element count"});
  calls[1]->input = calls[1]->output = tensor::zeros({4}, dtype::float64);
  check_error([&] { troupe::detail::check_calls_agree(view(calls)); }, errc::mismatch,
              {"rank 1 called allreduce (SUM) of 4 float64 elements", "the dtype"});
  calls[1]->input = calls[1]->output = tensor::zeros({4}, dtype::float32);
  calls[1]->op = reduce_op::MAX;
  check_error([&] { troupe::detail::check_calls_agree(view(calls)); }, errc::mismatch,
              {"rank 1 called allreduce (MAX)", "rank 0 called allreduce (SUM)", "the reduce op"});
  calls[1]->op = reduce_op::SUM;
  // allreduce has no root: only rooted collectives compare it.
  calls[1]->root = 1;
  troupe::detail::check_calls_agree(view(calls));
  for (auto& c : calls) c->code = op_code::reduce;
  check_error([&] { troupe::detail::check_calls_agree(view(calls)); }, errc::mismatch,
              {"rank 1 called reduce (SUM) of 4 float32 elements to root 1", "the root"});
  // alltoallv: what rank 0 sends to rank 1 must be what rank 1 expects.
  calls_t a;
  for (int r = 0; r < 2; ++r) {
    auto c = call(op_code::alltoallv, "alltoall_single");
    c->counts = {1, 2};
    c->recv_counts = {1, 1};
    c->input = tensor::zeros({3}, dtype::float32);
    c->output = tensor::zeros({2}, dtype::float32);
    a.push_back(c);
  }
  check_error([&] { troupe::detail::check_calls_agree(view(a)); }, errc::mismatch,
              {"alltoall: rank 0 sends 2 elements to rank 1, which expects 1 from it"});
}
