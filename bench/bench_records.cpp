// bench_common (bench_common.hpp): the records — the peak memory a run
// holds (--rss), the CSV files of records and of peaks, and the table
// they print.

#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "bench_common.hpp"

namespace bench {

namespace {

/// A "Vm...:  N kB" field of /proc/self/status in bytes (0 when absent).
std::size_t proc_status_bytes(const char* field) {
  std::ifstream f("/proc/self/status");
  const std::string prefix = std::string(field) + ":";
  for (std::string line; std::getline(f, line);)
    if (line.rfind(prefix, 0) == 0) return std::stoull(line.substr(prefix.size())) * 1024;
  return 0;
}

/// The process's peak resident set size in bytes: VmHWM, else ru_maxrss.
std::size_t peak_rss_bytes() {
  if (const std::size_t hwm = proc_status_bytes("VmHWM")) return hwm;
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return std::size_t(u.ru_maxrss) * 1024;
}

}  // namespace

rss_record run_rss(const rank_runtime& rt, const run_config& c, std::size_t tensor_bytes) {
  // 1. Baseline: what the process holds once the world is up, before the
  //    tensor exists; then the high-water mark restarts from there (Linux
  //    >= 4.0; where clear_refs is refused the peak includes start-up's).
  rt.barrier();
  const std::size_t baseline = proc_status_bytes("VmRSS");
  rt.barrier();
  std::ofstream("/proc/self/clear_refs") << "5";
  rt.barrier();

  // 2. The tensor (the system's own allocation) and a few checked allreduces.
  std::size_t peak = 0;
  const layout l = make_layout(op_kind::allreduce, tensor_bytes, rt.size);
  {
    prepared_op p = rt.prepare(op_kind::allreduce, l);
    if (!p.run) throw std::runtime_error(c.system + "/" + c.transport + ": no allreduce");
    for (int it = 0; it < 3; ++it) {
      fill_input(op_kind::allreduce, rt.rank, l, p.in);
      rt.barrier();
      p.run();
      std::string first;
      std::vector<double> wrong{
          double(count_wrong(op_kind::allreduce, rt.rank, rt.size, l, p.out, first))};
      if (wrong[0] > 0) std::fprintf(stderr, "WRONG: %s\n", first.c_str());
      rt.max_all(wrong);
      if (wrong[0] > 0)
        throw std::runtime_error(c.system + "/" + c.transport + " allreduce of " +
                                 std::to_string(l.bytes) + " B with " + std::to_string(rt.size) +
                                 " ranks (--rss): wrong result (see WRONG lines)");
    }
    rt.barrier();
    peak = peak_rss_bytes();
  }

  // 3. The largest of every rank.
  std::vector<double> v{double(baseline), double(peak)};
  rt.max_all(v);
  rss_record r;
  if (rt.rank != 0) return r;
  r = {c.system, c.transport, rt.size, l.bytes, std::size_t(v[0]), std::size_t(v[1])};
  return r;
}

void append_rss_csv(const std::string& path, const rss_record& r) {
  const bool fresh = !std::ifstream(path).good();
  std::ofstream f(path, std::ios::app);
  if (!f) throw std::runtime_error("cannot write " + path);
  if (fresh) f << "system,transport,ranks,tensor_bytes,baseline_bytes,peak_bytes\n";
  f << r.system << ',' << r.transport << ',' << r.ranks << ',' << r.tensor_bytes << ','
    << r.baseline_bytes << ',' << r.peak_bytes << '\n';
}

namespace {

/// Calls `row(cells)` for every data line of a CSV file written by this file
/// (header lines skipped); throws naming the file on a line without `cells` cells.
template <class F>
void read_rows(const std::string& path, std::size_t cells, F row) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::string line;
  std::getline(f, line);  // header
  while (std::getline(f, line)) {
    if (line.empty() || line.rfind("system,", 0) == 0) continue;
    std::istringstream is(line);
    std::vector<std::string> v;
    for (std::string cell; std::getline(is, cell, ',');) v.push_back(cell);
    if (v.size() != cells) throw std::runtime_error(path + ": malformed line '" + line + "'");
    row(v);
  }
}

}  // namespace

std::vector<rss_record> read_rss_csv(const std::string& path) {
  std::vector<rss_record> rows;
  read_rows(path, 6, [&](const std::vector<std::string>& v) {
    rows.push_back(
        {v[0], v[1], std::stoi(v[2]), std::stoull(v[3]), std::stoull(v[4]), std::stoull(v[5])});
  });
  return rows;
}

void report_rss(const rank_runtime& rt, const run_config& c, const std::string& csv) {
  const auto r = run_rss(rt, c);
  if (rt.rank != 0) return;
  print_rss(r);
  if (!csv.empty()) append_rss_csv(csv, r);
}

void print_rss(const rss_record& r) {
  const double mib = 1 << 20, t = double(r.tensor_bytes);
  std::printf(
      "%s/%s, %d ranks: allreduce of %s, peak RSS %.1f MiB (%.2fx tensor), baseline %.1f MiB, "
      "peak - baseline %.1f MiB (%.2fx tensor)%s\n",
      r.system.c_str(), r.transport.c_str(), r.ranks, size_label(r.tensor_bytes).c_str(),
      r.peak_bytes / mib, r.peak_bytes / t, r.baseline_bytes / mib,
      (double(r.peak_bytes) - double(r.baseline_bytes)) / mib,
      (double(r.peak_bytes) - double(r.baseline_bytes)) / t,
      r.transport == "inproc" ? " [one process: all ranks together]" : "");
  std::fflush(stdout);
}

void append_csv(const std::string& path, const std::vector<record>& rows) {
  const bool fresh = !std::ifstream(path).good();
  std::ofstream f(path, std::ios::app);
  if (!f) throw std::runtime_error("cannot write " + path);
  if (fresh) f << "system,transport,ranks,op,bytes,iters,median_us,algbw_gbps,busbw_gbps\n";
  char line[256];
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "%s,%s,%d,%s,%zu,%d,%.3f,%.6g,%.6g\n", r.system.c_str(),
                  r.transport.c_str(), r.ranks, r.op.c_str(), r.bytes, r.iters, r.median_us,
                  r.algbw, r.busbw);
    f << line;
  }
}

std::vector<record> read_csv(const std::string& path) {
  std::vector<record> rows;
  read_rows(path, 9, [&](const std::vector<std::string>& v) {
    rows.push_back({v[0], v[1], std::stoi(v[2]), v[3], std::stoull(v[4]), std::stoi(v[5]),
                    std::stod(v[6]), std::stod(v[7]), std::stod(v[8])});
  });
  return rows;
}

void print_records(const std::vector<record>& rows) {
  for (const auto& r : rows)
    std::printf("%-7s %-7s n=%d %-15s %10s %12.2f us %9.3f GB/s busbw\n", r.system.c_str(),
                r.transport.c_str(), r.ranks, r.op.c_str(), size_label(r.bytes).c_str(),
                r.median_us, r.busbw);
  std::fflush(stdout);
}

}  // namespace bench
