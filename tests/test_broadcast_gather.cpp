// broadcast, gather, scatter, gatherv and scatterv: every root, 1-7 ranks,
// representative dtypes, 0 and uneven element counts.

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

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

// Lists of views of one tensor, as callers split a buffer into per-rank
// blocks: in a row (the call reads or writes them in place), out of order
// (packed into a buffer of the call's own) and overlapping the call's other
// side (packed too: no rank may read what the call writes); small blocks and
// blocks past the segment's small slots.
TEST_CASE("list calls over views of one tensor: in a row, out of order, overlapping") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& g = w.default_group();
      const int me = w.rank(), root = n - 1;
      for (std::int64_t len : {std::int64_t{3}, std::int64_t{40000}}) {
        CAPTURE(len);
        // Element i of block b of rank r's buffer.
        auto value = [](int r, int b, std::int64_t i) {
          return static_cast<float>(r * 1000 + b * 10 + i % 7);
        };
        auto filled = [&](int r, int blocks) {
          auto t = tensor::empty({blocks * len}, dtype::float32);
          for (int b = 0; b < blocks; ++b)
            for (std::int64_t i = 0; i < len; ++i) t.data_as<float>()[b * len + i] = value(r, b, i);
          return t;
        };
        auto views = [&](const tensor& t, bool reversed) {
          tensor_list l;
          for (int b = 0; b < n; ++b) l.push_back(t.flat_slice(b * len, len));
          if (reversed) std::reverse(l.begin(), l.end());
          return l;
        };
        auto expect = [&](const tensor& t, auto want, const std::string& what) {
          const auto* p = t.data_as<float>();
          for (std::int64_t i = 0; i < len; ++i)
            if (p[i] != want(i)) {
              FAIL_CHECK(what << ": element " << i << " is " << p[i] << ", not " << want(i));
              return;
            }
        };
        for (bool reversed : {false, true}) {
          CAPTURE(reversed);
          // The view a list's entry r is: block r, or n-1-r reversed.
          auto block = [&](int r) { return reversed ? n - 1 - r : r; };
          auto outs = me == root ? views(tensor::empty({n * len}, dtype::float32), reversed)
                                 : tensor_list{};
          g.gather(outs, filled(me, 1), {.root_rank = root}).wait();
          for (int r = 0; r < static_cast<int>(outs.size()); ++r)
            expect(
                outs[static_cast<std::size_t>(r)], [&](auto i) { return value(r, 0, i); },
                "gather from rank " + std::to_string(r));

          auto ins = me == root ? views(filled(root, n), reversed) : tensor_list{};
          auto out = tensor::empty({len}, dtype::float32);
          g.scatter(out, ins, {.root_rank = root}).wait();
          expect(
              out, [&](auto i) { return value(root, block(me), i); }, "scatter");

          outs = views(tensor::empty({n * len}, dtype::float32), reversed);
          g.allgather(outs, filled(me, 1)).wait();
          for (int r = 0; r < n; ++r)
            expect(
                outs[static_cast<std::size_t>(r)], [&](auto i) { return value(r, 0, i); },
                "allgather from rank " + std::to_string(r));

          outs = views(tensor::empty({n * len}, dtype::float32), reversed);
          g.alltoall(outs, views(filled(me, n), reversed)).wait();
          for (int r = 0; r < n; ++r)
            expect(
                outs[static_cast<std::size_t>(r)], [&](auto i) { return value(r, block(me), i); },
                "alltoall from rank " + std::to_string(r));

          g.reduce_scatter(out, views(filled(me, n), reversed)).wait();
          expect(
              out,
              [&](auto i) {
                float sum = 0;
                for (int r = 0; r < n; ++r) sum += value(r, block(me), i);
                return sum;
              },
              "reduce_scatter");
        }
        // Overlapping: the root scatters into its own block of its input;
        // allgather's input is this rank's block of the output; alltoall
        // sends and receives through the same views; gather's root passes
        // its own block of the output as its input.
        auto buf = filled(me, n);
        auto ins = views(buf, false);
        auto out =
            me == root ? ins[static_cast<std::size_t>(root)] : tensor::empty({len}, dtype::float32);
        g.scatter(out, me == root ? ins : tensor_list{}, {.root_rank = root}).wait();
        expect(
            out, [&](auto i) { return value(root, me, i); }, "scatter in place");

        buf = filled(me, n);
        auto outs = views(buf, false);
        auto mine = outs[static_cast<std::size_t>(me)];
        for (std::int64_t i = 0; i < len; ++i) mine.data_as<float>()[i] = value(me, 0, i);
        g.allgather(outs, mine).wait();
        for (int r = 0; r < n; ++r)
          expect(
              outs[static_cast<std::size_t>(r)], [&](auto i) { return value(r, 0, i); },
              "allgather in place, rank " + std::to_string(r));

        buf = filled(me, n);
        outs = views(buf, false);
        g.alltoall(outs, outs).wait();
        for (int r = 0; r < n; ++r)
          expect(
              outs[static_cast<std::size_t>(r)], [&](auto i) { return value(r, me, i); },
              "alltoall in place, from rank " + std::to_string(r));

        buf = filled(me, n);
        outs = me == root ? views(buf, false) : tensor_list{};
        g.gather(outs, me == root ? outs[static_cast<std::size_t>(root)] : filled(me, 1),
                 {.root_rank = root})
            .wait();
        for (int r = 0; r < static_cast<int>(outs.size()); ++r)
          expect(
              outs[static_cast<std::size_t>(r)],
              [&](auto i) { return value(r, r == root ? root : 0, i); },
              "gather in place, from rank " + std::to_string(r));
      }
    });
  }
}

// Between processes of one host the root reads the others' gather inputs,
// and the others the root's scatter input, where they live (empty_shared
// memory, or a tensor::empty buffer of 64 KiB and more from its second use);
// calls that reuse their buffers and calls that write new contents each time.
// Between processes a gather's root offers its output (64 KiB and more,
// shared in place from a buffer's second use) and the others write their
// blocks into it: every root, uneven blocks (a zero one among them), every
// element checked, and the root's own block where the counts put it.
TEST_CASE("gather of large uneven blocks fills every root's output whole") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& g = w.default_group();
      const int me = w.rank();
      const std::vector<std::int64_t> all_counts = {30000, 0, 70001, 17000};
      std::vector<std::int64_t> counts(all_counts.begin(), all_counts.begin() + n);
      std::vector<std::int64_t> offset(static_cast<std::size_t>(n) + 1, 0);
      for (int r = 0; r < n; ++r)
        offset[static_cast<std::size_t>(r) + 1] =
            offset[static_cast<std::size_t>(r)] + counts[static_cast<std::size_t>(r)];
      const auto total = offset.back();
      auto in = tensor::empty({counts[static_cast<std::size_t>(me)]}, dtype::int32);
      auto out = tensor::empty({total}, dtype::int32);
      auto value = [](int root, int round, int r, std::int64_t i) {
        return root * 1000003 + round * 10007 + r * 100000 + static_cast<int>(i % 99991);
      };
      for (int root = 0; root < n; ++root)
        for (int round = 0; round < 3; ++round) {
          CAPTURE(root);
          CAPTURE(round);
          for (std::int64_t i = 0; i < in.numel(); ++i)
            in.data_as<int>()[i] = value(root, round, me, i);
          std::fill(out.data_as<int>(), out.data_as<int>() + total, -1);
          g.gatherv(out, in, counts, {.root_rank = root}).wait();
          if (me != root) continue;
          std::int64_t wrong = 0, first_wrong = -1;
          for (int r = 0; r < n; ++r)
            for (std::int64_t i = 0; i < counts[static_cast<std::size_t>(r)]; ++i)
              if (out.data_as<int>()[offset[static_cast<std::size_t>(r)] + i] !=
                  value(root, round, r, i)) {
                if (first_wrong < 0) first_wrong = offset[static_cast<std::size_t>(r)] + i;
                ++wrong;
              }
          CAPTURE(first_wrong);
          CHECK(wrong == 0);
        }
    });
  }
}

TEST_CASE("gather and scatter of reused and shared buffers") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& g = w.default_group();
      const int me = w.rank();
      // Blocks past the small slots; 64 KiB inputs (small enough for the
      // slots, large enough to be shared: read in place); a 64 KiB whole.
      for (std::int64_t len : {std::int64_t{50000}, std::int64_t{16384}, std::int64_t{16384 / n}})
        for (bool shared : {false, true}) {
          CAPTURE(len);
          CAPTURE(shared);
          auto make = [shared](std::int64_t numel) {
            return shared ? tensor::empty_shared({numel}, dtype::int32)
                          : tensor::empty({numel}, dtype::int32);
          };
          auto in = make(len), all = make(n * len), out = make(len);
          for (int round = 0; round < 4; ++round) {
            CAPTURE(round);
            for (std::int64_t i = 0; i < len; ++i) in.data_as<int>()[i] = round * 100 + me + int(i);
            tensor_list outs;
            if (me == 0)
              for (int r = 0; r < n; ++r) outs.push_back(all.flat_slice(r * len, len));
            g.gather(outs, in, {.root_rank = 0}).wait();
            if (me == 0)
              for (int r = 0; r < n; ++r)
                CHECK(all.data_as<int>()[r * len + len - 1] == round * 100 + r + int(len - 1));
            if (me == 0)
              for (std::int64_t i = 0; i < n * len; ++i) all.data_as<int>()[i] = round - int(i);
            g.scatter(out, outs, {.root_rank = 0}).wait();
            bool same = true;
            for (std::int64_t i = 0; i < len; ++i)
              same = same && out.data_as<int>()[i] == round - int(me * len + i);
            CHECK(same);
          }
        }
    });
  }
}

// A small call that ends in its caller's thread borrows the caller's tensors
// (inline/shm/tiny_direct.hpp); one that waits for a later rank holds its
// own. Every rank issues each collective of one small block, drops its
// tensors (keeping the works) and scribbles over fresh ones of the same size
// (the freed memory, likely), while one rank (each in turn) comes late: the
// early ranks' calls must have kept what they read and write.
TEST_CASE("small calls that wait for a late rank hold the tensors their callers dropped") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& g = w.default_group();
      const int me = w.rank();
      auto filled = [](std::int64_t len, int base) {
        auto t = tensor::empty({len}, dtype::int32);
        for (std::int64_t i = 0; i < len; ++i) t.data_as<int>()[i] = base + int(i);
        return t;
      };
      for (int late : {0, n - 1}) {
        CAPTURE(late);
        const int root = (late + 1) % n;
        std::vector<work> works;
        {
          if (me == late) std::this_thread::sleep_for(std::chrono::milliseconds(30));
          works.push_back(g.broadcast(filled(3, 10 * me), root));
          tensor_list outs;
          if (me == root)
            for (int r = 0; r < n; ++r) outs.push_back(filled(2, -1));
          works.push_back(g.gather(outs, filled(2, 100 * me), {.root_rank = root}));
          tensor_list ins;
          if (me == root)
            for (int r = 0; r < n; ++r) ins.push_back(filled(2, 1000 * r));
          works.push_back(g.scatter(filled(2, -1), ins, {.root_rank = root}));
          works.push_back(g.allgather_into_tensor(filled(2 * n, -1), filled(2, 100 * me)));
          works.push_back(g.reduce_scatter_tensor(filled(2, -1), filled(2 * n, me)));
          works.push_back(g.alltoall_single(filled(2 * n, -1), filled(2 * n, 100 * me)));
        }
        // Fresh tensors of the same sizes over what was freed.
        std::vector<tensor> scribbles;
        for (std::int64_t len : {2, 3, 4, 6, 8, 14})
          for (int k = 0; k < 4; ++k) scribbles.push_back(filled(len, -7777));
        for (auto& wk : works) wk.wait();
        auto ints = [](const tensor& t) { return t.to_vector<int>(); };
        CHECK(ints(works[0].result().at(0)) ==
              std::vector<int>{10 * root, 10 * root + 1, 10 * root + 2});
        if (me == root) {
          auto gathered = works[1].result();
          REQUIRE(gathered.size() == static_cast<std::size_t>(n));
          for (int r = 0; r < n; ++r)
            CHECK(ints(gathered[static_cast<std::size_t>(r)]) ==
                  std::vector<int>{100 * r, 100 * r + 1});
        }
        CHECK(ints(works[2].result().at(0)) == std::vector<int>{1000 * me, 1000 * me + 1});
        std::vector<int> all;
        for (int r = 0; r < n; ++r) all.insert(all.end(), {100 * r, 100 * r + 1});
        CHECK(ints(works[3].result().at(0)) == all);
        // Block `me` of every rank's input r + i (i = 2 me + j), summed.
        std::vector<int> sums(2, 0);
        for (int r = 0; r < n; ++r)
          for (int j = 0; j < 2; ++j) sums[static_cast<std::size_t>(j)] += r + 2 * me + j;
        CHECK(ints(works[4].result().at(0)) == sums);
        // Block `me` of every rank's input 100 r + i.
        std::vector<int> got;
        for (int r = 0; r < n; ++r) got.insert(got.end(), {100 * r + 2 * me, 100 * r + 2 * me + 1});
        CHECK(ints(works[5].result().at(0)) == got);
      }
    });
  }
}
