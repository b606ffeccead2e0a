// send, recv, recv_any_source, tags, batch_isend_irecv, receive timeouts and
// size mismatches.

#include <chrono>

#include "collective_test.hpp"

using namespace troupe;
using namespace std::chrono_literals;

TEST_CASE("send and recv around a ring, for 2, 3, 4 and 7 ranks") {
  for (int n : {2, 3, 4, 7}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int right = (w.rank() + 1) % n;
      const int left = (w.rank() + n - 1) % n;
      auto out = tensor::from_vector<double>({double(w.rank()), 0.5});
      auto in = ref::zeros({2}, dtype::float64);
      auto r = pg.recv(in, left);
      auto s = pg.send(out, right);
      s.wait();
      r.wait();
      CHECK(in.to_vector<double>() == std::vector<double>{double(left), 0.5});
      CHECK(r.source_rank() == left);
    });
  }
}

TEST_CASE("messages with different tags are matched by tag, in order per tag") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    if (w.rank() == 0) {
      pg.send(tensor::from_vector<int>({1}), 1, 5).wait();
      pg.send(tensor::from_vector<int>({2}), 1, 7).wait();
      pg.send(tensor::from_vector<int>({3}), 1, 5).wait();
    } else {
      auto a = ref::zeros({1}, dtype::int32), b = ref::zeros({1}, dtype::int32),
           c = ref::zeros({1}, dtype::int32);
      pg.recv(a, 0, 7).wait();
      pg.recv(b, 0, 5).wait();
      pg.recv(c, 0, 5).wait();
      CHECK(a.to_vector<int>()[0] == 2);
      CHECK(b.to_vector<int>()[0] == 1);
      CHECK(c.to_vector<int>()[0] == 3);
    }
  });
}

TEST_CASE("recv_any_source tells which rank sent") {
  testing::run_ranks(4, [](world& w) {
    auto& pg = w.default_group();
    if (w.rank() != 0) {
      pg.send(tensor::from_vector<int>({w.rank() * 10}), 0, 3).wait();
      return;
    }
    std::vector<int> seen;
    for (int i = 0; i < 3; ++i) {
      auto t = ref::zeros({1}, dtype::int32);
      auto wk = pg.recv_any_source(t, 3);
      wk.wait();
      CHECK(t.to_vector<int>()[0] == wk.source_rank() * 10);
      seen.push_back(wk.source_rank());
    }
    std::sort(seen.begin(), seen.end());
    CHECK(seen == std::vector<int>{1, 2, 3});
  });
}

TEST_CASE("batch_isend_irecv issues every op and completes as one work") {
  for (int n : {2, 3, 7}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      const int right = (w.rank() + 1) % n, left = (w.rank() + n - 1) % n;
      auto from_left = ref::zeros({3}, dtype::float32);
      auto from_right = ref::zeros({3}, dtype::float32);
      auto mine = tensor::from_vector<float>({float(w.rank()), 1, 2});
      std::vector<p2p_op> ops{{p2p_op::irecv, from_left, left, 0},
                              {p2p_op::irecv, from_right, right, 1},
                              {p2p_op::isend, mine, right, 0},
                              {p2p_op::isend, mine, left, 1}};
      w.default_group().batch_isend_irecv(ops).wait();
      CHECK(from_left.to_vector<float>()[0] == float(left));
      CHECK(from_right.to_vector<float>()[0] == float(right));
    });
  }
}

TEST_CASE("recv fails after its timeout, naming the peer and tag") {
  testing::run_ranks(2, [](world& w) {
    if (w.rank() != 0) return;
    auto t = ref::zeros({1}, dtype::int32);
    auto wk = w.default_group().recv({t}, 1, {.tag = 9, .timeout = 200ms});
    try {
      wk.wait(10s);
      FAIL("recv should time out");
    } catch (const error& e) {
      CHECK(e.code() == errc::timeout);
      std::string what = e.what();
      CHECK(what.find("Timeout") != std::string::npos);
      CHECK(what.find("rank 1") != std::string::npos);
      CHECK(what.find("tag 9") != std::string::npos);
    }
  });
}

TEST_CASE("recv into a buffer of the wrong size fails and names both sizes") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    if (w.rank() == 0) {
      pg.send(ref::zeros({4}, dtype::float32), 1).wait();
    } else {
      auto t = ref::zeros({3}, dtype::float32);
      auto wk = pg.recv(t, 0);
      try {
        wk.wait(10s);
        FAIL("recv should fail");
      } catch (const error& e) {
        CHECK(e.code() == errc::invalid_argument);
        std::string what = e.what();
        CHECK(what.find("16 bytes") != std::string::npos);
        CHECK(what.find("12 bytes") != std::string::npos);
      }
    }
  });
}
