// The "nccl" backend on cuda tensors. NCCL refuses two ranks on one GPU, so
// every case runs one-rank groups on cuda:0: each call and variant against the
// reference on random data (several local tensors make the reductions
// non-trivial), several groups at once, many calls in flight, the dtype rules
// and the error paths. Without a CUDA device the suite is skipped (gpu_main.cpp).

#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "check_error.hpp"
#include "reference.hpp"
#include "troupe/testing.hpp"

using namespace troupe;
using troupe::test::check_error;

namespace {

/// Runs `fn` on one rank whose cuda tensors go to the nccl backend.
void one_rank(const std::function<void(world&)>& fn) {
  testing::run_ranks(1, fn, {.backend = "cpu:actor,cuda:nccl"});
}

tensor to_gpu(const tensor& cpu) {
  auto g = tensor::empty(cpu.shape(), cpu.scalar_type(), device::cuda(0));
  g.copy_from(cpu);
  return g;
}

tensor to_cpu(const tensor& gpu) {
  auto c = tensor::empty(gpu.shape(), gpu.scalar_type());
  c.copy_from(gpu);
  return c;
}

/// Random values and a cuda:0 tensor holding them.
struct sample {
  ref::values v;
  tensor t;
};

sample random_on_gpu(dtype t, std::int64_t n, int salt, reduce_op::kind op = reduce_op::SUM,
                     shape_t shape = {}) {
  auto v = ref::random_values(t, n, static_cast<std::uint64_t>(salt), op);
  return {v, to_gpu(ref::make(t, v, shape))};
}

tensor gpu_empty(dtype t, std::int64_t n) {
  return tensor::empty({n}, t, device::cuda(0));
}

void check(const tensor& gpu, const ref::values& expected, const std::string& what) {
  ref::check_close(to_cpu(gpu), expected, what);
}

std::string name(const char* op, dtype t, const std::string& more = "") {
  return std::string(op) + " " + std::string(to_string(t)) + (more.empty() ? "" : " " + more);
}

/// Every dtype NCCL carries: all but int16.
std::vector<dtype> nccl_dtypes() {
  std::vector<dtype> r;
  for (int i = 0; i < dtype_count; ++i)
    if (static_cast<dtype>(i) != dtype::int16) r.push_back(static_cast<dtype>(i));
  return r;
}

/// The reductions the nccl backend runs on `t`.
std::vector<reduce_op> nccl_ops(dtype t) {
  std::vector<reduce_op> r;
  for (auto k :
       {reduce_op::SUM, reduce_op::AVG, reduce_op::PRODUCT, reduce_op::MIN, reduce_op::MAX})
    if (is_reduce_supported(k, t) && !(is_complex(t) && k == reduce_op::PRODUCT)) r.push_back(k);
  if (is_reduce_supported(reduce_op::PREMUL_SUM, t)) r.push_back(reduce_op::premul_sum(0.5));
  return r;
}

const dtype move_dtypes[] = {dtype::float32,  dtype::int64,     dtype::uint8,
                             dtype::bfloat16, dtype::complex64, dtype::bool_};

}  // namespace

TEST_CASE("nccl: allreduce, reduce and broadcast of one tensor, every dtype and op") {
  one_rank([](world& w) {
    auto& pg = w.default_group();
    for (auto t : nccl_dtypes())
      for (std::int64_t n : {0, 37}) {
        for (auto& op : nccl_ops(t)) {
          auto x = random_on_gpu(t, n, int(t) + 1, op.op());
          pg.allreduce(x.t, op).wait();
          check(x.t, ref::reduce({x.v}, op, t), name("allreduce", t, op.to_string()));
          auto y = random_on_gpu(t, n, int(t) + 2, op.op());
          pg.reduce(y.t, 0, op).wait();
          check(y.t, ref::reduce({y.v}, op, t), name("reduce", t, op.to_string()));
        }
        auto b = random_on_gpu(t, n, int(t) + 3);
        pg.broadcast(b.t, 0).wait();
        check(b.t, b.v, name("broadcast", t));
      }
  });
}

TEST_CASE("nccl: several local tensors are combined before the NCCL call") {
  one_rank([](world& w) {
    auto& pg = w.default_group();
    for (auto t : {dtype::float32, dtype::float64, dtype::bfloat16, dtype::int64, dtype::bool_,
                   dtype::complex128})
      for (auto& op : nccl_ops(t)) {
        auto a = random_on_gpu(t, 19, 1, op.op()), b = random_on_gpu(t, 19, 2, op.op()),
             c = random_on_gpu(t, 19, 3, op.op());
        // AVG divides by size × tensors (3), as the reference's default.
        const auto all = ref::reduce({a.v, b.v, c.v}, op, t);
        pg.allreduce(tensor_list{a.t, b.t, c.t}, {.op = op}).wait();
        for (auto* s : {&a, &b, &c}) check(s->t, all, name("allreduce x3", t, op.to_string()));
        // reduce writes the root tensor only.
        auto x = random_on_gpu(t, 19, 4, op.op()), y = random_on_gpu(t, 19, 5, op.op());
        pg.reduce(tensor_list{x.t, y.t}, {.op = op, .root_rank = 0, .root_tensor = 1}).wait();
        check(y.t, ref::reduce({x.v, y.v}, op, t), name("reduce x2", t, op.to_string()));
        check(x.t, x.v, name("reduce x2 (other tensor untouched)", t, op.to_string()));
      }
    auto a = random_on_gpu(dtype::int32, 7, 6), b = random_on_gpu(dtype::int32, 7, 7),
         c = random_on_gpu(dtype::int32, 7, 8);
    pg.broadcast(tensor_list{a.t, b.t, c.t}, {.root_rank = 0, .root_tensor = 2}).wait();
    for (auto* s : {&a, &b, &c}) check(s->t, c.v, "broadcast x3 from tensor 2");
  });
}

TEST_CASE("nccl: allreduce_coalesced reduces tensors of different sizes in one group") {
  one_rank([](world& w) {
    const std::int64_t lens[] = {3, 0, 9, 1};
    for (auto [t, op] : {std::pair{dtype::int64, reduce_op(reduce_op::MAX)},
                         std::pair{dtype::float32, reduce_op::premul_sum(0.25)}}) {
      std::vector<sample> xs;
      tensor_list ts;
      for (int i = 0; i < 4; ++i) {
        xs.push_back(random_on_gpu(t, lens[i], 10 + i));
        ts.push_back(xs.back().t);
      }
      w.default_group().allreduce_coalesced(ts, {.op = op}).wait();
      for (auto& x : xs) check(x.t, ref::reduce({x.v}, op, t), name("allreduce_coalesced", t));
    }
  });
}

TEST_CASE("nccl: allgather and its variants deliver every input") {
  one_rank([](world& w) {
    auto& pg = w.default_group();
    for (auto t : move_dtypes) {
      auto x = random_on_gpu(t, 11, 20), y = random_on_gpu(t, 4, 21);
      auto o = gpu_empty(t, 11), p = gpu_empty(t, 4);
      pg.allgather(tensor_list{o}, x.t).wait();
      check(o, x.v, name("allgather", t));
      o = gpu_empty(t, 11);
      pg.allgather(std::vector<tensor_list>{{o}, {p}}, tensor_list{x.t, y.t}).wait();
      check(o, x.v, name("allgather of two inputs (first)", t));
      check(p, y.v, name("allgather of two inputs (second)", t));
      o = gpu_empty(t, 11), p = gpu_empty(t, 4);
      pg.allgather_coalesced(std::vector<tensor_list>{{o, p}}, tensor_list{x.t, y.t}).wait();
      check(o, x.v, name("allgather_coalesced (first)", t));
      check(p, y.v, name("allgather_coalesced (second)", t));
      o = gpu_empty(t, 11), p = gpu_empty(t, 4);
      pg.allgather_into_tensor(o, x.t).wait();
      check(o, x.v, name("allgather_into_tensor", t));
      o = gpu_empty(t, 11);
      pg.allgather_into_tensor_coalesced(tensor_list{o, p}, tensor_list{x.t, y.t}).wait();
      check(o, x.v, name("allgather_into_tensor_coalesced (first)", t));
      check(p, y.v, name("allgather_into_tensor_coalesced (second)", t));
      o = gpu_empty(t, 11);
      pg.allgatherv(o, x.t, {11}).wait();
      check(o, x.v, name("allgatherv", t));
    }
  });
}

TEST_CASE("nccl: gather, scatter and their v-forms move whole blocks") {
  one_rank([](world& w) {
    auto& pg = w.default_group();
    for (auto t : move_dtypes) {
      auto x = random_on_gpu(t, 13, 30);
      auto o = gpu_empty(t, 13);
      pg.gather(tensor_list{o}, x.t).wait();
      check(o, x.v, name("gather", t));
      o = gpu_empty(t, 13);
      pg.scatter(o, tensor_list{x.t}).wait();
      check(o, x.v, name("scatter", t));
      o = gpu_empty(t, 13);
      pg.gatherv(o, x.t, {13}).wait();
      check(o, x.v, name("gatherv", t));
      o = gpu_empty(t, 13);
      pg.scatterv(o, x.t, {13}).wait();
      check(o, x.v, name("scatterv", t));
    }
  });
}

TEST_CASE("nccl: reduce_scatter and its variants reduce every block") {
  one_rank([](world& w) {
    auto& pg = w.default_group();
    for (auto [t, op] : {std::pair{dtype::float32, reduce_op(reduce_op::SUM)},
                         std::pair{dtype::float64, reduce_op::premul_sum(0.5)},
                         std::pair{dtype::int32, reduce_op(reduce_op::MAX)},
                         std::pair{dtype::complex64, reduce_op(reduce_op::AVG)},
                         std::pair{dtype::bool_, reduce_op(reduce_op::SUM)}}) {
      auto x = random_on_gpu(t, 9, 40), y = random_on_gpu(t, 5, 41);
      const auto rx = ref::reduce({x.v}, op, t), ry = ref::reduce({y.v}, op, t);
      auto o = gpu_empty(t, 9), p = gpu_empty(t, 5);
      pg.reduce_scatter(o, tensor_list{x.t}, {.op = op}).wait();
      check(o, rx, name("reduce_scatter", t, op.to_string()));
      o = gpu_empty(t, 9);
      pg.reduce_scatter_tensor(o, x.t, {.op = op}).wait();
      check(o, rx, name("reduce_scatter_tensor", t, op.to_string()));
      o = gpu_empty(t, 9);
      pg.reduce_scatter_tensor_coalesced(tensor_list{o, p}, tensor_list{x.t, y.t}, {.op = op})
          .wait();
      check(o, rx, name("reduce_scatter_tensor_coalesced (first)", t, op.to_string()));
      check(p, ry, name("reduce_scatter_tensor_coalesced (second)", t, op.to_string()));
      o = gpu_empty(t, 9);
      pg.reduce_scatterv(o, x.t, {9}, {.op = op}).wait();
      check(o, rx, name("reduce_scatterv", t, op.to_string()));
    }
  });
}

TEST_CASE("nccl: alltoall and alltoall_single exchange blocks") {
  one_rank([](world& w) {
    auto& pg = w.default_group();
    for (auto t : move_dtypes) {
      auto x = random_on_gpu(t, 12, 50, reduce_op::SUM, {4, 3});
      auto o = tensor::empty({4, 3}, t, device::cuda(0));
      pg.alltoall_single(o, x.t).wait();
      check(o, x.v, name("alltoall_single", t));
      o = tensor::empty({4, 3}, t, device::cuda(0));
      pg.alltoall_single(o, x.t, {4}, {4}).wait();
      check(o, x.v, name("alltoall_single with splits", t));
      auto y = random_on_gpu(t, 6, 51);
      auto p = gpu_empty(t, 6);
      pg.alltoall(tensor_list{p}, tensor_list{y.t}).wait();
      check(p, y.v, name("alltoall", t));
    }
  });
}

TEST_CASE("nccl: barrier, name and sequence numbers") {
  one_rank([](world& w) {
    auto& nccl = w.default_group().get_backend(device_type::cuda);
    CHECK(nccl.name() == "nccl");
    const auto before = nccl.sequence_number();
    auto x = random_on_gpu(dtype::float32, 3, 60);
    auto a = w.default_group().allreduce(x.t);
    auto b = nccl.barrier({});
    a.wait();
    b.wait();
    CHECK(b.sequence_number() == a.sequence_number() + 1);
    CHECK(nccl.sequence_number() == before + 2);
  });
}

TEST_CASE("nccl: several groups at once, used alternately") {
  one_rank([](world& w) {
    std::vector<std::shared_ptr<process_group>> groups{w.new_group({0}), w.new_group({0}),
                                                       w.new_group({0})};
    std::vector<sample> xs;
    std::vector<work> done;
    for (int i = 0; i < 30; ++i) {
      xs.push_back(random_on_gpu(dtype::float32, 17, 70 + i));
      done.push_back(groups[std::size_t(i % 3)]->allreduce(xs.back().t, reduce_op::premul_sum(i)));
    }
    for (auto& d : done) d.wait();
    for (int i = 0; i < 30; ++i)
      check(xs[std::size_t(i)].t,
            ref::reduce({xs[std::size_t(i)].v}, reduce_op::premul_sum(i), dtype::float32),
            "group " + std::to_string(i % 3) + " call " + std::to_string(i));
    for (auto& g : groups) CHECK(g->get_backend(device_type::cuda).sequence_number() == 10);
  });
}

TEST_CASE("nccl: 200 allreduces in flight complete in order with the right values") {
  one_rank([](world& w) {
    auto& pg = w.default_group();
    std::vector<sample> xs;
    std::vector<work> done;
    for (int i = 0; i < 200; ++i) {
      xs.push_back(random_on_gpu(dtype::float64, 1 + i % 5 * 100, 100 + i));
      done.push_back(pg.allreduce(xs.back().t, reduce_op::premul_sum(1 + i % 7)));
    }
    for (std::size_t i = 0; i < done.size(); ++i) {
      done[i].wait();
      if (i > 0) CHECK(done[i].sequence_number() == done[i - 1].sequence_number() + 1);
      check(xs[i].t, ref::reduce({xs[i].v}, reduce_op::premul_sum(1 + int(i) % 7), dtype::float64),
            "call " + std::to_string(i));
    }
  });
}

TEST_CASE("nccl: bool travels as uint8 with SUM as or and PRODUCT as and") {
  one_rank([](world& w) {
    auto& pg = w.default_group();
    const ref::values a{1, 0, 1, 0}, b{1, 1, 0, 0};
    for (auto [op, want] : {std::pair{reduce_op::SUM, ref::values{1, 1, 1, 0}},
                            std::pair{reduce_op::PRODUCT, ref::values{1, 0, 0, 0}},
                            std::pair{reduce_op::MAX, ref::values{1, 1, 1, 0}},
                            std::pair{reduce_op::MIN, ref::values{1, 0, 0, 0}}}) {
      auto x = to_gpu(ref::make(dtype::bool_, a)), y = to_gpu(ref::make(dtype::bool_, b));
      pg.allreduce(tensor_list{x, y}, {.op = op}).wait();
      check(x, want, std::string("bool ") + to_string(op));
      check(y, want, std::string("bool ") + to_string(op));
    }
  });
}

TEST_CASE("nccl: dtypes and ops without an NCCL form are refused clearly") {
  one_rank([](world& w) {
    auto& pg = w.default_group();
    auto s = gpu_empty(dtype::int16, 4);
    check_error([&] { pg.allreduce(s).wait(); }, errc::invalid_argument,
                {"allreduce", "not supported for NCCL", "int16"});
    check_error([&] { pg.broadcast(s).wait(); }, errc::invalid_argument,
                {"broadcast", "not supported for NCCL", "int16"});
    check_error([&] { pg.allgather_into_tensor(gpu_empty(dtype::int16, 4), s).wait(); },
                errc::invalid_argument, {"allgather_into_tensor", "int16"});
    auto i = random_on_gpu(dtype::int32, 4, 80).t;
    check_error([&] { pg.allreduce(i, reduce_op::BAND).wait(); }, errc::invalid_argument,
                {"allreduce", "Cannot use ReduceOp.BAND with NCCL"});
    check_error([&] { pg.allreduce(i, reduce_op::BOR).wait(); }, errc::invalid_argument,
                {"allreduce", "Cannot use ReduceOp.BOR with NCCL"});
    check_error(
        [&] {
          pg.reduce_scatter_tensor(gpu_empty(dtype::int32, 4), i, {.op = reduce_op::BXOR}).wait();
        },
        errc::invalid_argument, {"reduce_scatter_tensor", "Cannot use ReduceOp.BXOR with NCCL"});
    auto z = random_on_gpu(dtype::complex64, 4, 81).t;
    check_error([&] { pg.allreduce(z, reduce_op::PRODUCT).wait(); }, errc::invalid_argument,
                {"allreduce", "PRODUCT", "complex64", "NCCL"});
    // The refusals issued nothing: the group still works.
    auto x = random_on_gpu(dtype::float32, 4, 82);
    pg.allreduce(x.t).wait();
    check(x.t, x.v, "allreduce after the refusals");
  });
}

TEST_CASE("nccl: recv_any_source and monitored_barrier are not supported") {
  one_rank([](world& w) {
    auto& pg = w.default_group();
    check_error([&] { pg.recv_any_source(gpu_empty(dtype::float32, 2)).wait(); }, errc::backend,
                {"backend 'nccl' does not support recv_any_source"});
    check_error([&] { pg.get_backend(device_type::cuda).monitored_barrier({}).wait(); },
                errc::backend, {"backend 'nccl' does not support monitored_barrier"});
  });
}

TEST_CASE("nccl: after abort every call fails at once, naming the group") {
  one_rank([](world& w) {
    auto used = w.new_group({0});
    auto x = random_on_gpu(dtype::float32, 8, 90);
    used->allreduce(x.t).wait();  // its communicator exists
    auto unused = w.new_group({0});
    for (auto& g : {used, unused}) {
      g->abort("test abort");
      auto late = g->allreduce(x.t);
      CHECK(late.is_completed());
      check_error([&] { late.wait(); }, errc::aborted, {"allreduce", g->name(), "test abort"});
      check_error([&] { g->get_backend(device_type::cuda).barrier({}).wait(); }, errc::aborted,
                  {"barrier", g->name(), "test abort"});
    }
    // Other groups are untouched.
    w.default_group().allreduce(x.t).wait();
    check(x.t, x.v, "allreduce on the default group after the others aborted");
  });
}

TEST_CASE("nccl: a call on another device than the group's first is refused") {
  if (cuda_device_count() < 2) return;  // needs two GPUs
  one_rank([](world& w) {
    auto& pg = w.default_group();
    auto x = random_on_gpu(dtype::float32, 4, 95);
    pg.allreduce(x.t).wait();
    auto other = tensor::empty({4}, dtype::float32, device::cuda(1));
    check_error([&] { pg.allreduce(other).wait(); }, errc::invalid_argument,
                {"allreduce", "cuda:0", "cuda:1"});
  });
}
