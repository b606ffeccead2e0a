// Timing of troupe-demo (see timing.hpp): what is timed, how, and the table.

#include "demo/timing.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>

#include "troupe/troupe.hpp"

namespace demo {
namespace {

using troupe::process_group;
using troupe::tensor;
using troupe::tensor_list;
using count_t = std::int64_t;

tensor zeros(count_t count) {
  return tensor::zeros({count}, troupe::dtype::float32);
}

/// One timed collective: how many bytes a nominal size becomes, how to prepare
/// the buffers for it, and the nccl-tests bus bandwidth factor.
struct bench_op {
  const char* name;
  /// nccl-tests' factor from algbw to busbw for n ranks.
  double (*bus_factor)(int n);
  /// Elements per rank block for a nominal size (>= 1).
  bool per_rank_blocks;
  /// Prepares the buffers and returns the call to time.
  std::function<std::function<troupe::work()>(process_group&, count_t)> prepare;
};

double factor_one(int) {
  return 1.0;
}
double factor_allreduce(int n) {
  return 2.0 * (n - 1) / n;
}
double factor_nm1_over_n(int n) {
  return double(n - 1) / n;
}

std::vector<bench_op> bench_ops() {
  using fn = std::function<troupe::work()>;
  std::vector<bench_op> ops;
  // For per_rank_blocks ops, `count` is the block each rank contributes or
  // receives; the reported size is the whole buffer (count × n), as nccl-tests.
  ops.push_back({"allreduce", factor_allreduce, false, [](process_group& pg, count_t count) -> fn {
                   auto t = zeros(count);
                   return [&pg, t] { return pg.allreduce(t); };
                 }});
  ops.push_back({"broadcast", factor_one, false, [](process_group& pg, count_t count) -> fn {
                   auto t = zeros(count);
                   return [&pg, t] { return pg.broadcast(t, 0); };
                 }});
  ops.push_back({"reduce", factor_one, false, [](process_group& pg, count_t count) -> fn {
                   auto t = zeros(count);
                   return [&pg, t] { return pg.reduce(t, 0); };
                 }});
  ops.push_back({"allgather_into_tensor", factor_nm1_over_n, true,
                 [](process_group& pg, count_t count) -> fn {
                   auto in = zeros(count), out = zeros(count * pg.size());
                   return [&pg, in, out] { return pg.allgather_into_tensor(out, in); };
                 }});
  ops.push_back({"reduce_scatter_tensor", factor_nm1_over_n, true,
                 [](process_group& pg, count_t count) -> fn {
                   auto in = zeros(count * pg.size()), out = zeros(count);
                   return [&pg, in, out] { return pg.reduce_scatter_tensor(out, in); };
                 }});
  ops.push_back(
      {"alltoall_single", factor_nm1_over_n, true, [](process_group& pg, count_t count) -> fn {
         auto in = zeros(count * pg.size()), out = zeros(count * pg.size());
         return [&pg, in, out] { return pg.alltoall_single(out, in); };
       }});
  ops.push_back({"gather", factor_nm1_over_n, true, [](process_group& pg, count_t count) -> fn {
                   auto in = zeros(count);
                   tensor_list outs;
                   if (pg.rank() == 0)
                     for (int q = 0; q < pg.size(); ++q) outs.push_back(zeros(count));
                   return [&pg, in, outs] { return pg.gather(outs, in); };
                 }});
  ops.push_back({"scatter", factor_nm1_over_n, true, [](process_group& pg, count_t count) -> fn {
                   auto out = zeros(count);
                   tensor_list ins;
                   if (pg.rank() == 0)
                     for (int q = 0; q < pg.size(); ++q) ins.push_back(zeros(count));
                   return [&pg, out, ins] { return pg.scatter(out, ins); };
                 }});
  ops.push_back({"sendrecv (ring)", factor_one, false, [](process_group& pg, count_t count) -> fn {
                   auto in = zeros(count), out = zeros(count);
                   const int n = pg.size(), r = pg.rank();
                   return [&pg, in, out, n, r] {
                     auto rw = pg.recv(out, (r + n - 1) % n);
                     pg.send(in, (r + 1) % n).wait();
                     return rw;
                   };
                 }});
  return ops;
}

bool is_sendrecv(const bench_op& op) {
  return std::string(op.name).rfind("sendrecv", 0) == 0;
}

/// The rows every rank times, in the same order, without times yet.
std::vector<timed_row> make_rows(const timing_config& c, int n) {
  std::vector<std::size_t> sizes = {4, 1024, 64 * 1024, 1024 * 1024};
  if (!c.quick) sizes.push_back(16 * 1024 * 1024);
  std::vector<timed_row> rows;
  rows.push_back({"barrier", 0.0, 0, {}});
  for (auto& op : bench_ops()) {
    if (n == 1 && is_sendrecv(op)) continue;  // sending to oneself is refused
    for (auto s : sizes) {
      count_t elems = static_cast<count_t>(s / sizeof(float));
      if (op.per_rank_blocks) elems = std::max<count_t>(1, elems / n) * n;
      rows.push_back(
          {op.name, op.bus_factor(n), static_cast<std::size_t>(elems) * sizeof(float), {}});
    }
  }
  return rows;
}

/// Times `call` on this rank: a barrier lines the ranks up before each iteration.
void time_iterations(process_group& pg, const timing_config& c,
                     const std::function<troupe::work()>& call, double* out) {
  using clock = std::chrono::steady_clock;
  for (int it = 0; it < c.warmup + c.iters; ++it) {
    pg.barrier().wait();
    auto t0 = clock::now();
    call().wait();
    auto t1 = clock::now();
    if (it >= c.warmup)
      out[it - c.warmup] = std::chrono::duration<double, std::micro>(t1 - t0).count();
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace

std::vector<timed_row> run_benchmarks(troupe::world& w, const timing_config& c) {
  auto& pg = w.default_group();
  const int n = w.size();
  auto rows = make_rows(c, n);
  const auto iters = static_cast<std::size_t>(c.iters);
  // This rank's times, [row][iteration]: the buffer the reduce MAX combines.
  auto times = tensor::zeros({static_cast<count_t>(rows.size() * iters)}, troupe::dtype::float64);
  double* t = times.data_as<double>();
  std::size_t next = 0;
  time_iterations(
      pg, c, [&pg] { return pg.barrier(); }, t + iters * next++);
  for (auto& op : bench_ops()) {
    if (n == 1 && is_sendrecv(op)) continue;
    while (next < rows.size() && rows[next].op == op.name) {
      count_t elems = static_cast<count_t>(rows[next].bytes / sizeof(float));
      if (op.per_rank_blocks) elems /= n;
      auto call = op.prepare(pg, elems);
      time_iterations(pg, c, call, t + iters * next++);
    }
  }
  // Time of an iteration = the slowest rank's.
  pg.reduce(times, 0, troupe::reduce_op::MAX).wait();
  if (w.rank() != 0) return {};
  for (std::size_t r = 0; r < rows.size(); ++r)
    rows[r].us.assign(t + iters * r, t + iters * (r + 1));
  return rows;
}

void print_table(const timing_config& c, const std::vector<timed_row>& rows) {
  std::printf("\n%-24s %10s %12s %12s %12s\n", "op", "bytes", "time (us)", "algbw (GB/s)",
              "busbw (GB/s)");
  for (auto& r : rows) {
    const double us = median(r.us);
    if (r.bytes == 0) {
      std::printf("%-24s %10zu %12.2f %12s %12s\n", r.op.c_str(), r.bytes, us, "-", "-");
      continue;
    }
    const double algbw = static_cast<double>(r.bytes) / (us * 1e-6) / 1e9;
    std::printf("%-24s %10zu %12.2f %12.3f %12.3f\n", r.op.c_str(), r.bytes, us, algbw,
                algbw * r.bus_factor);
  }
  std::printf(
      "\nfloat32; bytes = the whole buffer (allgather/gather: output, reduce_scatter/scatter: "
      "input,\nalltoall: one rank's input); time = slowest rank per iteration, median of %d "
      "iterations\nafter %d warm-up; busbw as nccl-tests: allreduce x2(n-1)/n, allgather, "
      "reduce_scatter,\nalltoall, gather, scatter x(n-1)/n, broadcast, reduce, sendrecv x1.\n",
      c.iters, c.warmup);
}

}  // namespace demo
