#pragma once
// bench_common — what the collectives benchmark measures and how, shared by
// the workers of every system (troupe, Gloo, OpenMPI) and the report: the
// collectives, the sizes, the buffer layout of a size, the input pattern and
// the expected output, the iteration plan, one timing record and its CSV form.
//
// A worker describes its system as a `rank_runtime` (barrier, element-wise
// MAX over ranks, how to prepare one collective); `run_rank` then drives the
// same protocol everywhere: for each collective and size check the result
// once against a locally computed expectation, then warm up, then time
// iterations with a barrier before each. The time of an iteration is the
// slowest rank's (MAX over ranks); a record holds the median over iterations.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace bench {

enum class op_kind { allreduce, broadcast, allgather, reduce_scatter, alltoall };

/// The five collectives, in table order.
const std::vector<op_kind>& all_ops();
const char* op_name(op_kind op);
/// nccl-tests' factor from algbw to busbw: allreduce 2(n-1)/n, allgather,
/// reduce_scatter and alltoall (n-1)/n, broadcast 1.
double bus_factor(op_kind op, int n);

/// Nominal sizes: 4 B, 1 KiB, 64 KiB, 1 MiB (quick mode stops here), 16 MiB, 64 MiB.
std::vector<std::size_t> sizes(bool quick);

/// Buffers of one collective at one size, in float32 elements. As nccl-tests,
/// `bytes` is the whole buffer: allgather's output, reduce_scatter's input,
/// alltoall's input on one rank; per-rank blocks are nominal/n rounded down,
/// at least one element (so 4 B with 4 ranks becomes 16 B).
struct layout {
  std::size_t in_elems = 0;   ///< input (or the in-place buffer)
  std::size_t out_elems = 0;  ///< output (== in_elems for in-place ops)
  std::size_t block = 0;      ///< per-rank block (allgather, reduce_scatter, alltoall)
  std::size_t bytes = 0;      ///< the size reported in tables
};
layout make_layout(op_kind op, std::size_t nominal_bytes, int n);

/// Fills rank `rank`'s input: element j = pattern(rank, j) (small integers, so
/// every sum is exact in float32); broadcast's non-roots get -1.
void fill_input(op_kind op, int rank, const layout& l, float* in);
/// Number of output elements that differ from the expectation; the first one
/// is described in `first` (op, element, got, want).
std::size_t count_wrong(op_kind op, int rank, int n, const layout& l, const float* out,
                        std::string& first);

/// Warm-up and timed iterations for one size: 50 timed up to 1 MiB, 20 above
/// (after 5 warm-ups, 3 in quick mode, 2 from 16 MiB); --iters K overrides.
struct iteration_plan {
  int warmup = 5;
  int iters = 20;
};
iteration_plan plan_for(std::size_t bytes, bool quick, int iters_override);

/// One collective of one system, prepared for one size: where to write the
/// input, where to read the output, and the call that runs it once (blocking).
struct prepared_op {
  float* in = nullptr;
  float* out = nullptr;
  std::function<void()> run;
  std::shared_ptr<void> keep;  ///< owns the buffers and system objects
};

/// What a worker supplies for its rank.
struct rank_runtime {
  int rank = 0;
  int size = 1;
  std::function<void()> barrier;
  /// Element-wise MAX over all ranks, in place, result on every rank.
  std::function<void(std::vector<double>&)> max_all;
  /// Buffers + call for `op` with layout `l`; an empty `run` = not supported.
  std::function<prepared_op(op_kind op, const layout& l)> prepare;
};

/// One row of results.
struct record {
  std::string system;     ///< troupe, gloo, mpi
  std::string transport;  ///< inproc, shm, tcp
  int ranks = 0;
  std::string op;
  std::size_t bytes = 0;
  int iters = 0;
  double median_us = 0;
  double algbw = 0;  ///< GB/s (1e9 bytes)
  double busbw = 0;  ///< GB/s
};

struct run_config {
  std::string system, transport;
  bool quick = false;
  bool check_only = false;
  int iters = 0;  ///< 0: plan_for's default
};

/// Runs every collective and size on this rank (every rank calls it). Returns
/// the records on rank 0 (empty elsewhere); throws std::runtime_error naming
/// the collective, size and rank when a result is wrong on any rank.
std::vector<record> run_rank(const rank_runtime& rt, const run_config& c);

/// Appends records to a CSV file, writing the header when the file is new.
void append_csv(const std::string& path, const std::vector<record>& rows);
/// Reads every record of a CSV file written by append_csv.
std::vector<record> read_csv(const std::string& path);

/// Page-aligned float storage (2 MiB-aligned with huge pages when large).
std::shared_ptr<float> alloc_floats(std::size_t elems);

/// Common command line of the workers.
struct worker_args {
  std::string csv;  ///< empty: print only
  bool quick = false;
  bool check_only = false;
  int iters = 0;
  int ranks = 0;          ///< --inprocess N / --ranks N
  std::string transport;  ///< --transport (labels the records)
};
/// Parses --csv F --quick --check-only --iters K --inprocess N --ranks N
/// --transport T; throws std::invalid_argument on anything else.
worker_args parse_worker_args(int argc, char** argv);

/// "4 B", "64 KiB", "16 MiB".
std::string size_label(std::size_t bytes);

/// Prints the records of one run as a small table (rank 0 of a worker).
void print_records(const std::vector<record>& rows);

}  // namespace bench
