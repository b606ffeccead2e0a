// The bridge's C++ side: at::Tensor <-> troupe::tensor without a copy, c10d
// stores as troupe stores, and ProcessGroupTroupe's works and futures, on
// ranks in one process (and, under troupe-run, in several).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "troupe_torch/doctest.hpp"  // after the torch headers, before check_error.hpp

#include "check_error.hpp"
#include "troupe/testing.hpp"
#include "troupe_torch/process_group.hpp"
#include "troupe_torch/store.hpp"
#include "troupe_torch/tensor.hpp"

using troupe::errc;
using troupe::test::check_error;
using namespace troupe_torch;

namespace {

struct pair_t {
  c10::ScalarType torch;
  troupe::dtype ours;
};
const std::vector<pair_t> every_dtype = {
    {at::kBool, troupe::dtype::bool_},
    {at::kByte, troupe::dtype::uint8},
    {at::kChar, troupe::dtype::int8},
    {at::kShort, troupe::dtype::int16},
    {at::kInt, troupe::dtype::int32},
    {at::kLong, troupe::dtype::int64},
    {at::kHalf, troupe::dtype::float16},
    {at::kBFloat16, troupe::dtype::bfloat16},
    {at::kFloat, troupe::dtype::float32},
    {at::kDouble, troupe::dtype::float64},
    {at::kComplexFloat, troupe::dtype::complex64},
    {at::kComplexDouble, troupe::dtype::complex128},
};

at::Tensor sample(c10::ScalarType t) {
  auto x = at::arange(12, at::kDouble).reshape({3, 4}).remainder(5);
  return x.to(t);
}

troupe::testing::run_options quick() {
  troupe::testing::run_options o;
  o.timeout = std::chrono::seconds(30);
  return o;
}

/// A ProcessGroupTroupe over the rank's default group (the world stays the caller's).
c10::intrusive_ptr<ProcessGroupTroupe> bridge(troupe::world& w) {
  return c10::make_intrusive<ProcessGroupTroupe>(
      std::shared_ptr<troupe::process_group>(std::shared_ptr<void>{}, &w.default_group()));
}

}  // namespace

// -- tensors ----------------------------------------------------------------------------------

TEST_CASE("every dtype both sides have crosses both ways without a copy") {
  at::set_num_threads(1);
  for (auto [t, ours] : every_dtype) {
    CAPTURE(c10::toString(t));
    auto a = sample(t);
    auto x = to_troupe(a);
    CHECK(x.scalar_type() == ours);
    CHECK(x.data() == a.data_ptr());
    CHECK(x.shape() == troupe::shape_t{3, 4});
    CHECK(x.is_contiguous());
    auto back = to_torch(x);
    CHECK((back.scalar_type() == t));  // (doctest cannot print a ScalarType)
    CHECK(back.data_ptr() == a.data_ptr());
    CHECK(back.sizes() == a.sizes());
    CHECK(at::equal(back, a));
    // The other way: troupe's memory seen by torch.
    auto y = troupe::tensor::zeros({2, 3}, ours);
    auto ty = to_torch(y);
    CHECK(ty.data_ptr() == y.data());
    CHECK((ty.scalar_type() == t));
    ty.fill_(1);
    CHECK(at::equal(to_torch(y), at::ones({2, 3}, t)));
  }
}

TEST_CASE("converted tensors keep the memory alive and share writes") {
  troupe::tensor x;
  {
    auto a = at::full({1000}, 7.0f);
    x = to_troupe(a);
  }  // the at::Tensor is gone; troupe's handle still owns the storage
  CHECK(x.to_vector<float>() == std::vector<float>(1000, 7.0f));
  at::Tensor b;
  {
    auto y = troupe::tensor::from_vector<std::int64_t>({1, 2, 3});
    b = to_torch(y);
  }
  CHECK(b.equal(at::tensor({1, 2, 3}, at::kLong)));
  auto c = at::zeros({4});
  auto cx = to_troupe(c);
  cx.data_as<float>()[2] = 5.0f;
  CHECK(c[2].item<float>() == 5.0f);
}

TEST_CASE("strides cross as they are; collectives' conversion refuses a non-contiguous tensor") {
  auto a = at::arange(6, at::kFloat).reshape({2, 3}).t();
  auto x = to_troupe(a);
  CHECK_FALSE(x.is_contiguous());
  CHECK(x.strides() == troupe::shape_t{1, 3});
  CHECK(to_torch(x).equal(a));
  check_error([&] { to_troupe_dense(a, "allreduce", "tensor 0"); }, errc::invalid_argument,
              {"allreduce: tensor 0", "not contiguous", "[3, 2]", "strides [1, 3]"});
}

TEST_CASE("a tensor troupe cannot take is refused naming what it is") {
  check_error([] { to_troupe(at::zeros({2}, at::kComplexHalf)); }, errc::invalid_argument,
              {"ComplexHalf", "does not support"});
  check_error([] { to_troupe(at::ones({3}).to_sparse()); }, errc::invalid_argument,
              {"not strided"});
  check_error([] { to_troupe(at::Tensor()); }, errc::invalid_argument, {"undefined"});
  check_error([] { to_troupe(at::ones({2}, at::kComplexFloat).conj()); }, errc::invalid_argument,
              {"conjugate"});
  CHECK(to_troupe(at::zeros({0, 5})).numel() == 0);
  CHECK(to_troupe(at::scalar_tensor(3.0)).dim() == 0);
}

// -- stores ----------------------------------------------------------------------------------

TEST_CASE("a c10d store is a troupe store") {
  auto inner = c10::make_intrusive<c10d::HashStore>();
  auto s = wrap_store(inner);
  s->set("a", "x");
  CHECK(s->get_string("a") == "x");
  CHECK(troupe::to_string(inner->get("a")) == "x");  // the same keys underneath
  CHECK(s->add("n", 3) == 3);
  CHECK(s->add("n", 2) == 5);
  CHECK(troupe::to_string(s->compare_set("a", troupe::to_bytes("x"), troupe::to_bytes("y"))) ==
        "y");
  CHECK(troupe::to_string(s->compare_set("a", troupe::to_bytes("x"), troupe::to_bytes("z"))) ==
        "y");
  s->append("log", troupe::to_bytes("ab"));
  s->append("log", troupe::to_bytes("cd"));
  CHECK(s->get_string("log") == "abcd");
  s->multi_set({"k1", "k2"}, {troupe::to_bytes("1"), troupe::to_bytes("2")});
  auto both = s->multi_get({"k1", "k2"});
  CHECK(troupe::to_string(both[0]) == "1");
  CHECK(troupe::to_string(both[1]) == "2");
  CHECK(s->check({"k1", "k2"}));
  CHECK_FALSE(s->check({"k1", "nope"}));
  CHECK(s->delete_key("k1"));
  CHECK_FALSE(s->check({"k1"}));
  CHECK(s->num_keys() == inner->getNumKeys());
}

TEST_CASE("c10d's timeouts become troupe's, naming the keys") {
  auto s = wrap_store(c10::make_intrusive<c10d::HashStore>());
  s->set_timeout(std::chrono::milliseconds(50));
  check_error([&] { s->get("missing"); }, errc::timeout, {"'missing'"});
  check_error(
      [&] {
        s->wait({"x", "y"}, std::chrono::milliseconds(20));
      },
      errc::timeout, {"'x'", "'y'"});
  check_error([&] { s->multi_get({"m"}); }, errc::timeout, {"'m'"});
}

TEST_CASE("ranks rendezvous through a c10d FileStore and a PrefixStore") {
  char path[] = "/tmp/troupe_torch_filestore_XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  std::vector<std::thread> ranks;
  std::atomic<int> right{0};
  for (int r = 0; r < 3; ++r)
    ranks.emplace_back([&, r] {
      auto fs = c10::make_intrusive<c10d::FileStore>(path, 3);
      auto store = c10::make_intrusive<c10d::PrefixStore>("job", fs);
      ProcessGroupTroupe pg{store, r, 3, std::chrono::seconds(30)};
      std::vector<at::Tensor> t{at::full({2}, float(r + 1))};
      pg.allreduce(t)->wait();
      if (t[0].equal(at::full({2}, 6.0f))) ++right;
      pg.barrier()->wait();
    });
  for (auto& t : ranks) t.join();
  CHECK(right == 3);
  std::remove(path);
}

// -- ProcessGroupTroupe --------------------------------------------------------------------

TEST_CASE("c10d calls run on troupe; Work and Future report them") {
  troupe::testing::run_ranks(
      3,
      [](troupe::world& w) {
        auto pg = bridge(w);
        const int r = w.rank(), n = w.size();
        CHECK(pg->getBackendName() == "troupe");
        CHECK(pg->getRank() == r);
        CHECK(pg->getSize() == n);
        std::vector<at::Tensor> t{at::full({4}, float(r))};
        auto work = pg->allreduce(t);
        auto fut = work->getFuture();
        auto doubled = fut->then(
            [](c10::ivalue::Future& f) { return c10::IValue(f.value().toTensorVector()[0] * 2); },
            c10::TensorType::get());
        CHECK(work->wait());
        CHECK(work->isCompleted());
        CHECK(work->isSuccess());
        CHECK(work->exception() == nullptr);
        CHECK(fut->completed());  // complete when wait returns
        CHECK(t[0].equal(at::full({4}, 3.0f)));
        CHECK(fut->value().toTensorVector()[0].data_ptr() == t[0].data_ptr());
        doubled->wait();
        CHECK(doubled->value().toTensor().equal(at::full({4}, 6.0f)));
        CHECK(work->result()[0].data_ptr() == t[0].data_ptr());

        // Several output lists: the future holds List[List[Tensor]], as gloo's.
        std::vector<at::Tensor> in{at::full({2}, float(r)), at::full({1}, float(10 * r))};
        std::vector<std::vector<at::Tensor>> outs(n);
        for (auto& o : outs) o = {at::empty({2}), at::empty({1})};
        auto f2 = pg->allgather_coalesced(outs, in)->getFuture();
        f2->wait();
        auto lists = f2->value().toList();
        REQUIRE(lists.size() == static_cast<std::size_t>(n));
        for (int q = 0; q < n; ++q) {
          auto l = lists.get(q).toTensorVector();
          CHECK(l[0].equal(at::full({2}, float(q))));
          CHECK(l[1].equal(at::full({1}, float(10 * q))));
        }
        // Sequence numbers count the calls alike on every rank.
        const auto before = pg->getSequenceNumberForGroup();
        pg->barrier()->wait();
        CHECK(pg->getSequenceNumberForGroup() == before + 1);
      },
      quick());
}

TEST_CASE("every c10d call of the interface, against values computed here") {
  troupe::testing::run_ranks(
      3,
      [](troupe::world& w) {
        auto pg = bridge(w);
        const int r = w.rank(), n = w.size();
        std::vector<at::Tensor> b{at::full({3}, float(r))};
        c10d::BroadcastOptions bo;
        bo.rootRank = 2;
        pg->broadcast(b, bo)->wait();
        CHECK(b[0].equal(at::full({3}, 2.0f)));
        std::vector<at::Tensor> rd{at::full({2}, float(r + 1))};
        c10d::ReduceOptions ro;
        ro.rootRank = 1;
        ro.reduceOp = c10d::ReduceOp::PRODUCT;
        pg->reduce(rd, ro)->wait();
        if (r == 1) CHECK(rd[0].equal(at::full({2}, 6.0f)));
        auto out = at::empty({n, 2});
        auto in = at::full({2}, float(r));
        pg->_allgather_base(out, in)->wait();
        for (int q = 0; q < n; ++q) CHECK(out[q].equal(at::full({2}, float(q))));
        auto rs = at::empty({2});
        auto big = at::arange(2 * n, at::kFloat) + r;
        pg->_reduce_scatter_base(rs, big)->wait();
        CHECK(rs.equal((at::arange(2, at::kFloat) + 2 * r) * n + 3));
        std::vector<std::vector<at::Tensor>> rsin{{}};
        for (int q = 0; q < n; ++q) rsin[0].push_back(at::full({1}, float(q * 10 + r)));
        std::vector<at::Tensor> rsout{at::empty({1})};
        pg->reduce_scatter(rsout, rsin)->wait();
        CHECK(rsout[0].item<float>() == float(r * 10 * n + 3));
        // alltoall_base with uneven splits: rank r sends q+1 rows to rank q.
        std::vector<std::int64_t> send(n), recv(n, r + 1);
        for (int q = 0; q < n; ++q) send[q] = q + 1;
        auto x = at::full({n * (n + 1) / 2}, float(r));
        auto y = at::empty({n * (r + 1)});
        pg->alltoall_base(y, x, recv, send)->wait();
        for (int q = 0; q < n; ++q)
          CHECK(y.slice(0, q * (r + 1), (q + 1) * (r + 1)).equal(at::full({r + 1}, float(q))));
        std::vector<at::Tensor> a2a_in, a2a_out;
        for (int q = 0; q < n; ++q) {
          a2a_in.push_back(at::full({1}, float(100 * r + q)));
          a2a_out.push_back(at::empty({1}));
        }
        pg->alltoall(a2a_out, a2a_in)->wait();
        for (int q = 0; q < n; ++q) CHECK(a2a_out[q].item<float>() == float(100 * q + r));
        std::vector<std::vector<at::Tensor>> gout;
        if (r == 0) gout = {{at::empty({1}), at::empty({1}), at::empty({1})}};
        std::vector<at::Tensor> gin{at::full({1}, float(r))};
        c10d::GatherOptions go;
        pg->gather(gout, gin, go)->wait();
        if (r == 0)
          for (int q = 0; q < n; ++q) CHECK(gout[0][q].item<float>() == float(q));
        std::vector<std::vector<at::Tensor>> sin;
        if (r == 0) sin = {{at::full({1}, 5.0f), at::full({1}, 6.0f), at::full({1}, 7.0f)}};
        std::vector<at::Tensor> sout{at::empty({1})};
        pg->scatter(sout, sin, c10d::ScatterOptions())->wait();
        CHECK(sout[0].item<float>() == float(5 + r));
        std::vector<at::Tensor> co{at::ones({2}, at::kDouble), at::ones({3}, at::kDouble)};
        pg->allreduce_coalesced(co)->wait();
        CHECK(co[1].equal(at::full({3}, double(n), at::kDouble)));
        pg->monitoredBarrier(c10d::BarrierOptions(), true);
        // Point to point, and a receive from any source that names the sender.
        if (r == 0) {
          for (int k = 1; k < n; ++k) {
            std::vector<at::Tensor> m{at::empty({1})};
            auto wk = pg->recvAnysource(m, 7);
            wk->wait();
            CHECK(m[0].item<float>() == float(wk->sourceRank()));
          }
        } else {
          std::vector<at::Tensor> m{at::full({1}, float(r))};
          pg->send(m, 0, 7)->wait();
        }
        std::vector<at::Tensor> ring{at::full({2}, float(r))};
        std::vector<at::Tensor> got{at::empty({2})};
        auto s = pg->send(ring, (r + 1) % n, 1);
        pg->recv(got, (r + n - 1) % n, 1)->wait();
        s->wait();
        CHECK(got[0].equal(at::full({2}, float((r + n - 1) % n))));
      },
      quick());
}

TEST_CASE("a failed call fails its Work and its Future with troupe's error") {
  troupe::testing::run_ranks(
      2,
      [](troupe::world& w) {
        auto pg = bridge(w);
        std::vector<at::Tensor> t{at::ones({w.rank() == 0 ? 4 : 3})};
        auto work = pg->allreduce(t);
        auto fut = work->getFuture();
        check_error([&] { work->wait(); }, errc::mismatch, {"allreduce", "4 float32", "3 float32"});
        CHECK(work->isCompleted());
        CHECK_FALSE(work->isSuccess());
        CHECK(work->exception() != nullptr);
        fut->wait();
        CHECK(fut->hasError());
        CHECK(fut->tryRetrieveErrorMessage().find("mismatch") != std::string::npos);
        // A bad argument throws at the call, naming it.
        std::vector<at::Tensor> nc{at::ones({3, 2}).t()};
        check_error([&] { pg->allreduce(nc); }, errc::invalid_argument,
                    {"allreduce", "tensor 0", "not contiguous"});
        // A wait with a timeout, while the peer has not joined yet.
        std::vector<at::Tensor> late{at::ones({1})};
        auto& store = *w.get_store();
        if (w.rank() == 0) {
          auto wk = pg->allreduce(late);
          check_error([&] { wk->wait(std::chrono::milliseconds(100)); }, errc::timeout, {});
          store.set("bridge_test/late", "go");  // now the other rank joins
          wk->wait();
        } else {
          store.wait({"bridge_test/late"});
          pg->allreduce(late)->wait();
        }
        CHECK(late[0].item<float>() == 2.0f);
      },
      quick());
}

TEST_CASE("a future callback may wait on another future (as PowerSGD's hook does)") {
  troupe::testing::run_ranks(
      2,
      [](troupe::world& w) {
        auto pg = bridge(w);
        std::vector<at::Tensor> a{at::ones({2})};
        std::vector<at::Tensor> b{at::full({2}, 10.0f)};
        auto chained = pg->allreduce(a)->getFuture()->then(
            [&](c10::ivalue::Future& f) {
              // Issued and waited inside the callback, through a future only.
              auto inner = pg->allreduce(b)->getFuture();
              inner->wait();
              return c10::IValue(f.value().toTensorVector()[0] +
                                 inner->value().toTensorVector()[0]);
            },
            c10::TensorType::get());
        chained->wait();
        REQUIRE_FALSE(chained->hasError());
        CHECK(chained->value().toTensor().equal(at::full({2}, 22.0f)));
      },
      quick());
}
