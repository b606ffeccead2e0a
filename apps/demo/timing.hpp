#pragma once
// Timing of troupe-demo: the collectives over a range of float32 sizes, with
// latency and bandwidth as nccl-tests defines them.

#include <cstddef>
#include <string>
#include <vector>

#include "troupe/world.hpp"

namespace demo {

struct timing_config {
  int iters = 20;      ///< timed iterations per size
  int warmup = 5;      ///< untimed iterations before them
  bool quick = false;  ///< sizes up to 1 MiB only
};

/// One row of the table.
struct timed_row {
  std::string op;
  double bus_factor = 1.0;  ///< nccl-tests' factor from algbw to busbw
  std::size_t bytes = 0;
  std::vector<double> us;  ///< per timed iteration: the slowest rank's time
};

/// Times every collective on this rank (every rank of the world calls it, in
/// any process). Each rank keeps its own times; at the end one reduce MAX
/// brings the slowest rank's time of every iteration to rank 0, which returns
/// the table; the other ranks return an empty one.
std::vector<timed_row> run_benchmarks(troupe::world& w, const timing_config& c);

/// Prints the table: per row the median over iterations of the slowest rank's time.
void print_table(const timing_config& c, const std::vector<timed_row>& rows);

}  // namespace demo
