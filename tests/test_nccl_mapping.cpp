// The "nccl" backend's mapping of every c10d call onto NCCL plans
// (backends/nccl_backend.cpp), checked without a GPU: each rank's backend hands
// its plans to a host emulator of NCCL instead of the group's NCCL state.
// Builds without NCCL compile this file to nothing.
//
// The emulator: nccl_emulator.hpp.

#include <doctest/doctest.h>

#ifdef TROUPE_HAVE_NCCL

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check_error.hpp"
#include "collective_test.hpp"
#include "nccl_emulator.hpp"
#include "reference.hpp"

using namespace troupe;
using namespace troupe::test::nccl_emulator;
using troupe::test::check_error;

namespace {

const int group_sizes[] = {1, 2, 3, 4};

std::size_t at(int r) {
  return static_cast<std::size_t>(r);
}

/// Values of rank r's j-th tensor (salt picks the call site).
ref::values vals(dtype t, int r, int n, std::int64_t len, int salt,
                 reduce_op::kind k = reduce_op::SUM) {
  return ref::random_values(t, len, ct::seed(r, n, len, salt), k);
}

/// Whether NCCL runs `op` on `t` (the backend refuses the others).
bool nccl_runs(const reduce_op& op, dtype t) {
  try {
    nccl::reduction_of("allreduce", op, t);
    return true;
  } catch (const error&) {
    return false;
  }
}

std::string op_name(const reduce_op& op) {
  return std::string(to_string(op.op()));
}

const dtype reduce_dtypes[] = {dtype::bool_,   dtype::uint8,     dtype::int8,      dtype::int32,
                               dtype::int64,   dtype::float16,   dtype::bfloat16,  dtype::float32,
                               dtype::float64, dtype::complex64, dtype::complex128};

std::vector<reduce_op> all_ops() {
  return {reduce_op::SUM,  reduce_op::PRODUCT, reduce_op::MIN,
          reduce_op::MAX,  reduce_op::AVG,     reduce_op::premul_sum(0.5),
          reduce_op::BAND, reduce_op::BOR,     reduce_op::BXOR};
}

}  // namespace

// -- broadcast, allreduce, reduce ------------------------------------------------------

TEST_CASE("nccl mapping: broadcast of one and several local tensors, any root and root_tensor") {
  for (int n : group_sizes)
    for (auto t : ct::move_dtypes)
      for (int k : {1, 3})
        for (int root : {0, n - 1}) {
          emulated_group g(n);
          const std::int64_t len = 5;
          const int root_tensor = k - 1;
          std::vector<tensor_list> ts(at(n));
          for (int r = 0; r < n; ++r)
            for (int j = 0; j < k; ++j)
              ts[at(r)].push_back(ref::make(t, vals(t, r, n, len, 10 + j)));
          const auto expected = ref::read(ts[at(root)][at(root_tensor)]);
          g.run("broadcast", [&](int r) {
            return g[r].broadcast(ts[at(r)], {root, root_tensor, use_group_timeout});
          });
          for (int r = 0; r < n; ++r)
            for (int j = 0; j < k; ++j)
              ref::check_close(ts[at(r)][at(j)], expected,
                               ct::name("broadcast", t, len) + " n=" + std::to_string(n) +
                                   " k=" + std::to_string(k) + " root=" + std::to_string(root) +
                                   " rank=" + std::to_string(r) + " tensor=" + std::to_string(j));
        }
}

TEST_CASE("nccl mapping: allreduce, every op NCCL allows on every dtype, one and several tensors") {
  for (int n : group_sizes)
    for (auto t : reduce_dtypes)
      for (auto& op : all_ops())
        for (int k : {1, 3}) {
          const std::int64_t len = 7;
          const auto what = ct::name("allreduce", t, len) + " " + op_name(op) +
                            " n=" + std::to_string(n) + " k=" + std::to_string(k);
          INFO(what);
          emulated_group g(n);
          std::vector<tensor_list> ts(at(n));
          std::vector<ref::values> inputs;
          for (int r = 0; r < n; ++r)
            for (int j = 0; j < k; ++j) {
              inputs.push_back(vals(t, r, n, len, 20 + j, op.op()));
              ts[at(r)].push_back(ref::make(t, inputs.back()));
            }
          if (!nccl_runs(op, t)) {
            check_error(
                [&] {
                  g[0].allreduce(ts[0], {op, use_group_timeout});
                },
                errc::invalid_argument, {"allreduce: ", "ReduceOp."});
            continue;
          }
          g.run(what, [&](int r) { return g[r].allreduce(ts[at(r)], {op, use_group_timeout}); });
          const auto expected = ref::reduce(inputs, op, t, static_cast<double>(n * k));
          for (int r = 0; r < n; ++r)
            for (int j = 0; j < k; ++j)
              ref::check_close(
                  ts[at(r)][at(j)], expected,
                  what + " rank=" + std::to_string(r) + " tensor=" + std::to_string(j));
        }
}

TEST_CASE("nccl mapping: allreduce_coalesced of tensors of several lengths") {
  for (int n : group_sizes)
    for (auto t : {dtype::float32, dtype::int64, dtype::bool_, dtype::complex64, dtype::float16})
      for (auto& op : std::vector<reduce_op>{reduce_op::SUM, reduce_op::MAX, reduce_op::AVG,
                                             reduce_op::premul_sum(2.0)}) {
        if (!nccl_runs(op, t)) continue;
        const std::int64_t lens[] = {3, 0, 6};
        const auto what =
            ct::name("allreduce_coalesced", t, 3) + " " + op_name(op) + " n=" + std::to_string(n);
        emulated_group g(n);
        std::vector<tensor_list> ts(at(n));
        std::vector<std::vector<ref::values>> inputs(3);  // [tensor][rank]
        for (int r = 0; r < n; ++r)
          for (std::size_t j = 0; j < 3; ++j) {
            inputs[j].push_back(vals(t, r, n, lens[j], 30 + static_cast<int>(j)));
            ts[at(r)].push_back(ref::make(t, inputs[j].back()));
          }
        g.run(what, [&](int r) {
          allreduce_coalesced_options o;
          o.op = op;
          return g[r].allreduce_coalesced(ts[at(r)], o);
        });
        for (std::size_t j = 0; j < 3; ++j) {
          const auto expected = ref::reduce(inputs[j], op, t);
          for (int r = 0; r < n; ++r)
            ref::check_close(ts[at(r)][j], expected, what + " tensor " + std::to_string(j));
        }
      }
}

TEST_CASE("nccl mapping: reduce into the root (tensor), the other ranks' tensors untouched") {
  for (int n : group_sizes)
    for (auto t : {dtype::float32, dtype::int32, dtype::bool_, dtype::float16, dtype::complex128})
      for (auto& op : std::vector<reduce_op>{reduce_op::SUM, reduce_op::PRODUCT, reduce_op::MIN,
                                             reduce_op::AVG, reduce_op::premul_sum(0.25)})
        for (int k : {1, 2})
          for (int root : {0, n - 1}) {
            if (!nccl_runs(op, t)) continue;
            const std::int64_t len = 6;
            const int root_tensor = k - 1;
            const auto what = ct::name("reduce", t, len) + " " + op_name(op) +
                              " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                              " root=" + std::to_string(root);
            emulated_group g(n);
            std::vector<tensor_list> ts(at(n));
            std::vector<ref::values> inputs;
            for (int r = 0; r < n; ++r)
              for (int j = 0; j < k; ++j) {
                inputs.push_back(vals(t, r, n, len, 40 + j, op.op()));
                ts[at(r)].push_back(ref::make(t, inputs.back()));
              }
            g.run(what, [&](int r) {
              return g[r].reduce(ts[at(r)], {op, root, root_tensor, use_group_timeout});
            });
            const auto expected = ref::reduce(inputs, op, t, static_cast<double>(n * k));
            for (int r = 0; r < n; ++r)
              for (int j = 0; j < k; ++j) {
                const bool result = r == root && j == root_tensor;
                ref::check_close(ts[at(r)][at(j)],
                                 result ? expected : ref::read(ref::make(t, inputs[at(r * k + j)])),
                                 what + " rank=" + std::to_string(r) + " tensor=" +
                                     std::to_string(j) + (result ? " (result)" : " (untouched)"));
              }
          }
}

TEST_CASE("nccl mapping: zero elements everywhere") {
  for (int n : group_sizes) {
    emulated_group g(n);
    const auto t = dtype::float32;
    std::vector<tensor_list> one(at(n)), three(at(n)), outs(at(n));
    for (int r = 0; r < n; ++r) {
      one[at(r)] = {ref::zeros({0}, t)};
      three[at(r)] = {ref::zeros({0}, t), ref::zeros({0}, t), ref::zeros({0}, t)};
      outs[at(r)] = {ref::zeros({0}, t)};
    }
    for (auto* ts : {&one, &three}) {
      g.run("allreduce", [&](int r) {
        return g[r].allreduce((*ts)[at(r)], {reduce_op::AVG, use_group_timeout});
      });
      g.run("reduce", [&](int r) {
        return g[r].reduce((*ts)[at(r)], {reduce_op::SUM, n - 1, 0, use_group_timeout});
      });
      g.run("broadcast", [&](int r) { return g[r].broadcast((*ts)[at(r)], {}); });
    }
    g.run("allgather_into_tensor",
          [&](int r) { return g[r].allgather_into_tensor(outs[at(r)][0], one[at(r)][0], {}); });
    g.run("reduce_scatter_tensor",
          [&](int r) { return g[r].reduce_scatter_tensor(outs[at(r)][0], one[at(r)][0], {}); });
    g.run("alltoall_single",
          [&](int r) { return g[r].alltoall_single(outs[at(r)][0], one[at(r)][0], {}, {}, {}); });
    const std::vector<std::int64_t> zeros(at(n), 0);
    g.run("allgatherv",
          [&](int r) { return g[r].allgatherv(outs[at(r)][0], one[at(r)][0], zeros, {}); });
    g.run("reduce_scatterv",
          [&](int r) { return g[r].reduce_scatterv(outs[at(r)][0], one[at(r)][0], zeros, {}); });
    for (int r = 0; r < n; ++r) CHECK(g[r].sequence_number() == 11);
  }
}

// -- allgather --------------------------------------------------------------------------

TEST_CASE("nccl mapping: allgather, allgather_coalesced and the _into_tensor forms") {
  for (int n : group_sizes)
    for (auto t : ct::move_dtypes) {
      const std::int64_t lens[] = {4, 0, 3};
      const auto what = ct::name("allgather", t, 4) + " n=" + std::to_string(n);
      // inputs[j][r]: rank r's j-th input.
      std::vector<std::vector<ref::values>> inputs(3);
      for (std::size_t j = 0; j < 3; ++j)
        for (int r = 0; r < n; ++r)
          inputs[j].push_back(vals(t, r, n, lens[j], 50 + static_cast<int>(j)));
      auto ins_of = [&](int r) {
        tensor_list ins;
        for (std::size_t j = 0; j < 3; ++j) ins.push_back(ref::make(t, inputs[j][at(r)]));
        return ins;
      };
      {  // allgather: outs[j][p] <- rank p's ins[j]
        emulated_group g(n);
        std::vector<tensor_list> ins(at(n));
        std::vector<std::vector<tensor_list>> outs(at(n));
        for (int r = 0; r < n; ++r) {
          ins[at(r)] = ins_of(r);
          outs[at(r)].resize(3);
          for (std::size_t j = 0; j < 3; ++j)
            for (int p = 0; p < n; ++p) outs[at(r)][j].push_back(ref::zeros({lens[j]}, t));
        }
        g.run(what, [&](int r) { return g[r].allgather(outs[at(r)], ins[at(r)], {}); });
        for (int r = 0; r < n; ++r)
          for (std::size_t j = 0; j < 3; ++j)
            for (int p = 0; p < n; ++p)
              ref::check_close(outs[at(r)][j][at(p)], inputs[j][at(p)],
                               what + " rank=" + std::to_string(r) + " [" + std::to_string(j) +
                                   "][" + std::to_string(p) + "]");
      }
      {  // allgather_coalesced: outs[p][j] <- rank p's ins[j]
        emulated_group g(n);
        std::vector<tensor_list> ins(at(n));
        std::vector<std::vector<tensor_list>> outs(at(n));
        for (int r = 0; r < n; ++r) {
          ins[at(r)] = ins_of(r);
          outs[at(r)].resize(at(n));
          for (int p = 0; p < n; ++p)
            for (std::size_t j = 0; j < 3; ++j)
              outs[at(r)][at(p)].push_back(ref::zeros({lens[j]}, t));
        }
        g.run(what + " coalesced",
              [&](int r) { return g[r].allgather_coalesced(outs[at(r)], ins[at(r)], {}); });
        for (int r = 0; r < n; ++r)
          for (int p = 0; p < n; ++p)
            for (std::size_t j = 0; j < 3; ++j)
              ref::check_close(outs[at(r)][at(p)][j], inputs[j][at(p)],
                               what + " coalesced rank=" + std::to_string(r) + " [" +
                                   std::to_string(p) + "][" + std::to_string(j) + "]");
      }
      {  // allgather_into_tensor(_coalesced): out_j = rank 0's in_j, rank 1's in_j, ...
        emulated_group g(n);
        std::vector<tensor_list> ins(at(n)), outs(at(n));
        for (int r = 0; r < n; ++r) {
          ins[at(r)] = ins_of(r);
          for (std::size_t j = 0; j < 3; ++j) outs[at(r)].push_back(ref::zeros({lens[j] * n}, t));
        }
        g.run(what + " into_tensor",
              [&](int r) { return g[r].allgather_into_tensor(outs[at(r)][0], ins[at(r)][0], {}); });
        g.run(what + " into_tensor_coalesced", [&](int r) {
          return g[r].allgather_into_tensor_coalesced(outs[at(r)], ins[at(r)], {});
        });
        for (int r = 0; r < n; ++r)
          for (std::size_t j = 0; j < 3; ++j)
            ref::check_close(
                outs[at(r)][j], ref::concat(inputs[j]),
                what + " into_tensor rank=" + std::to_string(r) + " [" + std::to_string(j) + "]");
      }
    }
}

TEST_CASE("nccl mapping: allgatherv with uneven counts and zeros") {
  for (int n : group_sizes)
    for (auto t : ct::move_dtypes) {
      const auto counts = ct::uneven_counts(n);
      std::int64_t sum = 0;
      for (auto c : counts) sum += c;
      const auto what = ct::name("allgatherv", t, sum) + " n=" + std::to_string(n);
      emulated_group g(n);
      std::vector<ref::values> inputs;
      std::vector<tensor> ins, outs;
      for (int r = 0; r < n; ++r) {
        inputs.push_back(vals(t, r, n, counts[at(r)], 60));
        ins.push_back(ref::make(t, inputs.back()));
        outs.push_back(ref::zeros({sum}, t));
      }
      g.run(what, [&](int r) { return g[r].allgatherv(outs[at(r)], ins[at(r)], counts, {}); });
      for (int r = 0; r < n; ++r)
        ref::check_close(outs[at(r)], ref::concat(inputs), what + " rank=" + std::to_string(r));
    }
}

// -- gather and scatter -------------------------------------------------------------------

TEST_CASE("nccl mapping: gather and gatherv into any root") {
  for (int n : group_sizes)
    for (auto t : ct::move_dtypes)
      for (int root : {0, n - 1}) {
        const auto what =
            ct::name("gather", t, 5) + " n=" + std::to_string(n) + " root=" + std::to_string(root);
        {
          emulated_group g(n);
          std::vector<ref::values> inputs;
          std::vector<tensor_list> ins(at(n));
          std::vector<std::vector<tensor_list>> outs(at(n));
          for (int r = 0; r < n; ++r) {
            inputs.push_back(vals(t, r, n, 5, 70));
            ins[at(r)].push_back(ref::make(t, inputs.back()));
            if (r == root) {
              outs[at(r)].resize(1);
              for (int p = 0; p < n; ++p) outs[at(r)][0].push_back(ref::zeros({5}, t));
            }
          }
          g.run(what, [&](int r) { return g[r].gather(outs[at(r)], ins[at(r)], {root}); });
          for (int p = 0; p < n; ++p)
            ref::check_close(outs[at(root)][0][at(p)], inputs[at(p)],
                             what + " from " + std::to_string(p));
        }
        {
          emulated_group g(n);
          const auto counts = ct::uneven_counts(n);
          std::int64_t sum = 0;
          for (auto c : counts) sum += c;
          std::vector<ref::values> inputs;
          std::vector<tensor> ins, outs;
          for (int r = 0; r < n; ++r) {
            inputs.push_back(vals(t, r, n, counts[at(r)], 71));
            ins.push_back(ref::make(t, inputs.back()));
            outs.push_back(r == root ? ref::zeros({sum}, t) : tensor());
          }
          g.run(what + " v",
                [&](int r) { return g[r].gatherv(outs[at(r)], ins[at(r)], counts, {root}); });
          ref::check_close(outs[at(root)], ref::concat(inputs), what + "v");
        }
      }
}

TEST_CASE("nccl mapping: scatter and scatterv from any root") {
  for (int n : group_sizes)
    for (auto t : ct::move_dtypes)
      for (int root : {0, n - 1}) {
        const auto what =
            ct::name("scatter", t, 5) + " n=" + std::to_string(n) + " root=" + std::to_string(root);
        {
          emulated_group g(n);
          std::vector<ref::values> parts;
          std::vector<tensor_list> outs(at(n));
          std::vector<std::vector<tensor_list>> ins(at(n));
          for (int p = 0; p < n; ++p) parts.push_back(vals(t, p, n, 5, 80));
          for (int r = 0; r < n; ++r) {
            outs[at(r)].push_back(ref::zeros({5}, t));
            if (r == root) {
              ins[at(r)].resize(1);
              for (int p = 0; p < n; ++p) ins[at(r)][0].push_back(ref::make(t, parts[at(p)]));
            }
          }
          g.run(what, [&](int r) { return g[r].scatter(outs[at(r)], ins[at(r)], {root}); });
          for (int r = 0; r < n; ++r)
            ref::check_close(outs[at(r)][0], parts[at(r)], what + " rank=" + std::to_string(r));
        }
        {
          emulated_group g(n);
          const auto counts = ct::uneven_counts(n);
          std::vector<ref::values> parts;
          for (int p = 0; p < n; ++p) parts.push_back(vals(t, p, n, counts[at(p)], 81));
          std::vector<tensor> ins, outs;
          for (int r = 0; r < n; ++r) {
            outs.push_back(ref::zeros({counts[at(r)]}, t));
            ins.push_back(r == root ? ref::make(t, ref::concat(parts)) : tensor());
          }
          g.run(what + "v",
                [&](int r) { return g[r].scatterv(outs[at(r)], ins[at(r)], counts, {root}); });
          for (int r = 0; r < n; ++r)
            ref::check_close(outs[at(r)], parts[at(r)], what + "v rank=" + std::to_string(r));
        }
      }
}

// -- reduce_scatter ---------------------------------------------------------------------

TEST_CASE("nccl mapping: reduce_scatter, reduce_scatter_tensor(_coalesced), reduce_scatterv") {
  for (int n : group_sizes)
    for (auto t : {dtype::float32, dtype::int64, dtype::bool_, dtype::bfloat16, dtype::complex64})
      for (auto& op : std::vector<reduce_op>{reduce_op::SUM, reduce_op::MAX, reduce_op::AVG,
                                             reduce_op::premul_sum(0.5)}) {
        if (!nccl_runs(op, t)) continue;
        const std::int64_t m = 3;
        const auto what =
            ct::name("reduce_scatter", t, m) + " " + op_name(op) + " n=" + std::to_string(n);
        // inputs[r]: rank r's n*m elements; block p goes to rank p.
        std::vector<ref::values> inputs;
        for (int r = 0; r < n; ++r) inputs.push_back(vals(t, r, n, m * n, 90));
        const auto total = ref::reduce(inputs, op, t);
        {
          emulated_group g(n);
          std::vector<tensor_list> outs(at(n));
          std::vector<std::vector<tensor_list>> ins(at(n));
          for (int r = 0; r < n; ++r) {
            outs[at(r)].push_back(ref::zeros({m}, t));
            ins[at(r)].resize(1);
            for (int p = 0; p < n; ++p)
              ins[at(r)][0].push_back(ref::make(t, ref::slice(inputs[at(r)], p * m, m)));
          }
          g.run(what, [&](int r) {
            return g[r].reduce_scatter(outs[at(r)], ins[at(r)], {op, use_group_timeout});
          });
          for (int r = 0; r < n; ++r)
            ref::check_close(outs[at(r)][0], ref::slice(total, r * m, m),
                             what + " rank=" + std::to_string(r));
        }
        {
          emulated_group g(n);
          // Two pairs: the whole inputs (block m), and their first n elements (block 1).
          std::vector<tensor_list> outs(at(n)), ins(at(n));
          std::vector<ref::values> heads;
          for (int r = 0; r < n; ++r) heads.push_back(ref::slice(inputs[at(r)], 0, n));
          const auto head_total = ref::reduce(heads, op, t);
          for (int r = 0; r < n; ++r) {
            ins[at(r)] = {ref::make(t, inputs[at(r)]), ref::make(t, heads[at(r)])};
            outs[at(r)] = {ref::zeros({m}, t), ref::zeros({1}, t)};
          }
          g.run(what + " tensor", [&](int r) {
            return g[r].reduce_scatter_tensor(outs[at(r)][0], ins[at(r)][0],
                                              {op, use_group_timeout});
          });
          for (int r = 0; r < n; ++r)
            ref::check_close(outs[at(r)][0], ref::slice(total, r * m, m),
                             what + " tensor rank=" + std::to_string(r));
          for (int r = 0; r < n; ++r) outs[at(r)][0].zero_();
          g.run(what + " tensor_coalesced", [&](int r) {
            return g[r].reduce_scatter_tensor_coalesced(outs[at(r)], ins[at(r)],
                                                        {op, use_group_timeout});
          });
          for (int r = 0; r < n; ++r) {
            ref::check_close(outs[at(r)][0], ref::slice(total, r * m, m),
                             what + " tensor_coalesced [0] rank=" + std::to_string(r));
            ref::check_close(outs[at(r)][1], ref::slice(head_total, r, 1),
                             what + " tensor_coalesced [1] rank=" + std::to_string(r));
          }
        }
        {
          emulated_group g(n);
          const auto counts = ct::uneven_counts(n);
          std::int64_t sum = 0;
          for (auto c : counts) sum += c;
          std::vector<ref::values> vin;
          for (int r = 0; r < n; ++r) vin.push_back(vals(t, r, n, sum, 91));
          const auto vtotal = ref::reduce(vin, op, t);
          std::vector<tensor> ins, outs;
          for (int r = 0; r < n; ++r) {
            ins.push_back(ref::make(t, vin[at(r)]));
            outs.push_back(ref::zeros({counts[at(r)]}, t));
          }
          g.run(what + "v", [&](int r) {
            return g[r].reduce_scatterv(outs[at(r)], ins[at(r)], counts, {op, use_group_timeout});
          });
          std::int64_t off = 0;
          for (int r = 0; r < n; ++r) {
            ref::check_close(outs[at(r)], ref::slice(vtotal, off, counts[at(r)]),
                             what + "v rank=" + std::to_string(r));
            ref::check_close(ins[at(r)], vin[at(r)], what + "v input of rank " + std::to_string(r));
            off += counts[at(r)];
          }
        }
      }
}

TEST_CASE("nccl mapping: in-place allgather_into_tensor and reduce_scatter_tensor (views)") {
  // NCCL's in-place forms: the input is the output's block `rank`, or the
  // output is the input's block `rank`.
  for (int n : group_sizes)
    for (auto t : {dtype::float32, dtype::int32, dtype::complex64}) {
      const std::int64_t m = 3;
      const auto what = ct::name("in-place", t, m) + " n=" + std::to_string(n);
      std::vector<ref::values> inputs;
      for (int r = 0; r < n; ++r) inputs.push_back(vals(t, r, n, m * n, 95));
      auto block = [&](const tensor& x, int r) {
        return tensor::from_blob(static_cast<char*>(x.data()) + at(r) * at(m) * x.element_size(),
                                 {m}, t);
      };
      {
        emulated_group g(n);
        std::vector<tensor> outs, ins;
        for (int r = 0; r < n; ++r) {
          outs.push_back(ref::make(t, inputs[at(r)]));
          ins.push_back(block(outs.back(), r));
        }
        g.run(what + " allgather_into_tensor",
              [&](int r) { return g[r].allgather_into_tensor(outs[at(r)], ins[at(r)], {}); });
        ref::values expected;
        for (int p = 0; p < n; ++p) {
          auto b = ref::slice(inputs[at(p)], p * m, m);
          expected.insert(expected.end(), b.begin(), b.end());
        }
        for (int r = 0; r < n; ++r)
          ref::check_close(outs[at(r)], expected, what + " allgather rank=" + std::to_string(r));
      }
      {
        emulated_group g(n);
        std::vector<tensor> outs, ins;
        for (int r = 0; r < n; ++r) {
          ins.push_back(ref::make(t, inputs[at(r)]));
          outs.push_back(block(ins.back(), r));
        }
        g.run(what + " reduce_scatter_tensor",
              [&](int r) { return g[r].reduce_scatter_tensor(outs[at(r)], ins[at(r)], {}); });
        const auto total = ref::reduce(inputs, reduce_op::SUM, t);
        for (int r = 0; r < n; ++r)
          ref::check_close(outs[at(r)], ref::slice(total, r * m, m),
                           what + " reduce_scatter rank=" + std::to_string(r));
      }
    }
}

// -- alltoall -----------------------------------------------------------------------------

TEST_CASE("nccl mapping: alltoall with per-pair sizes, alltoall_single even and uneven") {
  for (int n : group_sizes)
    for (auto t : ct::move_dtypes) {
      const auto what = ct::name("alltoall", t, 0) + " n=" + std::to_string(n);
      // Rank r sends (r + 2p) % 4 elements to rank p.
      auto len = [](int r, int p) { return static_cast<std::int64_t>((r + 2 * p) % 4); };
      auto block = [&](int r, int p) { return vals(t, r, n, len(r, p), 100 + p); };
      {
        emulated_group g(n);
        std::vector<tensor_list> ins(at(n)), outs(at(n));
        for (int r = 0; r < n; ++r)
          for (int p = 0; p < n; ++p) {
            ins[at(r)].push_back(ref::make(t, block(r, p)));
            outs[at(r)].push_back(ref::zeros({len(p, r)}, t));
          }
        g.run(what, [&](int r) { return g[r].alltoall(outs[at(r)], ins[at(r)], {}); });
        for (int r = 0; r < n; ++r)
          for (int p = 0; p < n; ++p)
            ref::check_close(outs[at(r)][at(p)], block(p, r),
                             what + " rank=" + std::to_string(r) + " from " + std::to_string(p));
      }
      for (bool even : {true, false}) {
        // Rows of 2 elements; even: 2 rows to each rank, uneven: len(r, p) rows.
        emulated_group g(n);
        auto rows = [&](int r, int p) { return even ? std::int64_t{2} : len(r, p); };
        std::vector<tensor> ins, outs;
        std::vector<std::vector<std::int64_t>> in_splits(at(n)), out_splits(at(n));
        std::vector<ref::values> expected(at(n));
        for (int r = 0; r < n; ++r) {
          std::vector<ref::values> mine;
          std::int64_t in_rows = 0, out_rows = 0;
          for (int p = 0; p < n; ++p) {
            mine.push_back(vals(t, r, n, 2 * rows(r, p), 110 + p));
            in_rows += rows(r, p);
            out_rows += rows(p, r);
            if (!even) {
              in_splits[at(r)].push_back(rows(r, p));
              out_splits[at(r)].push_back(rows(p, r));
            }
          }
          ins.push_back(ref::make(t, ref::concat(mine), {in_rows, 2}));
          outs.push_back(ref::zeros({out_rows, 2}, t));
        }
        for (int r = 0; r < n; ++r)
          for (int p = 0; p < n; ++p) {
            auto v = vals(t, p, n, 2 * rows(p, r), 110 + r);
            expected[at(r)].insert(expected[at(r)].end(), v.begin(), v.end());
          }
        const auto name = what + (even ? " single even" : " single uneven");
        g.run(name, [&](int r) {
          return g[r].alltoall_single(outs[at(r)], ins[at(r)], out_splits[at(r)], in_splits[at(r)],
                                      {});
        });
        for (int r = 0; r < n; ++r)
          ref::check_close(outs[at(r)], expected[at(r)], name + " rank=" + std::to_string(r));
      }
    }
}

// -- barrier, point to point, batches -------------------------------------------------------

TEST_CASE("nccl mapping: barrier and sequence numbers") {
  for (int n : group_sizes) {
    emulated_group g(n);
    for (int i = 0; i < 3; ++i) g.run("barrier", [&](int r) { return g[r].barrier({}); });
    for (int r = 0; r < n; ++r) CHECK(g[r].sequence_number() == 3);
  }
}

TEST_CASE("nccl mapping: barrier runs its byte on device_ids[0], else the group's device") {
  for (int n : group_sizes) {
    emulated_group g(n);
    g.run("barrier", [&](int r) { return g[r].barrier({}); });
    g.run("barrier on device 3", [&](int r) { return g[r].barrier({.device_ids = {3, 1}}); });
    for (int r = 0; r < n; ++r)
      CHECK(g.runners[at(r)]->scratch_devices == std::vector<int>{0, 3});  // bind_default's 0
  }
}

TEST_CASE("nccl mapping: allgather_coalesced and its _into_tensor form, a dtype per input") {
  // One NCCL allgather per input, each of its own dtype.
  const dtype types[] = {dtype::float32, dtype::int64, dtype::complex64, dtype::uint8};
  const std::int64_t lens[] = {3, 1, 2, 0};
  for (int n : group_sizes) {
    const auto what = "mixed allgather_coalesced n=" + std::to_string(n);
    std::vector<std::vector<ref::values>> inputs(4);  // [j][r]
    for (std::size_t j = 0; j < 4; ++j)
      for (int r = 0; r < n; ++r)
        inputs[j].push_back(vals(types[j], r, n, lens[j], 80 + static_cast<int>(j)));
    std::vector<tensor_list> ins(at(n));
    std::vector<std::vector<tensor_list>> outs(at(n));
    std::vector<tensor_list> flats(at(n));
    for (int r = 0; r < n; ++r) {
      for (std::size_t j = 0; j < 4; ++j) {
        ins[at(r)].push_back(ref::make(types[j], inputs[j][at(r)]));
        flats[at(r)].push_back(ref::zeros({lens[j] * n}, types[j]));
      }
      outs[at(r)].resize(at(n));
      for (int p = 0; p < n; ++p)
        for (std::size_t j = 0; j < 4; ++j)
          outs[at(r)][at(p)].push_back(ref::zeros({lens[j]}, types[j]));
    }
    emulated_group g(n);
    g.run(what, [&](int r) { return g[r].allgather_coalesced(outs[at(r)], ins[at(r)], {}); });
    g.run(what + " into_tensor", [&](int r) {
      return g[r].allgather_into_tensor_coalesced(flats[at(r)], ins[at(r)], {});
    });
    for (int r = 0; r < n; ++r)
      for (std::size_t j = 0; j < 4; ++j) {
        for (int p = 0; p < n; ++p) ref::check_close(outs[at(r)][at(p)][j], inputs[j][at(p)], what);
        ref::check_close(flats[at(r)][j], ref::concat(inputs[j]), what + " into_tensor");
      }
  }
}

TEST_CASE("nccl mapping: send and recv on pair communicators, tags ignored") {
  for (int n : {2, 3, 4})
    for (auto t : ct::move_dtypes) {
      emulated_group g(n);
      // Each pair (lo, hi): lo sends to hi, then hi sends to lo; in rank order.
      for (int lo = 0; lo < n; ++lo)
        for (int hi = lo + 1; hi < n; ++hi) {
          const auto what = ct::name("send/recv", t, 4) + " n=" + std::to_string(n) + " " +
                            std::to_string(lo) + "<->" + std::to_string(hi);
          INFO(what);
          for (bool down : {false, true}) {
            const int from = down ? hi : lo, to = down ? lo : hi;
            const auto v = vals(t, from, n, 4, 120 + to);
            tensor_list sent{ref::make(t, v)}, got{ref::zeros({4}, t)};
            auto s = g[from].send(sent, to, {7, use_group_timeout});
            CHECK_FALSE(s.is_completed());
            auto r = g[to].recv(got, from, {9, use_group_timeout});
            REQUIRE(s.is_completed());
            REQUIRE(r.is_completed());
            CHECK(s.exception() == nullptr);
            REQUIRE(r.exception() == nullptr);
            CHECK(r.source_rank() == from);
            ref::check_close(got[0], v, what);
          }
        }
    }
}

TEST_CASE("nccl mapping: batch_isend_irecv around a ring and both ways") {
  for (int n : {2, 3, 4})
    for (auto t : ct::move_dtypes) {
      const auto what = ct::name("batch_isend_irecv", t, 3) + " n=" + std::to_string(n);
      emulated_group g(n);
      // Each rank sends to both neighbours and receives from both (receives first).
      std::vector<std::vector<p2p_op>> ops(at(n));
      std::vector<tensor> from_left(at(n)), from_right(at(n));
      auto left = [&](int r) { return (r + n - 1) % n; };
      auto right = [&](int r) { return (r + 1) % n; };
      auto payload = [&](int from, int to) { return vals(t, from, n, 3, 130 + to); };
      for (int r = 0; r < n; ++r) {
        from_left[at(r)] = ref::zeros({3}, t);
        from_right[at(r)] = ref::zeros({3}, t);
        ops[at(r)] = {{p2p_op::irecv, from_left[at(r)], left(r)},
                      {p2p_op::irecv, from_right[at(r)], right(r)},
                      {p2p_op::isend, ref::make(t, payload(r, right(r))), right(r)},
                      {p2p_op::isend, ref::make(t, payload(r, left(r))), left(r)}};
      }
      g.run(what, [&](int r) { return g[r].batch_isend_irecv(ops[at(r)]); });
      for (int r = 0; r < n; ++r) {
        ref::check_close(from_left[at(r)], payload(left(r), r), what + " from left");
        ref::check_close(from_right[at(r)], payload(right(r), r), what + " from right");
      }
    }
}

// -- the emulator fails what NCCL would hang on --------------------------------------------

TEST_CASE("nccl mapping: disagreeing calls fail every rank instead of hanging; abort") {
  emulated_group g(2);
  auto a = tensor::zeros({4}, dtype::float32), b = tensor::zeros({3}, dtype::float32);
  tensor_list ta{a}, tb{b};
  auto w0 = g[0].allreduce(ta, {});
  auto w1 = g[1].allreduce(tb, {});
  REQUIRE(w0.is_completed());
  REQUIRE(w1.is_completed());
  check_error([&] { w0.wait(); }, errc::backend,
              {"allreduce: NCCL emulator", "ncclAllReduce", "count 4", "has 3"});
  tensor_list s{tensor::zeros({4}, dtype::int32)}, r{tensor::zeros({5}, dtype::int32)};
  auto ws = g[0].send(s, 1, {});
  auto wr = g[1].recv(r, 0, {});
  check_error([&] { wr.wait(); }, errc::backend, {"recv: NCCL emulator", "carries 4", "takes 5"});
  // A call whose peers never come fails on abort.
  tensor_list x{tensor::zeros({2}, dtype::float32)};
  auto pending = g[0].allreduce(x, {});
  CHECK_FALSE(pending.is_completed());
  g[0].abort("test");
  check_error([&] { pending.wait(); }, errc::aborted, {"allreduce", "aborted: test"});
  check_error([&] { g[1].barrier({}).wait(); }, errc::aborted, {"barrier", "aborted: test"});
}

#endif
