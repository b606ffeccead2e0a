#pragma once
// report_common — what the collectives benchmark's report (report.cpp) and its
// targets (report_targets.cpp) share: the systems' columns, the cells of the
// CSV by (op, ranks, size), the limits the machine measured, a target's row.

#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bench_common.hpp"

namespace report {

/// The systems in column order: CSV (system, transport) -> column label.
inline const std::vector<std::pair<std::string, std::string>> columns = {
    {"troupe-inproc", "troupe inproc"},
    {"troupe-shm", "troupe shm"},
    {"troupe-shmstaged", "troupe staged"},
    {"troupe-tcp", "troupe tcp"},
    {"gloo-tcp", "gloo tcp"},
    {"mpi-shm", "mpi shm"},
    {"mpi-tcp", "mpi tcp"}};

using key = std::tuple<std::string, int, std::size_t>;  // op, ranks, bytes
using cell_map = std::map<key, std::map<std::string, bench::record>>;
using memcpy_map = std::map<std::size_t, bench::record>;   // bytes -> memcpy's record
using ceiling_key = std::pair<int, std::size_t>;           // ranks, bytes
using ceiling_map = std::map<ceiling_key, bench::record>;  // -> tcp-ceiling's record

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

/// NaN when the system has no row for this cell.
inline double time_of(const std::map<std::string, bench::record>& row, const std::string& sys) {
  auto it = row.find(sys);
  return it == row.end() ? NAN : it->second.median_us;
}

inline double busbw_of(const std::map<std::string, bench::record>& row, const std::string& sys) {
  auto it = row.find(sys);
  return it == row.end() ? NAN : it->second.busbw;
}

inline std::string fmt(const char* f, double v) {
  if (std::isnan(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

/// The performance targets, each against this run's numbers; `note` (a line
/// of its own below the target) says what the machine allows.
struct target_row {
  std::string what, measured, goal, status, note;
  std::string heading = "";  ///< printed on a line of its own before the row
};

/// What the machine allows, measured in the same run.
struct limits {
  ceiling_map tcp;  ///< raw TCP exchange of 2 processes, or ring of more (tcp_exchange)
  std::map<int, bench::record> barrier;  ///< ranks -> flag_barrier's record
  const memcpy_map* memcpy = nullptr;
  int cpus = 1;  ///< CPUs the ranks share

  /// The least time (µs) of an allreduce of `bytes` over n ranks that share
  /// `cpus` CPUs, from memory bandwidth: each rank reads its input and writes
  /// its output, a memcpy of `bytes` at the least, and at most `cpus` of
  /// those run at once. Only from 1 MiB (below, fixed costs dominate).
  std::optional<double> memory_us(int n, std::size_t bytes) const {
    if (bytes < MiB || !memcpy) return std::nullopt;
    auto m = memcpy->find(bytes);
    if (m == memcpy->end()) return std::nullopt;
    return n * m->second.median_us / std::min(n, std::max(cpus, 1));
  }
  std::string memory_text(int n, std::size_t bytes) const {
    auto m = memcpy->find(bytes);
    char b[96];
    std::snprintf(b, sizeof b, "bound (memory bandwidth, %d ranks x memcpy %.4g us / %d CPUs)", n,
                  m->second.median_us, std::min(n, std::max(cpus, 1)));
    return b;
  }
};

/// The record of one system (CSV system-transport) in one cell, if measured.
inline std::optional<bench::record> find(const cell_map& cells, const std::string& op, int n,
                                         std::size_t bytes, const std::string& sys) {
  auto it = cells.find({op, n, bytes});
  if (it == cells.end()) return std::nullopt;
  auto r = it->second.find(sys);
  if (r == it->second.end()) return std::nullopt;
  return r->second;
}

/// Per-rank share of an RSS line: one process holds every rank in-process.
inline double per_rank(const bench::rss_record& r, std::size_t v) {
  return r.transport == "inproc" ? double(v) / r.ranks : double(v);
}

/// The performance targets against this run (cells, memcpy's rows, what the
/// machine allows, the peak memory where measured): each one's measured
/// value, goal and status, then how many were met, missed, not measured.
void print_targets(const cell_map& cells, const memcpy_map& memcpy, const limits& lim,
                   const std::optional<std::vector<bench::rss_record>>& rss);

}  // namespace report
