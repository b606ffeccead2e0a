// broadcast, gather, scatter, gatherv and scatterv: every root, 1-7 ranks,
// representative dtypes, 0 and uneven element counts.

#include "collective_test.hpp"

using namespace troupe;

TEST_CASE("broadcast delivers the root's tensor from every root") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      for (int root = 0; root < n; ++root)
        for (auto t : ct::move_dtypes)
          for (std::int64_t len : {0, 1, 33}) {
            auto all = ct::per_rank(t, n, len, root);
            auto x = ref::make(t, all[static_cast<std::size_t>(w.rank())]);
            w.default_group().broadcast(x, root).wait();
            ref::check_close(x, all[static_cast<std::size_t>(root)], ct::name("broadcast", t, len));
          }
    });
  }
}

TEST_CASE("broadcast of a tensor list fills every tensor from the root's root_tensor") {
  testing::run_ranks(3, [](world& w) {
    auto a = tensor::from_vector<int>({w.rank(), 0});
    auto b = tensor::from_vector<int>({10 * w.rank(), 7});
    w.default_group().broadcast(tensor_list{a, b}, {.root_rank = 2, .root_tensor = 1}).wait();
    CHECK(a.to_vector<int>() == std::vector<int>{20, 7});
    CHECK(b.to_vector<int>() == std::vector<int>{20, 7});
  });
}

TEST_CASE("gather collects every rank's tensor on every root") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      for (int root = 0; root < n; ++root)
        for (auto t : {dtype::float64, dtype::int8})
          for (std::int64_t len : {0, 5}) {
            auto all = ct::per_rank(t, n, len, 100 + root);
            auto in = ref::make(t, all[static_cast<std::size_t>(w.rank())]);
            tensor_list outs;
            if (w.rank() == root)
              for (int r = 0; r < n; ++r) outs.push_back(ref::zeros({len}, t));
            w.default_group().gather(outs, in, {.root_rank = root}).wait();
            for (int r = 0; r < static_cast<int>(outs.size()); ++r)
              ref::check_close(outs[static_cast<std::size_t>(r)], all[static_cast<std::size_t>(r)],
                               ct::name("gather", t, len));
          }
    });
  }
}

TEST_CASE("scatter sends block r of the root's list to rank r") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      for (int root = 0; root < n; ++root)
        for (auto t : {dtype::float32, dtype::complex128})
          for (std::int64_t len : {0, 4}) {
            auto blocks = ct::per_rank(t, n, len, 200 + root);
            tensor_list ins;
            if (w.rank() == root)
              for (auto& b : blocks) ins.push_back(ref::make(t, b));
            auto out = ref::zeros({len}, t);
            w.default_group().scatter(out, ins, {.root_rank = root}).wait();
            ref::check_close(out, blocks[static_cast<std::size_t>(w.rank())],
                             ct::name("scatter", t, len));
          }
    });
  }
}

TEST_CASE("gatherv and scatterv move uneven blocks, zeros included") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto counts = ct::uneven_counts(n);
      std::int64_t total = 0;
      for (auto c : counts) total += c;
      const auto me = static_cast<std::size_t>(w.rank());
      for (int root = 0; root < n; ++root) {
        std::vector<ref::values> blocks;
        for (int r = 0; r < n; ++r)
          blocks.push_back(ref::random_values(dtype::int32, counts[static_cast<std::size_t>(r)],
                                              ct::seed(r, n, 9, root)));
        // gatherv: the root receives every block in rank order.
        auto out = ref::zeros({w.rank() == root ? total : 0}, dtype::int32);
        w.default_group()
            .gatherv(out, ref::make(dtype::int32, blocks[me]), counts, {.root_rank = root})
            .wait();
        if (w.rank() == root) ref::check_close(out, ref::concat(blocks), "gatherv");
        // scatterv: the root's concatenation goes back out.
        auto in = w.rank() == root ? ref::make(dtype::int32, ref::concat(blocks))
                                   : ref::zeros({0}, dtype::int32);
        auto mine = ref::zeros({counts[me]}, dtype::int32);
        w.default_group().scatterv(mine, in, counts, {.root_rank = root}).wait();
        ref::check_close(mine, blocks[me], "scatterv");
      }
    });
  }
}
