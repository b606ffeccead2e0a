// bench_common — see bench_common.hpp.

#include "bench_common.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace bench {

const std::vector<op_kind>& all_ops() {
  static const std::vector<op_kind> ops = {op_kind::allreduce, op_kind::broadcast,
                                           op_kind::allgather, op_kind::reduce_scatter,
                                           op_kind::alltoall};
  return ops;
}

const std::vector<op_kind>& every_op() {
  static const std::vector<op_kind> ops = {
      op_kind::allreduce, op_kind::broadcast, op_kind::allgather, op_kind::reduce_scatter,
      op_kind::alltoall,  op_kind::reduce,    op_kind::gather,    op_kind::scatter,
      op_kind::barrier,   op_kind::pingpong,  op_kind::halo};
  return ops;
}

const char* op_name(op_kind op) {
  switch (op) {
    case op_kind::allreduce:
      return "allreduce";
    case op_kind::broadcast:
      return "broadcast";
    case op_kind::allgather:
      return "allgather";
    case op_kind::reduce_scatter:
      return "reduce_scatter";
    case op_kind::alltoall:
      return "alltoall";
    case op_kind::reduce:
      return "reduce";
    case op_kind::gather:
      return "gather";
    case op_kind::scatter:
      return "scatter";
    case op_kind::barrier:
      return "barrier";
    case op_kind::pingpong:
      return "pingpong";
    case op_kind::halo:
      return "halo";
  }
  return "?";
}

namespace {

/// The items `list` (comma-separated names) picks, in `all`'s order; `name`
/// gives an item's name, `flag` and `what` word the errors ("--ops",
/// "collective"). Throws std::invalid_argument naming an unknown name.
template <class T, class Name>
std::vector<T> pick(const std::vector<T>& all, const std::string& list, const char* flag,
                    const char* what, const Name& name) {
  std::string known;
  for (const auto& item : all) known += (known.empty() ? "" : ", ") + name(item);
  std::vector<bool> want(all.size(), false);
  std::istringstream is(list);
  bool any = false;
  for (std::string given; std::getline(is, given, ',');) {
    std::size_t i = 0;
    while (i < all.size() && name(given) != name(all[i])) ++i;
    if (i == all.size())
      throw std::invalid_argument(std::string(flag) + ": unknown " + what + " '" + given +
                                  "' in '" + list + "' (known: " + known + ")");
    want[i] = any = true;
  }
  if (!any || list.back() == ',')
    throw std::invalid_argument(std::string(flag) + ": expects a comma-separated list of " + known +
                                ", got '" + list + "'");
  std::vector<T> picked;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (want[i]) picked.push_back(all[i]);
  return picked;
}

}  // namespace

std::vector<op_kind> parse_ops(const std::string& list) {
  if (list == "all") return every_op();
  struct {
    std::string operator()(op_kind op) const { return op_name(op); }
    std::string operator()(const std::string& given) const { return given; }
  } name;
  try {
    return pick(every_op(), list, "--ops", "collective", name);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(e.what()) + "; or all");
  }
}

std::vector<std::size_t> parse_sizes(const std::string& list) {
  // Labels compare without spaces ("4 B" and "4B" alike).
  auto squeeze = [](std::string t) {
    t.erase(std::remove(t.begin(), t.end(), ' '), t.end());
    return t;
  };
  struct {
    decltype(squeeze) sq;
    std::string operator()(std::size_t bytes) const { return sq(size_label(bytes)); }
    std::string operator()(const std::string& given) const { return sq(given); }
  } name{squeeze};
  auto known = sizes(false);
  known.insert(known.begin() + 2, 8 << 10);  // halo's extra size, in order
  return pick(known, list, "--sizes", "size", name);
}

double bus_factor(op_kind op, int n) {
  switch (op) {
    case op_kind::allreduce:
      return 2.0 * (n - 1) / n;
    case op_kind::broadcast:
    case op_kind::reduce:
    case op_kind::pingpong:
      return 1.0;
    case op_kind::halo:
      return 2.0;
    case op_kind::barrier:
      return 0.0;
    default:
      return double(n - 1) / n;
  }
}

bool runs_with(op_kind op, int n) {
  if (op == op_kind::pingpong || op == op_kind::halo) return n >= 2;
  return true;
}

int calls_per_run(op_kind op) {
  return op == op_kind::pingpong ? 2 : 1;
}

std::vector<std::size_t> sizes(bool quick) {
  std::vector<std::size_t> s = {4, 1 << 10, 64 << 10, 1 << 20};
  if (!quick) {
    s.push_back(16 << 20);
    s.push_back(64 << 20);
  }
  return s;
}

std::vector<std::size_t> op_sizes(op_kind op, bool quick, const std::vector<std::size_t>& picked) {
  if (op == op_kind::barrier) return {0};
  if (!picked.empty()) return picked;
  auto s = sizes(quick);
  // halo: also 8 KiB, a typical boundary of a 2-D grid (a row of 2048 floats).
  if (op == op_kind::halo) s.insert(std::upper_bound(s.begin(), s.end(), 8 << 10), 8 << 10);
  return s;
}

layout make_layout(op_kind op, std::size_t nominal_bytes, int n) {
  const std::size_t count = std::max<std::size_t>(1, nominal_bytes / sizeof(float));
  const std::size_t block = std::max<std::size_t>(1, count / n);
  const std::size_t whole = block * n;
  layout l;
  switch (op) {
    case op_kind::allreduce:
    case op_kind::broadcast:
    case op_kind::reduce:
    case op_kind::pingpong:
      l = {count, count, count, count};
      break;
    case op_kind::allgather:
    case op_kind::gather:
      l = {block, whole, block, whole};
      break;
    case op_kind::reduce_scatter:
    case op_kind::scatter:
      l = {whole, block, block, whole};
      break;
    case op_kind::alltoall:
      l = {whole, whole, block, whole};
      break;
    case op_kind::barrier:
      l = {1, 1, 1, 0};  // one element, untouched: nothing moves
      break;
    case op_kind::halo:
      l = {count, 2 * count, count, count};
      break;
  }
  l.bytes *= sizeof(float);
  return l;
}

namespace {

/// Rank r's input element j: small integers, distinct per rank.
float pattern(int r, std::size_t j) {
  return float((r + 1) * 16 + int(j % 13));
}

/// The expected output element i on rank `me` of n.
float expected(op_kind op, int me, int n, const layout& l, std::size_t i) {
  switch (op) {
    case op_kind::allreduce:
    case op_kind::reduce: {
      float s = 0;
      for (int q = 0; q < n; ++q) s += pattern(q, i);
      return s;
    }
    case op_kind::broadcast:
      return pattern(0, i);
    case op_kind::allgather:
      return pattern(int(i / l.block), i % l.block);
    case op_kind::reduce_scatter: {
      float s = 0;
      for (int q = 0; q < n; ++q) s += pattern(q, me * l.block + i);
      return s;
    }
    case op_kind::alltoall:
      return pattern(int(i / l.block), me * l.block + i % l.block);
    case op_kind::gather:
      return pattern(int(i / l.block), i % l.block);
    case op_kind::scatter:
      return pattern(0, me * l.block + i);
    case op_kind::barrier:
      return pattern(me, i);  // the buffer is left as it was
    case op_kind::pingpong:
      return pattern(0, i);  // the partner: what rank 0 sent; rank 0: what came back
    case op_kind::halo: {
      // First the left neighbour's block, then the right one's.
      const bool left = i < l.block;
      return pattern((me + (left ? n - 1 : 1)) % n, left ? i : i - l.block);
    }
  }
  return 0;
}

}  // namespace

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

std::string size_label(std::size_t bytes) {
  char b[32];
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
    std::snprintf(b, sizeof b, "%zu MiB", bytes >> 20);
  else if (bytes >= 1024 && bytes % 1024 == 0)
    std::snprintf(b, sizeof b, "%zu KiB", bytes >> 10);
  else
    std::snprintf(b, sizeof b, "%zu B", bytes);
  return b;
}

void fill_input(op_kind op, int rank, const layout& l, float* in) {
  const bool sentinel =
      rank != 0 && (op == op_kind::broadcast || op == op_kind::scatter || op == op_kind::pingpong);
  for (std::size_t j = 0; j < l.in_elems; ++j) in[j] = sentinel ? -1.0f : pattern(rank, j);
}

std::size_t count_wrong(op_kind op, int rank, int n, const layout& l, const float* out,
                        std::string& first) {
  // Off the root, reduce's buffer and gather's output are undefined;
  // pingpong's ranks other than rank 0 and its partner wait.
  if (rank != 0 && (op == op_kind::reduce || op == op_kind::gather)) return 0;
  if (op == op_kind::pingpong && rank != 0 && rank != pingpong_partner(n)) return 0;
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < l.out_elems; ++i) {
    const float want = expected(op, rank, n, l, i);
    if (out[i] == want) continue;
    if (wrong++ == 0) {
      std::ostringstream os;
      os << op_name(op) << " of " << l.bytes << " B on rank " << rank << " of " << n << ": element "
         << i << " is " << out[i] << ", expected " << want;
      first = os.str();
    }
  }
  return wrong;
}

iteration_plan plan_for(std::size_t bytes, bool quick, int iters_override) {
  iteration_plan p;
  if (quick) p.warmup = 3;
  // Up to 1 MiB an iteration costs at most milliseconds: more of them steady
  // the median on a noisy machine. From 16 MiB each costs tens of ms: the
  // minimum of 20, after 2 warm-ups.
  p.iters = bytes <= (1u << 20) ? 50 : 20;
  if (bytes >= (16u << 20)) p.warmup = 2;
  if (iters_override > 0) p.iters = std::max(iters_override, 1);
  return p;
}

namespace {

/// Every system warms each size up for plan.warmup calls and at least
/// min_warm_up (rank 0's clock; the ranks agree when to stop): on these
/// virtual machines the first thousand or so small calls after a pause run
/// several times slower for every system (measured, 2 processes, ping-pong
/// one way, 50 calls after 5: troupe 8 KiB 13.4 us and 64 KiB 115 us,
/// OpenMPI 13.1 and 42.6 us; after 20-50 ms of warm-up 2.6-2.9, 4.6-4.9 and
/// 5.1, 15.9 us), and 5 calls of a few microseconds do not get past it.
constexpr std::chrono::milliseconds min_warm_up{30};

/// Small calls are timed for at least min_timed (run_config::min_time_ms
/// where set, and warmed up for half as long), in at most max_iters
/// iterations per 100 ms of it (never fewer than the plan's): at 2-4 ranks
/// per CPU a 4-byte call's median over 50 iterations moved by up to 45%
/// from one run to the next (4 emulated hosts x 2 ranks on 2 CPUs:
/// allreduce 512-758 us, barrier 346-518), over 400 by 10% (496-550,
/// 374-441). Where 4 ranks share a CPU, calls switch between a fast and a
/// slow pace in stretches of a hundred calls or more (2 emulated hosts x 2
/// ranks on one CPU, a 4-byte allreduce: 12-20 us or 130-180 us a call),
/// and a 64 KiB allreduce's first 200 or so calls took 1-2 ms, the rest
/// 50-250 us: 4 x 2 on 2 CPUs, its median over the default window was
/// 2.0-2.3 ms from run to run, timed for 600 ms after a longer warm-up
/// 1.07-1.09 ms in 3 of 3 runs (4 B 660-760 us).
constexpr std::chrono::milliseconds min_timed{100};
constexpr int max_iters = 1000;

/// Warms up, then says how many iterations to time: the plan's, or more
/// where the warm-up's calls (the slowest rank's, the same on every rank)
/// say they fit the timed window (min_timed, or `min_time_ms`).
int warm_up(const rank_runtime& rt, const prepared_op& p, const iteration_plan& plan, bool fixed,
            int min_time_ms) {
  using ms = std::chrono::milliseconds;
  const ms timed = min_time_ms > 0 ? ms(min_time_ms) : min_timed;
  const ms warm = min_time_ms > 0 ? std::max(min_warm_up, timed / 2) : min_warm_up;
  const double most = double(max_iters) * std::max<double>(1, double(timed.count()) / 100);
  const auto start = std::chrono::steady_clock::now();
  for (int it = 0;; ++it) {
    const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - start;
    std::vector<double> more{it < plan.warmup || spent < warm ? 1.0 : 0.0,
                             it > 0 ? spent.count() / it : 0.0};
    rt.max_all(more);
    if (more[0] == 0) {
      if (fixed || !(more[1] > 0)) return plan.iters;
      const double fit = std::chrono::duration<double>(timed).count() / more[1];
      return static_cast<int>(std::clamp(fit, double(plan.iters), most));
    }
    rt.barrier();
    p.run();
  }
}

}  // namespace

std::vector<record> run_rank(const rank_runtime& rt, const run_config& c) {
  using clock = std::chrono::steady_clock;
  std::vector<record> rows;
  for (op_kind op : c.ops.empty() ? all_ops() : c.ops) {
    if (!runs_with(op, rt.size)) {  // the same on every rank
      if (rt.rank == 0) {
        std::printf("%s/%s: %s skipped (>= 2 ranks only, this run has %d)\n", c.system.c_str(),
                    c.transport.c_str(), op_name(op), rt.size);
        std::fflush(stdout);
      }
      continue;
    }
    for (std::size_t nominal : op_sizes(op, c.quick, c.sizes)) {
      const layout l = make_layout(op, nominal, rt.size);
      prepared_op p = rt.prepare(op, l);
      if (!p.run) continue;  // not offered by this system (the same on every rank)

      // 1. Correctness: a known input, one call, every output element checked.
      fill_input(op, rt.rank, l, p.in);
      if (p.out != p.in) std::fill(p.out, p.out + l.out_elems, -2.0f);
      rt.barrier();
      p.run();
      std::string first;
      std::vector<double> wrong{double(count_wrong(op, rt.rank, rt.size, l, p.out, first))};
      if (wrong[0] > 0) std::fprintf(stderr, "WRONG: %s\n", first.c_str());
      rt.max_all(wrong);
      if (wrong[0] > 0)
        throw std::runtime_error(c.system + "/" + c.transport + " " + op_name(op) + " of " +
                                 std::to_string(l.bytes) + " B with " + std::to_string(rt.size) +
                                 " ranks: wrong result (see WRONG lines)");
      if (c.check_only) continue;

      // 2. Timing on zeros (the data does not grow over iterations): warm-up,
      //    then each iteration between a barrier and the call's return.
      std::memset(p.in, 0, l.in_elems * sizeof(float));
      if (p.out != p.in) std::memset(p.out, 0, l.out_elems * sizeof(float));
      const iteration_plan plan = plan_for(l.bytes, c.quick, c.iters);
      const int iters = warm_up(rt, p, plan, c.quick || c.iters > 0, c.min_time_ms);
      std::vector<double> us(static_cast<std::size_t>(iters));
      for (int it = 0; it < iters; ++it) {
        rt.barrier();
        const auto t0 = clock::now();
        p.run();
        const auto t1 = clock::now();
        us[it] = std::chrono::duration<double, std::micro>(t1 - t0).count();
      }
      // 3. An iteration takes as long as its slowest rank.
      rt.max_all(us);
      if (rt.rank != 0) continue;
      // pingpong: one timed call is a round trip, reported as one-way time.
      record r{c.system,
               c.transport,
               rt.size,
               op_name(op),
               l.bytes,
               iters,
               median(us) / calls_per_run(op),
               0,
               0};
      r.algbw = double(l.bytes) / (r.median_us * 1e-6) / 1e9;
      r.busbw = r.algbw * bus_factor(op, rt.size);
      rows.push_back(r);
    }
  }
  return rows;
}

std::vector<record> run_memcpy(bool quick, int iters_override) {
  using clock = std::chrono::steady_clock;
  std::vector<record> rows;
  for (std::size_t bytes : sizes(quick)) {
    const std::size_t elems = std::max<std::size_t>(1, bytes / sizeof(float));
    bytes = elems * sizeof(float);
    auto src = alloc_floats(elems), dst = alloc_floats(elems);
    for (std::size_t j = 0; j < elems; ++j) src.get()[j] = pattern(0, j);
    std::memset(dst.get(), 0, bytes);
    const iteration_plan plan = plan_for(bytes, quick, iters_override);
    std::vector<double> us(plan.iters);
    for (int it = 0; it < plan.warmup + plan.iters; ++it) {
      float* d = dst.get();
      const auto t0 = clock::now();
      std::memcpy(d, src.get(), bytes);
      asm volatile("" : : "r"(d) : "memory");  // the copy is used: keep it
      const auto t1 = clock::now();
      if (it >= plan.warmup)
        us[it - plan.warmup] = std::chrono::duration<double, std::micro>(t1 - t0).count();
    }
    if (std::memcmp(dst.get(), src.get(), bytes) != 0)
      throw std::runtime_error("memcpy of " + std::to_string(bytes) + " B: wrong copy");
    record r{"memcpy", "local", 1, "memcpy", bytes, plan.iters, median(us), 0, 0};
    r.algbw = r.busbw = double(bytes) / (r.median_us * 1e-6) / 1e9;
    rows.push_back(r);
  }
  return rows;
}

std::shared_ptr<float> alloc_floats(std::size_t elems) {
  const std::size_t huge = std::size_t(2) << 20;
  std::size_t bytes = std::max<std::size_t>(elems * sizeof(float), 64);
  const std::size_t align = bytes >= huge ? huge : 4096;
  bytes = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, bytes);
  if (!p) throw std::bad_alloc();
  if (align == huge) ::madvise(p, bytes, MADV_HUGEPAGE);
  return std::shared_ptr<float>(static_cast<float*>(p), [](float* q) { std::free(q); });
}

worker_args parse_worker_args(int argc, char** argv) {
  worker_args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(f + " expects a value");
      return argv[++i];
    };
    auto number = [&]() {
      const std::string v = value();
      std::size_t used = 0;
      int n = 0;
      try {
        n = std::stoi(v, &used);
      } catch (const std::exception&) {
      }
      if (used != v.size() || n < 1)
        throw std::invalid_argument(f + " expects a positive integer, got '" + v + "'");
      return n;
    };
    if (f == "--csv")
      a.csv = value();
    else if (f == "--quick")
      a.quick = true;
    else if (f == "--check-only")
      a.check_only = true;
    else if (f == "--iters")
      a.iters = number();
    else if (f == "--inprocess" || f == "--ranks")
      a.ranks = number();
    else if (f == "--transport")
      a.transport = value();
    else if (f == "--ops")
      a.ops = parse_ops(value());
    else if (f == "--sizes")
      a.sizes = parse_sizes(value());
    else if (f == "--rss")
      a.rss = true;
    else if (f == "--memcpy")
      a.memcpy = true;
    else if (f == "--min-time")
      a.min_time_ms = number();
    else
      throw std::invalid_argument("unknown argument '" + f + "'");
  }
  return a;
}

run_config config_of(const worker_args& a, const std::string& system,
                     const std::string& transport) {
  return {system, transport, a.quick, a.check_only, a.iters, a.ops, a.sizes, a.min_time_ms};
}

}  // namespace bench
