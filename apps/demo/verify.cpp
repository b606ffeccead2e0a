// Verification of troupe-demo (see verify.hpp): the checks, one per
// collective, and the loop that runs them and agrees on their outcome.

#include "demo/verify.hpp"

#include <cstdint>
#include <cstdio>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/troupe.hpp"

namespace demo {
namespace {

using troupe::process_group;
using troupe::reduce_op;
using troupe::tensor;
using troupe::tensor_list;
using troupe::world;
using count_t = std::int64_t;

/// A wrong result (as opposed to an error of the library).
struct wrong_result : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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
    throw wrong_result(what + ": result has " + std::to_string(v.size()) + " elements, expected " +
                       std::to_string(want.size()));
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] != want[i])
      throw wrong_result(what + ": element " + std::to_string(i) + " is " + std::to_string(v[i]) +
                         ", expected " + std::to_string(want[i]));
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw wrong_result(what);
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

}  // namespace

std::size_t check_count() {
  return checks().size();
}

int verify(world& w) {
  auto& pg = w.default_group();
  int failed = 0;
  for (auto& ch : checks()) {
    auto wrong = tensor::zeros({1}, troupe::dtype::int32);
    try {
      ch.run(w, pg);
    } catch (const wrong_result& e) {
      std::fprintf(stderr, "verification FAILED on rank %d: %s: %s\n", w.rank(), ch.name, e.what());
      std::fflush(stderr);
      wrong.data_as<std::int32_t>()[0] = 1;
    } catch (const troupe::error& e) {
      throw troupe::error(e.code(), std::string(ch.name) + ": " + e.what());
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string(ch.name) + ": " + e.what());
    }
    pg.allreduce(wrong).wait();  // how many ranks got a wrong result
    const int ranks_wrong = wrong.data_as<std::int32_t>()[0];
    if (ranks_wrong > 0) ++failed;
    if (w.rank() == 0) {
      if (ranks_wrong == 0)
        std::printf("  ok  %s\n", ch.name);
      else
        std::printf("  FAILED %s (on %d of %d ranks)\n", ch.name, ranks_wrong, w.size());
      std::fflush(stdout);
    }
  }
  return failed;
}

}  // namespace demo
