// allgather (list), allgather_into_tensor, allgather_coalesced,
// allgather_into_tensor_coalesced and allgatherv: 1-7 ranks, representative
// dtypes, 0 and uneven element counts, in place and out of place.

#include "collective_test.hpp"

using namespace troupe;

TEST_CASE("allgather into a list and into one tensor") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      for (auto t : ct::move_dtypes)
        for (std::int64_t len : {0, 1, 7}) {
          auto all = ct::per_rank(t, n, len, 1);
          auto in = ref::make(t, all[static_cast<std::size_t>(w.rank())]);
          tensor_list outs;
          for (int r = 0; r < n; ++r) outs.push_back(ref::zeros({len}, t));
          w.default_group().allgather(outs, in).wait();
          for (int r = 0; r < n; ++r)
            ref::check_close(outs[static_cast<std::size_t>(r)], all[static_cast<std::size_t>(r)],
                             ct::name("allgather", t, len));
          auto flat = ref::zeros({len * n}, t);
          w.default_group().allgather_into_tensor(flat, in).wait();
          ref::check_close(flat, ref::concat(all), ct::name("allgather_into_tensor", t, len));
        }
    });
  }
}

TEST_CASE("allgather_into_tensor in place: the input is the rank's block of the output") {
  testing::run_ranks(4, [](world& w) {
    auto out = ref::zeros({8}, dtype::float32);
    auto mine = out.flat_slice(2 * w.rank(), 2);
    mine.copy_from(tensor::from_vector<float>({float(w.rank()), float(w.rank()) + 0.5f}));
    w.default_group().allgather_into_tensor(out, mine).wait();
    CHECK(ref::host(out).to_vector<float>() ==
          std::vector<float>{0, 0.5f, 1, 1.5f, 2, 2.5f, 3, 3.5f});
  });
  // Large enough for several staging chunks and segments between processes.
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      const std::int64_t len = 100003;
      auto out = ref::zeros({len * n}, dtype::float32);
      auto mine = out.flat_slice(len * w.rank(), len);
      auto values = tensor::empty({len}, dtype::float32);  // written on the host
      for (std::int64_t i = 0; i < len; ++i)
        values.data_as<float>()[i] = float(w.rank() * 10 + i % 7);
      mine.copy_from(values);
      w.default_group().allgather_into_tensor(out, mine).wait();
      const auto got = ref::host(out);
      bool good = true;
      for (std::int64_t i = 0; i < len * n; ++i)
        good &= got.data_as<float>()[i] == float((i / len) * 10 + (i % len) % 7);
      CHECK(good);
    });
  }
}

TEST_CASE("allgather_coalesced and allgather_into_tensor_coalesced") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      std::vector<std::int64_t> lens{2, 0, 5};
      std::vector<std::vector<ref::values>> all;  // [i][r]
      tensor_list ins;
      for (std::size_t i = 0; i < lens.size(); ++i) {
        all.push_back(ct::per_rank(dtype::float64, n, lens[i], int(i) + 40));
        ins.push_back(ref::make(dtype::float64, all[i][static_cast<std::size_t>(w.rank())]));
      }
      std::vector<tensor_list> outs(static_cast<std::size_t>(n));  // [r][i]
      for (auto& per_rank : outs)
        for (auto len : lens) per_rank.push_back(ref::zeros({len}, dtype::float64));
      w.default_group().allgather_coalesced(outs, ins).wait();
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < lens.size(); ++i)
          ref::check_close(outs[static_cast<std::size_t>(r)][i],
                           all[i][static_cast<std::size_t>(r)], "allgather_coalesced");
      tensor_list flats;
      for (auto len : lens) flats.push_back(ref::zeros({len * n}, dtype::float64));
      w.default_group().allgather_into_tensor_coalesced(flats, ins).wait();
      for (std::size_t i = 0; i < lens.size(); ++i)
        ref::check_close(flats[i], ref::concat(all[i]), "allgather_into_tensor_coalesced");
    });
  }
}

TEST_CASE("allgatherv gathers uneven blocks, zeros included") {
  for (int n : ct::rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto counts = ct::uneven_counts(n);
      std::vector<ref::values> blocks;
      std::int64_t total = 0;
      for (int r = 0; r < n; ++r) {
        blocks.push_back(ref::random_values(dtype::int16, counts[static_cast<std::size_t>(r)],
                                            ct::seed(r, n, 3, 5)));
        total += counts[static_cast<std::size_t>(r)];
      }
      auto out = ref::zeros({total}, dtype::int16);
      w.default_group()
          .allgatherv(out, ref::make(dtype::int16, blocks[static_cast<std::size_t>(w.rank())]),
                      counts)
          .wait();
      ref::check_close(out, ref::concat(blocks), "allgatherv");
    });
  }
}

// Sources of 4-64 KiB travel through the segment's small slots, or (in one
// process from 32 KiB, between processes when shared) are read where they
// are while their rank waits: every element, every size, buffers reused.
TEST_CASE("allgather of sources around the small slots' size, every element") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      const int me = w.rank();
      for (std::int64_t len : {1024, 8191, 8192, 10240, 16384, 20000}) {
        CAPTURE(len);
        auto in = tensor::empty({len}, dtype::float32);
        auto out = tensor::empty({n * len}, dtype::float32);
        for (int round = 0; round < 3; ++round) {
          for (std::int64_t i = 0; i < len; ++i)
            in.data_as<float>()[i] = float(me * 100000 + round * 1000 + i % 997);
          w.default_group().allgather_into_tensor(out, in).wait();
          std::int64_t wrong = 0;
          for (int r = 0; r < n; ++r)
            for (std::int64_t i = 0; i < len; ++i)
              wrong +=
                  out.data_as<float>()[r * len + i] != float(r * 100000 + round * 1000 + i % 997);
          CHECK(wrong == 0);
        }
      }
    });
  }
}
