// troupe-demo — the main job: starts N in-process ranks (one troupe::world
// each, on its own thread, over one shared hash_store), runs every collective
// once and checks each result against values computed locally, then times the
// collectives over a range of float32 sizes and prints latency and bandwidth
// with the definitions of nccl-tests.
//
//   troupe-demo [--ranks N] [--iters K] [--quick]
//
// Exits non-zero with a message naming the collective, the rank and the
// element when any result is wrong.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/testing.hpp"
#include "troupe/troupe.hpp"

namespace {

using troupe::process_group;
using troupe::reduce_op;
using troupe::tensor;
using troupe::tensor_list;
using troupe::world;
using count_t = std::int64_t;

constexpr int max_ranks = 32;  // keeps every sum of the checks exact in float32

struct config {
  int ranks = 4;
  int iters = 20;
  int warmup = 5;
  bool quick = false;
};

void usage(const char* argv0, std::ostream& os) {
  os << "usage: " << argv0 << " [--ranks N] [--iters K] [--quick]\n"
     << "  --ranks N   number of in-process ranks (1.." << max_ranks << ", default 4)\n"
     << "  --iters K   timed iterations per size, after warm-up (default 20)\n"
     << "  --quick     time sizes up to 1 MiB only\n";
}

int parse_int(const std::string& flag, const char* text) {
  try {
    std::size_t used = 0;
    int v = std::stoi(text, &used);
    if (used == std::string(text).size()) return v;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(flag + " expects an integer, got '" + text + "'");
}

config parse(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) throw std::invalid_argument(a + " expects a value");
      return argv[++i];
    };
    if (a == "--ranks") {
      c.ranks = parse_int(a, value());
    } else if (a == "--iters") {
      c.iters = parse_int(a, value());
    } else if (a == "--quick") {
      c.quick = true;
    } else if (a == "--help" || a == "-h") {
      usage(argv[0], std::cout);
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown argument '" + a + "'");
    }
  }
  if (c.ranks < 1 || c.ranks > max_ranks)
    throw std::invalid_argument("--ranks " + std::to_string(c.ranks) + " is outside 1.." +
                                std::to_string(max_ranks));
  if (c.iters < 1) throw std::invalid_argument("--iters " + std::to_string(c.iters) + " is < 1");
  if (c.quick) c.warmup = 3;
  return c;
}

// -- verification ------------------------------------------------------------------

/// Element i of the data that rank `a` makes for purpose (or peer) `b`: every
/// value names its maker, so a misplaced block is caught, and sums stay exact.
float value(int a, int b, count_t i) {
  return static_cast<float>(a * 10000 + (b % 100) * 100 + (i % 100) + 1);
}

std::vector<float> values(int a, int b, count_t count) {
  std::vector<float> v(static_cast<std::size_t>(count));
  for (count_t i = 0; i < count; ++i) v[static_cast<std::size_t>(i)] = value(a, b, i);
  return v;
}

tensor make(int a, int b, count_t count) {
  return tensor::from_vector(values(a, b, count));
}

tensor zeros(count_t count) {
  return tensor::zeros({count}, troupe::dtype::float32);
}

/// Sum over ranks a of values(a, b, count).
std::vector<float> sum_over_ranks(int n, int b, count_t count) {
  std::vector<float> s(static_cast<std::size_t>(count), 0.f);
  for (int a = 0; a < n; ++a) {
    auto v = values(a, b, count);
    for (std::size_t i = 0; i < s.size(); ++i) s[i] += v[i];
  }
  return s;
}

/// Sum over ranks a of values(a, b, count), with b = the receiving rank.
std::vector<float> sum_for(int n, int receiver, count_t count) {
  return sum_over_ranks(n, receiver, count);
}

void append(std::vector<float>& to, const std::vector<float>& v) {
  to.insert(to.end(), v.begin(), v.end());
}

void expect(const std::string& what, const tensor& got, const std::vector<float>& want) {
  auto v = got.to_vector<float>();
  if (v.size() != want.size())
    throw std::runtime_error(what + ": result has " + std::to_string(v.size()) +
                             " elements, expected " + std::to_string(want.size()));
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] != want[i])
      throw std::runtime_error(what + ": element " + std::to_string(i) + " is " +
                               std::to_string(v[i]) + ", expected " + std::to_string(want[i]));
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

struct check {
  const char* name;
  std::function<void(world&, process_group&)> run;
};

constexpr count_t C = 13;  // odd, so that chunked algorithms get uneven chunks

/// counts[q] for the variable-size collectives: 1, 2, 0, 1, 2, 0, ... (zeros included).
std::vector<count_t> var_counts(int n) {
  std::vector<count_t> c;
  for (int q = 0; q < n; ++q) c.push_back((q + 1) % 3);
  return c;
}

count_t sum(const std::vector<count_t>& c) {
  count_t s = 0;
  for (auto x : c) s += x;
  return s;
}

/// Rows that rank a sends to rank b in the uneven alltoall_single (zeros included).
count_t rows(int a, int b) {
  return (a + 2 * b) % 3;
}

std::vector<check> checks() {
  std::vector<check> all;
  all.push_back({"broadcast", [](world&, process_group& pg) {
                   const int r = pg.rank(), root = pg.size() - 1;
                   auto t = r == root ? make(root, 1, C) : zeros(C);
                   pg.broadcast(t, root).wait();
                   expect("broadcast from root " + std::to_string(root), t, values(root, 1, C));
                 }});
  all.push_back({"allreduce", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank();
                   auto t = make(r, 2, C);
                   pg.allreduce(t).wait();
                   expect("allreduce SUM", t, sum_over_ranks(n, 2, C));
                   auto m = make(r, 3, C);
                   pg.allreduce(m, reduce_op::MAX).wait();
                   expect("allreduce MAX", m, values(n - 1, 3, C));
                 }});
  all.push_back({"allreduce_coalesced", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank();
                   auto a = make(r, 4, C);
                   auto b = make(r, 5, 5);
                   pg.allreduce_coalesced({a, b}).wait();
                   expect("allreduce_coalesced tensor 0", a, sum_over_ranks(n, 4, C));
                   expect("allreduce_coalesced tensor 1", b, sum_over_ranks(n, 5, 5));
                 }});
  all.push_back({"reduce", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank(), root = n / 2;
                   auto t = make(r, 6, C);
                   pg.reduce(t, root).wait();
                   if (r == root)
                     expect("reduce to root " + std::to_string(root), t, sum_over_ranks(n, 6, C));
                 }});
  all.push_back({"allgather", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank();
                   tensor_list outs;
                   for (int q = 0; q < n; ++q) outs.push_back(zeros(C));
                   pg.allgather(outs, make(r, 7, C)).wait();
                   for (int q = 0; q < n; ++q)
                     expect("allgather block of rank " + std::to_string(q),
                            outs[static_cast<std::size_t>(q)], values(q, 7, C));
                 }});
  all.push_back({"allgather_into_tensor", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank();
                   auto out = zeros(C * n);
                   pg.allgather_into_tensor(out, make(r, 8, C)).wait();
                   std::vector<float> want;
                   for (int q = 0; q < n; ++q) append(want, values(q, 8, C));
                   expect("allgather_into_tensor", out, want);
                 }});
  all.push_back({"allgather_coalesced", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank();
                   std::vector<tensor_list> outs;
                   for (int q = 0; q < n; ++q) outs.push_back({zeros(3), zeros(4)});
                   pg.allgather_coalesced(outs, {make(r, 9, 3), make(r, 10, 4)}).wait();
                   for (int q = 0; q < n; ++q) {
                     expect("allgather_coalesced tensor 0 of rank " + std::to_string(q),
                            outs[static_cast<std::size_t>(q)][0], values(q, 9, 3));
                     expect("allgather_coalesced tensor 1 of rank " + std::to_string(q),
                            outs[static_cast<std::size_t>(q)][1], values(q, 10, 4));
                   }
                 }});
  all.push_back(
      {"allgather_into_tensor_coalesced", [](world&, process_group& pg) {
         const int n = pg.size(), r = pg.rank();
         auto a = zeros(3 * n), b = zeros(5 * n);
         pg.allgather_into_tensor_coalesced({a, b}, {make(r, 11, 3), make(r, 12, 5)}).wait();
         std::vector<float> wa, wb;
         for (int q = 0; q < n; ++q) {
           append(wa, values(q, 11, 3));
           append(wb, values(q, 12, 5));
         }
         expect("allgather_into_tensor_coalesced tensor 0", a, wa);
         expect("allgather_into_tensor_coalesced tensor 1", b, wb);
       }});
  all.push_back({"gather", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank(), root = n - 1;
                   tensor_list outs;
                   if (r == root)
                     for (int q = 0; q < n; ++q) outs.push_back(zeros(C));
                   pg.gather(outs, make(r, 13, C), {.root_rank = root}).wait();
                   if (r == root)
                     for (int q = 0; q < n; ++q)
                       expect("gather block of rank " + std::to_string(q),
                              outs[static_cast<std::size_t>(q)], values(q, 13, C));
                 }});
  all.push_back({"scatter", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank(), root = n / 2;
                   tensor_list ins;
                   if (r == root)
                     for (int q = 0; q < n; ++q) ins.push_back(make(q, 14, C));
                   auto out = zeros(C);
                   pg.scatter(out, ins, {.root_rank = root}).wait();
                   expect("scatter from root " + std::to_string(root), out, values(r, 14, C));
                 }});
  all.push_back({"reduce_scatter", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank();
                   tensor_list ins;  // block q is rank r's contribution to rank q
                   for (int q = 0; q < n; ++q) ins.push_back(make(r, q, C));
                   auto out = zeros(C);
                   pg.reduce_scatter(out, ins).wait();
                   expect("reduce_scatter", out, sum_for(n, r, C));
                 }});
  all.push_back({"reduce_scatter_tensor", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank();
                   std::vector<float> in;
                   for (int q = 0; q < n; ++q) append(in, values(r, q, 7));
                   auto out = zeros(7);
                   pg.reduce_scatter_tensor(out, tensor::from_vector(in)).wait();
                   expect("reduce_scatter_tensor", out, sum_for(n, r, 7));
                 }});
  all.push_back({"reduce_scatter_tensor_coalesced", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank();
                   std::vector<float> a, b;
                   for (int q = 0; q < n; ++q) {
                     append(a, values(r, q, 3));
                     append(b, values(r, q + 50, 4));
                   }
                   auto oa = zeros(3), ob = zeros(4);
                   pg.reduce_scatter_tensor_coalesced(
                         {oa, ob}, {tensor::from_vector(a), tensor::from_vector(b)})
                       .wait();
                   expect("reduce_scatter_tensor_coalesced tensor 0", oa, sum_for(n, r, 3));
                   expect("reduce_scatter_tensor_coalesced tensor 1", ob, sum_for(n, r + 50, 4));
                 }});
  all.push_back({"alltoall", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank();
                   auto len = [](int a, int b) -> count_t { return (a + b) % 3 + 1; };
                   tensor_list ins, outs;
                   for (int q = 0; q < n; ++q) {
                     ins.push_back(make(r, q, len(r, q)));
                     outs.push_back(zeros(len(q, r)));
                   }
                   pg.alltoall(outs, ins).wait();
                   for (int q = 0; q < n; ++q)
                     expect("alltoall block from rank " + std::to_string(q),
                            outs[static_cast<std::size_t>(q)], values(q, r, len(q, r)));
                 }});
  all.push_back({"alltoall_single", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank();
                   // Equal splits: block q of the input goes to rank q.
                   std::vector<float> in, want;
                   for (int q = 0; q < n; ++q) {
                     append(in, values(r, q, 2));
                     append(want, values(q, r, 2));
                   }
                   auto out = zeros(2 * n);
                   pg.alltoall_single(out, tensor::from_vector(in)).wait();
                   expect("alltoall_single (equal splits)", out, want);
                   // Uneven splits of 2-column rows, some of them empty.
                   std::vector<float> uin, uwant;
                   std::vector<count_t> in_splits, out_splits;
                   for (int q = 0; q < n; ++q) {
                     append(uin, values(r, q, 2 * rows(r, q)));
                     append(uwant, values(q, r, 2 * rows(q, r)));
                     in_splits.push_back(rows(r, q));
                     out_splits.push_back(rows(q, r));
                   }
                   auto input = tensor::from_vector(uin).view({sum(in_splits), 2});
                   auto output = tensor::zeros({sum(out_splits), 2}, troupe::dtype::float32);
                   pg.alltoall_single(output, input, out_splits, in_splits).wait();
                   expect("alltoall_single (uneven splits)", output, uwant);
                 }});
  all.push_back(
      {"allgatherv", [](world&, process_group& pg) {
         const int n = pg.size(), r = pg.rank();
         auto counts = var_counts(n);
         auto out = zeros(sum(counts));
         pg.allgatherv(out, make(r, 15, counts[static_cast<std::size_t>(r)]), counts).wait();
         std::vector<float> want;
         for (int q = 0; q < n; ++q)
           append(want, values(q, 15, counts[static_cast<std::size_t>(q)]));
         expect("allgatherv", out, want);
       }});
  all.push_back({"gatherv", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank(), root = n - 1;
                   auto counts = var_counts(n);
                   auto out = r == root ? zeros(sum(counts)) : tensor{};
                   pg.gatherv(out, make(r, 16, counts[static_cast<std::size_t>(r)]), counts,
                              {.root_rank = root})
                       .wait();
                   if (r != root) return;
                   std::vector<float> want;
                   for (int q = 0; q < n; ++q)
                     append(want, values(q, 16, counts[static_cast<std::size_t>(q)]));
                   expect("gatherv to root " + std::to_string(root), out, want);
                 }});
  all.push_back({"scatterv", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank(), root = n / 2;
                   auto counts = var_counts(n);
                   tensor in;
                   if (r == root) {
                     std::vector<float> v;
                     for (int q = 0; q < n; ++q)
                       append(v, values(q, 17, counts[static_cast<std::size_t>(q)]));
                     in = tensor::from_vector(v);
                   }
                   auto out = zeros(counts[static_cast<std::size_t>(r)]);
                   pg.scatterv(out, in, counts, {.root_rank = root}).wait();
                   expect("scatterv from root " + std::to_string(root), out,
                          values(r, 17, counts[static_cast<std::size_t>(r)]));
                 }});
  all.push_back({"reduce_scatterv", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank();
                   auto counts = var_counts(n);
                   std::vector<float> in;
                   for (int q = 0; q < n; ++q)
                     append(in, values(r, q, counts[static_cast<std::size_t>(q)]));
                   auto out = zeros(counts[static_cast<std::size_t>(r)]);
                   pg.reduce_scatterv(out, tensor::from_vector(in), counts).wait();
                   expect("reduce_scatterv", out,
                          sum_for(n, r, counts[static_cast<std::size_t>(r)]));
                 }});
  all.push_back({"barrier", [](world&, process_group& pg) {
                   pg.barrier().wait();
                   pg.monitored_barrier({.timeout = std::chrono::seconds(30)}).wait();
                 }});
  all.push_back({"send/recv ring", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank();
                   if (n == 1) return;  // sending to oneself is refused
                   const int right = (r + 1) % n, left = (r + n - 1) % n;
                   auto buf = zeros(C);
                   auto rw = pg.recv(buf, left);
                   auto sw = pg.send(make(r, 18, C), right);
                   sw.wait();
                   rw.wait();
                   expect("recv from rank " + std::to_string(left), buf, values(left, 18, C));
                 }});
  all.push_back({"batch_isend_irecv", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank();
                   if (n == 1) return;
                   const int right = (r + 1) % n, left = (r + n - 1) % n;
                   auto from_left = zeros(C), from_right = zeros(C);
                   // Tag 1 travels rightwards, tag 2 leftwards (left == right when n == 2).
                   pg.batch_isend_irecv({{troupe::p2p_op::isend, make(r, 19, C), right, 1},
                                         {troupe::p2p_op::isend, make(r, 20, C), left, 2},
                                         {troupe::p2p_op::irecv, from_left, left, 1},
                                         {troupe::p2p_op::irecv, from_right, right, 2}})
                       .wait();
                   expect("batch_isend_irecv from the left", from_left, values(left, 19, C));
                   expect("batch_isend_irecv from the right", from_right, values(right, 20, C));
                 }});
  all.push_back({"recv_any_source", [](world&, process_group& pg) {
                   const int n = pg.size(), r = pg.rank();
                   if (n == 1) return;
                   if (r != 0) {
                     pg.send(make(r, 21, 4), 0, 3).wait();
                     return;
                   }
                   std::set<int> seen;
                   for (int i = 1; i < n; ++i) {
                     auto buf = zeros(4);
                     auto w = pg.recv_any_source(buf, 3);
                     w.wait();
                     const int src = w.source_rank();
                     expect(src >= 1 && src < n && seen.insert(src).second,
                            "recv_any_source: unexpected source rank " + std::to_string(src));
                     expect("recv_any_source from rank " + std::to_string(src), buf,
                            values(src, 21, 4));
                   }
                 }});
  all.push_back({"new_group (members and non-members)", [](world& w, process_group&) {
                   const int n = w.size(), r = w.rank();
                   std::vector<int> evens;
                   for (int q = 0; q < n; q += 2) evens.push_back(q);
                   auto sub = w.new_group(evens);
                   auto t = make(r, 22, C);
                   if (sub->is_member()) {
                     sub->allreduce(t).wait();
                     std::vector<float> want(static_cast<std::size_t>(C), 0.f);
                     for (int q : evens) {
                       auto v = values(q, 22, C);
                       for (std::size_t i = 0; i < want.size(); ++i) want[i] += v[i];
                     }
                     expect("allreduce on the even ranks", t, want);
                   } else {
                     bool refused = false;
                     try {
                       sub->allreduce(t).wait();
                     } catch (const troupe::error& e) {
                       refused = e.code() == troupe::errc::group;
                     }
                     expect(refused, "a non-member's allreduce was not refused with errc::group");
                   }
                   w.destroy_process_group(sub);
                 }});
  return all;
}

// -- timing -------------------------------------------------------------------------

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

/// One row of the table: the per-rank times of every timed iteration.
struct row {
  std::string op;
  double bus_factor = 1.0;
  std::size_t bytes = 0;
  std::vector<std::vector<double>> us;  // [rank][iteration]
};

/// What every rank times, in the same order (rows are filled by all ranks,
/// each writing only its own slot).
struct plan {
  std::vector<std::size_t> sizes;
  std::vector<row> rows;
};

plan make_plan(const config& c) {
  plan p;
  p.sizes = {4, 1024, 64 * 1024, 1024 * 1024};
  if (!c.quick) p.sizes.push_back(16 * 1024 * 1024);
  const int n = c.ranks;
  auto add = [&](const std::string& op, double f, std::size_t bytes) {
    row r;
    r.op = op;
    r.bus_factor = f;
    r.bytes = bytes;
    r.us.assign(static_cast<std::size_t>(n),
                std::vector<double>(static_cast<std::size_t>(c.iters)));
    p.rows.push_back(std::move(r));
  };
  add("barrier", 0.0, 0);
  for (auto& op : bench_ops()) {
    if (n == 1 && std::string(op.name).rfind("sendrecv", 0) == 0) continue;
    for (auto s : p.sizes) {
      count_t elems = static_cast<count_t>(s / sizeof(float));
      if (op.per_rank_blocks) elems = std::max<count_t>(1, elems / n) * n;
      add(op.name, op.bus_factor(n), static_cast<std::size_t>(elems) * sizeof(float));
    }
  }
  return p;
}

/// Times `call` on this rank: a barrier lines the ranks up before each iteration.
void time_iterations(process_group& pg, const config& c, const std::function<troupe::work()>& call,
                     std::vector<double>& out) {
  using clock = std::chrono::steady_clock;
  for (int it = 0; it < c.warmup + c.iters; ++it) {
    pg.barrier().wait();
    auto t0 = clock::now();
    call().wait();
    auto t1 = clock::now();
    if (it >= c.warmup)
      out[static_cast<std::size_t>(it - c.warmup)] =
          std::chrono::duration<double, std::micro>(t1 - t0).count();
  }
}

void run_benchmarks(world& w, const config& c, plan& p) {
  auto& pg = w.default_group();
  const auto me = static_cast<std::size_t>(w.rank());
  std::size_t next = 0;
  time_iterations(
      pg, c, [&pg] { return pg.barrier(); }, p.rows[next++].us[me]);
  for (auto& op : bench_ops()) {
    if (c.ranks == 1 && std::string(op.name).rfind("sendrecv", 0) == 0) continue;
    for (std::size_t i = 0; i < p.sizes.size(); ++i) {
      auto& r = p.rows[next++];
      count_t elems = static_cast<count_t>(r.bytes / sizeof(float));
      if (op.per_rank_blocks) elems /= c.ranks;
      auto call = op.prepare(pg, elems);
      time_iterations(pg, c, call, r.us[me]);
    }
  }
  pg.barrier().wait();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

void print_table(const config& c, const plan& p) {
  std::printf("\n%-24s %10s %12s %12s %12s\n", "op", "bytes", "time (us)", "algbw (GB/s)",
              "busbw (GB/s)");
  for (auto& r : p.rows) {
    // Time of an iteration = the slowest rank's; the row shows the median over iterations.
    std::vector<double> per_iter(static_cast<std::size_t>(c.iters), 0.0);
    for (auto& rank_times : r.us)
      for (std::size_t i = 0; i < per_iter.size(); ++i)
        per_iter[i] = std::max(per_iter[i], rank_times[i]);
    const double us = median(per_iter);
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

}  // namespace

int main(int argc, char** argv) {
  config c;
  try {
    c = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "troupe-demo: " << e.what() << "\n";
    usage(argv[0], std::cerr);
    return 2;
  }
  std::printf("troupe-demo: %d in-process ranks, backend \"actor\"%s\n", c.ranks,
              c.quick ? ", quick" : "");

  troupe::testing::run_options opts;
  opts.timeout = std::chrono::seconds(120);

  // 1. Every collective once, checked against values computed locally.
  const auto all = checks();
  try {
    troupe::testing::run_ranks(
        c.ranks,
        [&](world& w) {
          for (auto& ch : all) {
            try {
              ch.run(w, w.default_group());
            } catch (const std::exception& e) {
              throw std::runtime_error(std::string(ch.name) + ": " + e.what());
            }
          }
        },
        opts);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "verification FAILED: %s\n", e.what());
    return 1;
  }
  for (auto& ch : all) std::printf("  ok  %s\n", ch.name);
  std::printf("verification: all collectives correct (%zu checks on %d ranks)\n", all.size(),
              c.ranks);
  std::fflush(stdout);

  // 2. Timing.
  auto p = make_plan(c);
  try {
    troupe::testing::run_ranks(
        c.ranks, [&](world& w) { run_benchmarks(w, c, p); }, opts);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "timing FAILED: %s\n", e.what());
    return 1;
  }
  print_table(c, p);
  return 0;
}
