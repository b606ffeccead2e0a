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
//
// Besides the five collectives of the default run, the protocol covers the
// other calls users make: reduce, gather and scatter (root 0), barrier (one
// row, 0 bytes), pingpong (2 ranks: a round trip of rank 0 to rank 1 and
// back, reported as one-way time = round trip / 2) and halo (a ring: every
// rank sends its block to both neighbours and receives both of theirs).
//
// Two more modes share the protocol: `run_rss` (peak resident memory of each
// rank during a 64 MiB allreduce, in a fresh process) and `run_memcpy` (one
// thread's memcpy at the same sizes, the reference for bandwidths).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace bench {

enum class op_kind {
  allreduce,
  broadcast,
  allgather,
  reduce_scatter,
  alltoall,
  reduce,
  gather,
  scatter,
  barrier,
  pingpong,
  halo
};

/// The five collectives of the default run (no --ops), in table order.
const std::vector<op_kind>& all_ops();
/// Every operation (--ops all), in table order: the five, then reduce,
/// gather, scatter, barrier, pingpong, halo.
const std::vector<op_kind>& every_op();
const char* op_name(op_kind op);
/// "allreduce,alltoall" -> those operations, in table order, each once; "all"
/// -> every_op(). Throws std::invalid_argument naming an unknown name or an
/// empty list.
std::vector<op_kind> parse_ops(const std::string& list);
/// nccl-tests' factor from algbw to busbw: allreduce 2(n-1)/n, allgather,
/// reduce_scatter, alltoall, gather and scatter (n-1)/n, broadcast and
/// reduce 1; pingpong 1 (busbw = one-way bandwidth); halo 2 (every rank
/// sends its block twice); barrier 0 (no data).
double bus_factor(op_kind op, int n);
/// Whether `op` runs with n ranks: pingpong and halo from 2.
bool runs_with(op_kind op, int n);
/// pingpong's partner of rank 0 among n ranks: rank n / 2 (with ranks
/// numbered host by host, a rank of another host where there are hosts);
/// the other ranks wait meanwhile (in the barrier before each iteration),
/// as a collective's idle ranks do.
inline int pingpong_partner(int n) {
  return n / 2;
}
/// What a timed call counts as: 2 for pingpong (a round trip, reported as
/// one-way time), 1 for the others.
int calls_per_run(op_kind op);

/// Nominal sizes: 4 B, 1 KiB, 64 KiB, 1 MiB (quick mode stops here), 16 MiB, 64 MiB.
std::vector<std::size_t> sizes(bool quick);
/// The sizes `op` runs at: barrier only 0 bytes; halo sizes(quick) plus
/// 8 KiB; the others sizes(quick). `picked` (--sizes; empty: all) replaces
/// sizes(quick) for every op but barrier.
std::vector<std::size_t> op_sizes(op_kind op, bool quick, const std::vector<std::size_t>& picked);
/// "--sizes" lists nominal sizes by their labels ("4 B" or "4B", "16MiB"):
/// the sizes picked, in order (sizes(false) and 8 KiB); throws
/// std::invalid_argument naming a label that is not one of them.
std::vector<std::size_t> parse_sizes(const std::string& list);

/// Buffers of one collective at one size, in float32 elements. As nccl-tests,
/// `bytes` is the whole buffer: allgather's and gather's output,
/// reduce_scatter's and scatter's input, alltoall's input on one rank; per-rank
/// blocks are nominal/n rounded down, at least one element (so 4 B with 4
/// ranks becomes 16 B). pingpong and halo: `bytes` is one message (halo's
/// output holds two, the left neighbour's then the right one's); barrier: 0.
struct layout {
  std::size_t in_elems = 0;   ///< input (or the in-place buffer)
  std::size_t out_elems = 0;  ///< output (== in_elems for in-place ops)
  std::size_t block = 0;      ///< per-rank block (allgather, reduce_scatter, alltoall, ...)
  std::size_t bytes = 0;      ///< the size reported in tables
};
layout make_layout(op_kind op, std::size_t nominal_bytes, int n);

/// Fills rank `rank`'s input: element j = pattern(rank, j) (small integers, so
/// every sum is exact in float32); the non-roots of broadcast and scatter and
/// pingpong's rank 1 (which sends back what it received) get -1.
void fill_input(op_kind op, int rank, const layout& l, float* in);
/// Number of output elements that differ from the expectation; the first one
/// is described in `first` (op, element, got, want). Where `op` leaves a
/// rank's output undefined (reduce and gather off the root) nothing is checked.
std::size_t count_wrong(op_kind op, int rank, int n, const layout& l, const float* out,
                        std::string& first);

/// Warm-up and timed iterations for one size: 50 timed up to 1 MiB, 20 above
/// (after 5 warm-ups, 3 in quick mode, 2 from 16 MiB, and in any case at
/// least 30 ms of them); --iters K overrides the timed ones.
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
  std::string system;     ///< troupe, gloo, mpi; memcpy for the reference rows
  std::string transport;  ///< inproc, shm, tcp; local for memcpy
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
  int iters = 0;                   ///< 0: plan_for's default
  std::vector<op_kind> ops;        ///< empty: all_ops()
  std::vector<std::size_t> sizes;  ///< empty: op_sizes(op, quick, {})
  /// The least time each size is timed for (0: 100 ms), and warmed up for
  /// half as long (at least 30 ms): --min-time.
  int min_time_ms = 0;
};

/// Runs the configured collectives at every size on this rank (every rank
/// calls it). Returns the records on rank 0 (empty elsewhere); throws
/// std::runtime_error naming the collective, size and rank when a result is
/// wrong on any rank. An op that does not run with this many ranks
/// (runs_with) is skipped, with a line on rank 0. pingpong's records hold the
/// one-way time (the round trip's median / 2) between rank 0 and
/// pingpong_partner.
std::vector<record> run_rank(const rank_runtime& rt, const run_config& c);

/// Single-thread memcpy at sizes(quick), timed as the collectives (plan_for,
/// median; source and destination allocated and touched before timing).
/// Records: system "memcpy", transport "local", ranks 1, op "memcpy",
/// algbw = busbw = bytes / time.
std::vector<record> run_memcpy(bool quick, int iters_override);

/// Resident memory around one allreduce size (the --rss mode).
struct rss_record {
  std::string system, transport;
  int ranks = 0;
  std::size_t tensor_bytes = 0;
  std::size_t baseline_bytes = 0;  ///< VmRSS before the tensor is allocated (MAX over ranks)
  std::size_t peak_bytes = 0;      ///< VmHWM after the allreduces (MAX over ranks)
};
/// The tensor of the --rss mode: 64 MiB of float32 (16 Mi elements).
constexpr std::size_t rss_tensor_bytes = std::size_t(64) << 20;
/// Every rank: read VmRSS, reset the high-water mark (/proc/self/clear_refs),
/// prepare the allreduce of `tensor_bytes`, run it 3 times (each checked),
/// read VmHWM; MAX of both over ranks. Meant for a fresh process: with ranks
/// on threads of one process (troupe inproc) the values are the process's,
/// for all ranks together. Returns the record on rank 0 (ranks == 0
/// elsewhere); throws std::runtime_error on a wrong result.
rss_record run_rss(const rank_runtime& rt, const run_config& c,
                   std::size_t tensor_bytes = rss_tensor_bytes);
/// Appends one line to an RSS CSV (header when new):
/// system,transport,ranks,tensor_bytes,baseline_bytes,peak_bytes
void append_rss_csv(const std::string& path, const rss_record& r);
std::vector<rss_record> read_rss_csv(const std::string& path);
void print_rss(const rss_record& r);
/// run_rss, then on rank 0 print_rss and (when `csv` is set) append_rss_csv.
void report_rss(const rank_runtime& rt, const run_config& c, const std::string& csv);

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
  int ranks = 0;                   ///< --inprocess N / --ranks N
  std::string transport;           ///< --transport (labels the records)
  std::vector<op_kind> ops;        ///< --ops a,b or all (empty: all_ops())
  std::vector<std::size_t> sizes;  ///< --sizes 16MiB,64MiB (empty: all of sizes(quick))
  bool rss = false;                ///< --rss: run_rss instead of the collectives (--csv: rss CSV)
  bool memcpy = false;             ///< --memcpy: run_memcpy (troupe_bench_worker only)
  int min_time_ms = 0;             ///< --min-time MS (run_config::min_time_ms)
};
/// Parses --csv F --quick --check-only --iters K --inprocess N --ranks N
/// --transport T --ops a,b --sizes 4B,1MiB --rss --memcpy --min-time MS; throws
/// std::invalid_argument on anything else.
worker_args parse_worker_args(int argc, char** argv);
/// The run_config of a worker's arguments.
run_config config_of(const worker_args& a, const std::string& system, const std::string& transport);

/// "4 B", "64 KiB", "16 MiB".
std::string size_label(std::size_t bytes);

/// The median of `v` (the mean of the middle two when its size is even).
double median(std::vector<double> v);

/// Prints the records of one run as a small table (rank 0 of a worker).
void print_records(const std::vector<record>& rows);

}  // namespace bench
