// Argument validation of the process_group calls: one test per rule. Every
// validation error is thrown synchronously by the call (never from wait()),
// as errc::invalid_argument naming the call and the offending value.
// Cross-rank mismatches can only be found at run time: they fail the work.

#include <doctest/doctest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

/// `call` must throw troupe::error(code) naming every word, without returning a work.
template <class F>
void check_error(F&& call, errc code, std::initializer_list<std::string_view> words) {
  try {
    call();
    FAIL_CHECK("expected troupe::error (" << to_string(code)
                                          << ") from the call itself, nothing was thrown");
  } catch (const error& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(std::string(to_string(e.code())) == to_string(code), what);
    for (auto w : words)
      CHECK_MESSAGE(what.find(w) != std::string::npos, "'" << w << "' not in: " << what);
  }
}

/// Shorthand: `call` is invalid (errc::invalid_argument) for the named reasons.
template <class F>
void check_invalid(F&& call, std::initializer_list<std::string_view> words) {
  check_error(std::forward<F>(call), errc::invalid_argument, words);
}

tensor f32(std::int64_t n) {
  return tensor::zeros({n}, dtype::float32);
}
tensor i32(std::int64_t n) {
  return tensor::zeros({n}, dtype::int32);
}

/// Runs `fn` on n ranks with a short collective timeout.
void on_ranks(int n, const std::function<void(world&, process_group&)>& fn) {
  testing::run_options o;
  o.timeout = 10s;
  testing::run_ranks(
      n, [&](world& w) { fn(w, w.default_group()); }, o);
}

}  // namespace

// -- dtypes -------------------------------------------------------------------------------------

TEST_CASE("allreduce rejects a list of tensors with different dtypes") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid(
        [&] {
          pg.allreduce(tensor_list{f32(2), i32(2)});
        },
        {"allreduce", "tensors with different dtypes", "float32", "int32"});
  });
}

TEST_CASE("allgather rejects outputs whose dtype differs from the input") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid(
        [&] {
          pg.allgather(tensor_list{i32(2), i32(2)}, f32(2));
        },
        {"allgather", "tensors with different dtypes", "float32", "int32"});
  });
}

TEST_CASE("alltoall rejects outputs whose dtype differs from the inputs") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid(
        [&] {
          pg.alltoall({i32(1), i32(1)}, {f32(1), f32(1)});
        },
        {"alltoall", "tensors with different dtypes"});
    check_invalid(
        [&] {
          pg.alltoall({f32(1), f32(1)}, {f32(1), i32(1)});
        },
        {"alltoall", "tensors with different dtypes"});
  });
}

TEST_CASE("allgather_into_tensor rejects an output of another dtype") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid([&] { pg.allgather_into_tensor(i32(4), f32(2)); },
                  {"allgather_into_tensor", "tensors with different dtypes"});
  });
}

// -- list lengths ---------------------------------------------------------------------------------

TEST_CASE("allgather rejects an output list that is not one tensor per rank") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid([&] { pg.allgather(tensor_list{f32(2)}, f32(2)); },
                  {"allgather", "must have 2 entries, got 1"});
    check_invalid(
        [&] {
          pg.allgather(tensor_list{f32(2), f32(2), f32(2)}, f32(2));
        },
        {"allgather", "must have 2 entries, got 3"});
  });
}

TEST_CASE("scatter rejects an input list on the root that is not one tensor per rank") {
  on_ranks(3, [](world& w, process_group& pg) {
    if (w.rank() != 1) return;
    check_invalid(
        [&] {
          pg.scatter(f32(2), tensor_list{f32(2), f32(2)}, {.root_rank = 1});
        },
        {"scatter", "input_tensors[0] on the root", "must have 3 entries, got 2"});
  });
}

TEST_CASE("scatter rejects inputs on a non-root rank") {
  on_ranks(2, [](world& w, process_group& pg) {
    if (w.rank() != 1) return;
    check_invalid(
        [&] {
          pg.scatter(f32(2), tensor_list{f32(2), f32(2)}, {.root_rank = 0});
        },
        {"scatter", "must be empty on non-root rank 1", "root is 0"});
  });
}

TEST_CASE("gather rejects an output list on the root that is not one tensor per rank") {
  on_ranks(3, [](world& w, process_group& pg) {
    if (w.rank() != 0) return;
    check_invalid([&] { pg.gather(tensor_list{f32(2)}, f32(2)); },
                  {"gather", "output_tensors[0] on the root", "must have 3 entries, got 1"});
  });
}

TEST_CASE("gather rejects outputs on a non-root rank") {
  on_ranks(2, [](world& w, process_group& pg) {
    if (w.rank() != 1) return;
    check_invalid(
        [&] {
          pg.gather(tensor_list{f32(1), f32(1)}, f32(1));
        },
        {"gather", "must be empty on non-root rank 1"});
  });
}

TEST_CASE("alltoall rejects lists that are not one tensor per rank") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid(
        [&] {
          pg.alltoall({f32(1), f32(1)}, {f32(1)});
        },
        {"alltoall", "input_tensors must have 2 entries, got 1"});
    check_invalid(
        [&] {
          pg.alltoall({f32(1), f32(1), f32(1)}, {f32(1), f32(1)});
        },
        {"alltoall", "output_tensors must have 2 entries, got 3"});
  });
}

TEST_CASE("reduce_scatter rejects an input list that is not one tensor per rank") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid([&] { pg.reduce_scatter(f32(2), tensor_list{f32(2)}); },
                  {"reduce_scatter", "must have 2 entries, got 1"});
  });
}

TEST_CASE("an empty tensor list is rejected") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid([&] { pg.allreduce(tensor_list{}); },
                  {"allreduce", "must hold at least 1 tensor(s), got 0"});
    check_invalid([&] { pg.broadcast(tensor_list{}); }, {"broadcast", "at least 1"});
  });
}

// -- sizes
// ------------------------------------------------------------------------------------------

TEST_CASE("allgather_into_tensor rejects an output that is not size x input") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid([&] { pg.allgather_into_tensor(f32(3), f32(2)); },
                  {"allgather_into_tensor", "output_tensor has 3 elements, expected 4"});
  });
}

TEST_CASE("reduce_scatter_tensor rejects an input that is not size x output") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid([&] { pg.reduce_scatter_tensor(f32(2), f32(5)); },
                  {"reduce_scatter_tensor", "input_tensor has 5 elements, expected 4"});
  });
}

TEST_CASE("allgather rejects outputs whose size differs from the input") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid(
        [&] {
          pg.allgather(tensor_list{f32(2), f32(3)}, f32(2));
        },
        {"allgather", "has 3 elements, expected 2"});
  });
}

TEST_CASE("allreduce rejects a list of tensors of different sizes") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid(
        [&] {
          pg.allreduce(tensor_list{f32(2), f32(3)});
        },
        {"allreduce", "has 3 elements, expected 2"});
  });
}

// -- split sizes
// --------------------------------------------------------------------------------------

TEST_CASE("alltoall_single rejects split lists that are not one entry per rank") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid([&] { pg.alltoall_single(f32(4), f32(4), {}, {4}); },
                  {"alltoall_single", "input_split_sizes must have 2 entries, got 1"});
    check_invalid(
        [&] {
          pg.alltoall_single(f32(4), f32(4), {1, 1, 2}, {});
        },
        {"alltoall_single", "output_split_sizes must have 2 entries, got 3"});
  });
}

TEST_CASE("alltoall_single rejects splits that do not sum to the rows") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid(
        [&] {
          pg.alltoall_single(f32(4), f32(4), {}, {1, 1});
        },
        {"alltoall_single", "input_split_sizes sum to 2 but dim 0 has 4 rows"});
    check_invalid(
        [&] {
          pg.alltoall_single(f32(4), f32(4), {3, 3}, {});
        },
        {"alltoall_single", "output_split_sizes sum to 6 but dim 0 has 4 rows"});
  });
}

TEST_CASE("alltoall_single rejects negative splits") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid(
        [&] {
          pg.alltoall_single(f32(4), f32(4), {}, {5, -1});
        },
        {"alltoall_single", "input_split_sizes[1] is negative (-1)"});
  });
}

TEST_CASE("alltoall_single without splits needs rows divisible by the group size") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid(
        [&] { pg.alltoall_single(f32(4), f32(3)); },
        {"alltoall_single", "input_split_sizes is empty", "dim 0 of size 3", "group size 2"});
    check_invalid([&] { pg.alltoall_single(f32(3), f32(4)); },
                  {"alltoall_single", "output_split_sizes is empty", "dim 0 of size 3"});
  });
}

TEST_CASE("alltoall_single rejects rows of different lengths") {
  on_ranks(2, [](world&, process_group& pg) {
    auto in = tensor::zeros({2, 3}, dtype::float32);
    auto out = tensor::zeros({2, 2}, dtype::float32);
    check_invalid([&] { pg.alltoall_single(out, in); },
                  {"alltoall_single", "input rows have 3 elements but output rows have 2"});
  });
}

// -- roots
// ----------------------------------------------------------------------------------------------

TEST_CASE("broadcast rejects a root out of range") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid([&] { pg.broadcast(f32(1), 2); },
                  {"broadcast", "root_rank 2 is out of range for a group of size 2"});
    check_invalid([&] { pg.broadcast(f32(1), -1); }, {"broadcast", "root_rank -1"});
  });
}

TEST_CASE("broadcast rejects a root_tensor out of range") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid([&] { pg.broadcast(tensor_list{f32(1)}, {.root_rank = 0, .root_tensor = 1}); },
                  {"broadcast", "root_tensor 1 is out of range for 1 tensor(s)"});
  });
}

TEST_CASE("reduce rejects a root out of range") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid([&] { pg.reduce(f32(1), 3); }, {"reduce", "root_rank 3 is out of range"});
    check_invalid([&] { pg.reduce(f32(1), -1); }, {"reduce", "root_rank -1 is out of range"});
  });
}

TEST_CASE("gather rejects a root out of range") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid([&] { pg.gather(tensor_list{}, f32(1), {.root_rank = 2}); },
                  {"gather", "root_rank 2 is out of range"});
  });
}

TEST_CASE("scatter rejects a root out of range") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid([&] { pg.scatter(f32(1), tensor_list{}, {.root_rank = -1}); },
                  {"scatter", "root_rank -1 is out of range"});
  });
}

TEST_CASE("gatherv and scatterv reject a root out of range") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid(
        [&] {
          pg.gatherv(f32(2), f32(1), {1, 1}, {.root_rank = 2});
        },
        {"gatherv", "root_rank 2 is out of range"});
    check_invalid(
        [&] {
          pg.scatterv(f32(1), f32(2), {1, 1}, {.root_rank = 5});
        },
        {"scatterv", "root_rank 5 is out of range"});
  });
}

// -- counts of the v-forms
// ---------------------------------------------------------------------------

TEST_CASE("v-forms reject negative counts") {
  on_ranks(2, [](world& w, process_group& pg) {
    const std::vector<std::int64_t> bad{-1, 3};
    auto in = f32(w.rank() == 0 ? 1 : 3);
    check_invalid([&] { pg.allgatherv(f32(2), in, bad); },
                  {"allgatherv", "counts[0] is negative (-1)"});
    check_invalid([&] { pg.gatherv(f32(2), in, bad); }, {"gatherv", "counts[0] is negative"});
    check_invalid([&] { pg.scatterv(in, f32(2), bad); }, {"scatterv", "counts[0] is negative"});
    check_invalid([&] { pg.reduce_scatterv(in, f32(2), bad); },
                  {"reduce_scatterv", "counts[0] is negative"});
  });
}

TEST_CASE("v-forms reject a counts list that is not one entry per rank") {
  on_ranks(2, [](world&, process_group& pg) {
    const std::vector<std::int64_t> short_counts{2};
    check_invalid([&] { pg.allgatherv(f32(2), f32(2), short_counts); },
                  {"allgatherv", "counts must have 2 entries, got 1"});
    check_invalid([&] { pg.gatherv(f32(2), f32(2), short_counts); },
                  {"gatherv", "counts must have 2 entries, got 1"});
    check_invalid(
        [&] {
          pg.scatterv(f32(2), f32(2), {1, 1, 1});
        },
        {"scatterv", "counts must have 2 entries, got 3"});
    check_invalid([&] { pg.reduce_scatterv(f32(2), f32(2), short_counts); },
                  {"reduce_scatterv", "counts must have 2 entries, got 1"});
  });
}

TEST_CASE("v-forms reject tensors that do not match the counts") {
  on_ranks(2, [](world& w, process_group& pg) {
    const std::vector<std::int64_t> counts{1, 2};
    const auto mine = counts[static_cast<std::size_t>(w.rank())];
    check_invalid([&] { pg.allgatherv(f32(3), f32(mine + 1), counts); },
                  {"allgatherv", "input (counts[rank])"});
    check_invalid([&] { pg.allgatherv(f32(4), f32(mine), counts); },
                  {"allgatherv", "output (sum of counts) has 4 elements, expected 3"});
    check_invalid([&] { pg.reduce_scatterv(f32(mine), f32(2), counts); },
                  {"reduce_scatterv", "input (sum of counts) has 2 elements, expected 3"});
  });
}

// -- point to point
// ---------------------------------------------------------------------------------------

TEST_CASE("send and recv reject this rank as the peer") {
  on_ranks(2, [](world& w, process_group& pg) {
    const auto me = w.rank();
    check_invalid([&] { pg.send(f32(1), me); }, {"send", "dst_rank", "is this rank"});
    check_invalid([&] { pg.recv(f32(1), me); }, {"recv", "src_rank", "is this rank"});
  });
}

TEST_CASE("send and recv reject a peer out of range") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid([&] { pg.send(f32(1), 2); }, {"send", "dst_rank 2 is out of range"});
    check_invalid([&] { pg.recv(f32(1), -1); }, {"recv", "src_rank -1 is out of range"});
  });
}

TEST_CASE("point-to-point calls reject a negative tag") {
  on_ranks(2, [](world& w, process_group& pg) {
    const int peer = 1 - w.rank();
    check_invalid([&] { pg.send(f32(1), peer, -1); }, {"send", "tag -1 is negative"});
    check_invalid([&] { pg.recv(f32(1), peer, -2); }, {"recv", "tag -2 is negative"});
    check_invalid([&] { pg.recv_any_source(f32(1), -3); },
                  {"recv_any_source", "tag -3 is negative"});
  });
}

TEST_CASE("batch_isend_irecv validates every operation before issuing any") {
  on_ranks(2, [](world& w, process_group& pg) {
    const int peer = 1 - w.rank();
    check_invalid([&] { pg.batch_isend_irecv({}); }, {"batch_isend_irecv", "empty"});
    check_invalid(
        [&] {
          pg.batch_isend_irecv({{p2p_op::isend, f32(1), peer}, {p2p_op::irecv, f32(1), w.rank()}});
        },
        {"batch_isend_irecv", "irecv peer", "is this rank"});
  });
}

// -- tensors
// ------------------------------------------------------------------------------------------------

TEST_CASE("a non-contiguous tensor is rejected") {
  on_ranks(2, [](world&, process_group& pg) {
    float data[4] = {1, 2, 3, 4};
    auto t = tensor::from_blob(data, {2, 2}, {1, 2}, dtype::float32);  // the transpose
    REQUIRE_FALSE(t.is_contiguous());
    check_invalid([&] { pg.allreduce(t); }, {"allreduce", "non-contiguous"});
    check_invalid([&] { pg.broadcast(t, 0); }, {"broadcast", "non-contiguous"});
    check_invalid([&] { pg.allgather_into_tensor(f32(8), t); },
                  {"allgather_into_tensor", "non-contiguous"});
  });
}

TEST_CASE("an undefined tensor is rejected") {
  on_ranks(2, [](world& w, process_group& pg) {
    check_invalid([&] { pg.allreduce(tensor{}); }, {"allreduce", "undefined tensor"});
    check_invalid([&] { pg.send(tensor{}, 1 - w.rank()); }, {"send", "undefined tensor"});
    check_invalid([&] { pg.allgather_into_tensor(f32(2), tensor{}); },
                  {"allgather_into_tensor", "undefined tensor"});
  });
}

// -- reduce ops and dtypes
// --------------------------------------------------------------------------------

TEST_CASE("bitwise reductions are rejected on floating tensors") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid([&] { pg.allreduce(f32(2), reduce_op::BAND); }, {"allreduce", "BAND", "float32"});
    check_invalid([&] { pg.reduce(f32(2), 0, reduce_op::BXOR); }, {"reduce", "BXOR", "float32"});
  });
}

TEST_CASE("AVG is rejected on integer tensors") {
  on_ranks(2, [](world&, process_group& pg) {
    check_invalid([&] { pg.allreduce(i32(2), reduce_op::AVG); }, {"allreduce", "AVG", "int32"});
    check_invalid([&] { pg.reduce_scatter_tensor(i32(1), i32(2), {.op = reduce_op::AVG}); },
                  {"reduce_scatter_tensor", "AVG", "int32"});
  });
}

TEST_CASE("MIN and MAX are rejected on complex tensors") {
  on_ranks(2, [](world&, process_group& pg) {
    auto c = tensor::zeros({2}, dtype::complex64);
    check_invalid([&] { pg.allreduce(c, reduce_op::MIN); }, {"allreduce", "MIN", "complex64"});
    check_invalid([&] { pg.allreduce(c, reduce_op::MAX); }, {"allreduce", "MAX", "complex64"});
  });
}

// -- cross-rank mismatches (found at run time)
// ------------------------------------------------------------

TEST_CASE("ranks passing different sizes to allreduce fail the work") {
  std::array<std::string, 2> errors;
  std::array<errc, 2> codes{};
  std::mutex mtx;
  on_ranks(2, [&](world& w, process_group& pg) {
    auto t = f32(w.rank() == 0 ? 4 : 5);
    work wk = pg.allreduce(tensor_list{t}, {.timeout = 1500ms});  // validation passes locally
    try {
      wk.wait();
    } catch (const error& e) {
      std::lock_guard<std::mutex> g{mtx};
      errors[static_cast<std::size_t>(w.rank())] = e.what();
      codes[static_cast<std::size_t>(w.rank())] = e.code();
    }
  });
  CAPTURE(errors[0]);
  CAPTURE(errors[1]);
  // Every rank learns what every other rank called: both refuse, naming both sizes.
  for (std::size_t r = 0; r < 2; ++r) {
    const auto& m = errors[r];
    CHECK(codes[r] == errc::mismatch);
    CHECK(m.find("allreduce") != std::string::npos);
    CHECK(m.find("rank 0 called allreduce (SUM) of 4 float32 elements") != std::string::npos);
    CHECK(m.find("rank 1 called allreduce (SUM) of 5 float32 elements") != std::string::npos);
    CHECK(m.find("the element count") != std::string::npos);
  }
}

TEST_CASE("ranks calling different collectives at one sequence number fail with a mismatch") {
  std::array<std::string, 2> errors;
  std::array<errc, 2> codes{};
  std::mutex mtx;
  on_ranks(2, [&](world& w, process_group& pg) {
    auto t = f32(4);
    work wk = w.rank() == 0 ? pg.broadcast(tensor_list{t}, {.root_rank = 0, .timeout = 1500ms})
                            : pg.allreduce(tensor_list{t}, {.timeout = 1500ms});
    try {
      wk.wait();
    } catch (const error& e) {
      std::lock_guard<std::mutex> g{mtx};
      errors[static_cast<std::size_t>(w.rank())] = e.what();
      codes[static_cast<std::size_t>(w.rank())] = e.code();
    }
  });
  CAPTURE(errors[0]);
  CAPTURE(errors[1]);
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(codes[r] == errc::mismatch);
    CHECK(errors[r].find("collective mismatch") != std::string::npos);
    CHECK(errors[r].find("rank 0 called broadcast") != std::string::npos);
    CHECK(errors[r].find("rank 1 called allreduce") != std::string::npos);
  }
}

TEST_CASE(
    "ranks of one process that disagree on a broadcast, allgather or reduce_scatter all fail") {
  // Ranks of one process copy straight between each other's buffers: every
  // rank checks every rank's arguments first, so all fail alike, naming the
  // value, and the group works afterwards.
  struct disagreement {
    const char* what;
    std::vector<std::string> words;
    std::function<work(int rank, process_group&)> call;
  };
  const std::vector<disagreement> cases = {
      {"broadcast roots",
       {"broadcast", "root 1", "root 0"},
       [](int r, process_group& pg) {
         auto t = f32(4);
         return pg.broadcast(tensor_list{t}, {.root_rank = r == 0 ? 0 : 1, .timeout = 5000ms});
       }},
      {"broadcast sizes",
       {"broadcast", "rank 2 called broadcast of 5 float32 elements", "the element count"},
       [](int r, process_group& pg) {
         auto t = f32(r == 2 ? 5 : 4);
         return pg.broadcast(tensor_list{t}, {.root_rank = 0, .timeout = 5000ms});
       }},
      {"allgatherv counts",
       {"allgather", "the counts per rank"},
       [](int r, process_group& pg) {
         std::vector<std::int64_t> counts = {1, 2, r == 1 ? 4 : 3};
         const std::int64_t total = counts[0] + counts[1] + counts[2];
         return pg.allgatherv(f32(total), f32(counts[static_cast<std::size_t>(r)]), counts,
                              {.timeout = 5000ms});
       }},
      {"reduce_scatter dtypes",
       {"reduce_scatter_tensor", "rank 0 called reduce_scatter (SUM) of float64",
        "ranks 1, 2 called reduce_scatter (SUM) of float32", "the dtype"},
       [](int r, process_group& pg) {
         const auto t = r == 0 ? dtype::float64 : dtype::float32;
         return pg.reduce_scatter_tensor(tensor::zeros({2}, t), tensor::zeros({6}, t),
                                         {.timeout = 5000ms});
       }},
      {"alltoall splits",
       {"alltoall_single", "rank 0 sends 2 elements to rank 1, which expects 1 from it"},
       [](int r, process_group& pg) {
         std::vector<std::int64_t> in_splits = {1, r == 0 ? 2 : 1, 1};
         return pg.alltoall_single(f32(3), f32(r == 0 ? 4 : 3), {1, 1, 1}, in_splits,
                                   {.timeout = 5000ms});
       }},
      {"reduce_scatter ops",
       {"reduce_scatter_tensor", "rank 1 called reduce_scatter (MAX)", "the reduce op"},
       [](int r, process_group& pg) {
         return pg.reduce_scatter_tensor(
             f32(2), f32(6), {.op = r == 1 ? reduce_op::MAX : reduce_op::SUM, .timeout = 5000ms});
       }},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    std::array<std::string, 3> errors;
    std::array<errc, 3> codes{};
    std::array<bool, 3> works_after{};
    std::mutex mtx;
    on_ranks(3, [&](world& w, process_group& pg) {
      const auto start = std::chrono::steady_clock::now();
      const auto r = static_cast<std::size_t>(w.rank());
      try {
        c.call(w.rank(), pg).wait();
      } catch (const error& e) {
        std::lock_guard<std::mutex> g{mtx};
        errors[r] = e.what();
        codes[r] = e.code();
      }
      const bool fast = std::chrono::steady_clock::now() - start < 3s;
      auto t = tensor::from_vector<float>({float(w.rank())});
      pg.broadcast(tensor_list{t}, {.root_rank = 2}).wait();
      std::lock_guard<std::mutex> g{mtx};
      works_after[r] = fast && t.to_vector<float>()[0] == 2.f;
    });
    for (std::size_t r = 0; r < 3; ++r) {
      CAPTURE(r);
      CAPTURE(errors[r]);
      CHECK(codes[r] == errc::mismatch);
      for (const auto& word : c.words) CHECK(errors[r].find(word) != std::string::npos);
      CHECK(works_after[r]);
    }
  }
}
