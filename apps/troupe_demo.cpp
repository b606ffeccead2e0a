// troupe-demo — the main job: runs every collective once and checks each
// result against values computed locally (apps/demo/verify.cpp), then times
// the collectives over a range of float32 sizes and prints latency and
// bandwidth with the definitions of nccl-tests (apps/demo/timing.cpp).
//
//   troupe-demo [--ranks N] [--iters K] [--quick] [--trace FILE]  N in-process ranks (one
//       troupe::world each, on its own thread, over one shared hash_store)
//   troupe-run -n N troupe-demo [--iters K] [--quick] one rank per process
//       (the world from troupe::init_world(); also under mpirun or srun)
//
// --trace FILE writes the verification's calls of every rank as a Chrome /
// Perfetto trace (troupe/flight_recorder.hpp): one track per rank.
//
// The time of an iteration is the slowest rank's, brought to rank 0 with a
// reduce MAX; only rank 0 prints. Exits non-zero, with a message naming the
// collective, the rank and the element, when any result on any rank is wrong.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "demo/timing.hpp"
#include "demo/verify.hpp"
#include "troupe/launch.hpp"
#include "troupe/object_collectives.hpp"
#include "troupe/testing.hpp"
#include "troupe/troupe.hpp"

namespace {

using demo::max_ranks;

struct config {
  int ranks = 4;
  bool ranks_given = false;
  std::string trace;  // --trace FILE
  demo::timing_config timing;
};

void usage(const char* argv0, std::ostream& os) {
  os << "usage: " << argv0 << " [--ranks N] [--iters K] [--quick]\n"
     << "  --ranks N   number of in-process ranks (1.." << max_ranks << ", default 4)\n"
     << "  --iters K   timed iterations per size, after warm-up (default 20)\n"
     << "  --quick     time sizes up to 1 MiB only\n"
     << "  --trace F   write the verification's calls as a Chrome/Perfetto trace to F\n"
     << "Under a launcher (troupe-run -n N " << argv0
     << " ..., mpirun, srun) each process runs one rank\n"
     << "of the launched job instead, and --ranks must be left out.\n";
}

int parse_int(const std::string& flag, const char* text) {
  try {
    std::size_t used = 0;
    int v = std::stoi(text, &used);
    if (used == std::string(text).size()) return v;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(flag + " expects an integer, got '" + text + "'");
}

config parse(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) throw std::invalid_argument(a + " expects a value");
      return argv[++i];
    };
    if (a == "--ranks") {
      c.ranks = parse_int(a, value());
      c.ranks_given = true;
    } else if (a == "--iters") {
      c.timing.iters = parse_int(a, value());
    } else if (a == "--quick") {
      c.timing.quick = true;
    } else if (a == "--trace") {
      c.trace = value();
      if (c.trace.empty()) throw std::invalid_argument("--trace expects a file name");
    } else if (a == "--help" || a == "-h") {
      usage(argv[0], std::cout);
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown argument '" + a + "'");
    }
  }
  if (c.ranks < 1 || c.ranks > max_ranks)
    throw std::invalid_argument("--ranks " + std::to_string(c.ranks) + " is outside 1.." +
                                std::to_string(max_ranks));
  if (c.timing.iters < 1)
    throw std::invalid_argument("--iters " + std::to_string(c.timing.iters) + " is < 1");
  if (c.timing.quick) c.timing.warmup = 3;
  return c;
}

/// Whether a launcher started this process as one rank of a job (the same
/// variables troupe::read_launch_env() and run_ranks look at).
std::string transport_name() {
  const char* t = std::getenv("TROUPE_TRANSPORT");
  return t && *t ? t : "auto";
}

/// The default: c.ranks ranks on threads of this process.
int run_in_process(const config& c) {
  std::printf("troupe-demo: %d in-process ranks, backend \"actor\"%s\n", c.ranks,
              c.timing.quick ? ", quick" : "");
  std::fflush(stdout);
  troupe::testing::run_options opts;
  opts.timeout = std::chrono::seconds(120);

  // 1. Every collective once, checked against values computed locally.
  int failed = 0;
  std::vector<std::vector<troupe::flight_entry>> calls(static_cast<std::size_t>(c.ranks));
  try {
    troupe::testing::run_ranks(
        c.ranks,
        [&](troupe::world& w) {
          const int f = demo::verify(w);
          if (w.rank() == 0) failed = f;  // the same on every rank
          calls[static_cast<std::size_t>(w.rank())] = w.flight_record();
        },
        opts);
    if (!c.trace.empty()) {
      troupe::write_chrome_trace(c.trace, calls);
      std::printf("trace: %s (open it in ui.perfetto.dev)\n", c.trace.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "verification FAILED: %s\n", e.what());
    return 1;
  }
  if (failed > 0) {
    std::fprintf(stderr, "verification FAILED: %d of %zu checks\n", failed, demo::check_count());
    return 1;
  }
  std::printf("verification: all collectives correct (%zu checks on %d ranks)\n",
              demo::check_count(), c.ranks);
  std::fflush(stdout);

  // 2. Timing.
  std::vector<demo::timed_row> rows;
  try {
    troupe::testing::run_ranks(
        c.ranks,
        [&](troupe::world& w) {
          auto r = demo::run_benchmarks(w, c.timing);
          if (w.rank() == 0) rows = std::move(r);
        },
        opts);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "timing FAILED: %s\n", e.what());
    return 1;
  }
  demo::print_table(c.timing, rows);
  return 0;
}

/// Under a launcher: this process is one rank of the launched job.
int run_launched(const config& c) {
  std::unique_ptr<troupe::world> w;
  try {
    troupe::init_options io;
    io.timeout = std::chrono::seconds(120);
    w = troupe::init_world(io);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe-demo: cannot join the launched job: %s\n", e.what());
    return 1;
  }
  const int n = w->size(), me = w->rank();
  if (n > max_ranks) {
    std::fprintf(stderr, "troupe-demo: %d ranks launched; at most %d are supported\n", n,
                 max_ranks);
    return 2;
  }
  if (me == 0)
    std::printf("troupe-demo: %d ranks, one per process (transport %s), backend \"actor\"%s\n", n,
                transport_name().c_str(), c.timing.quick ? ", quick" : "");
  std::fflush(stdout);

  // 1. Every collective once; the ranks agree on the outcome of each check.
  int failed = 0;
  try {
    failed = demo::verify(*w);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "verification FAILED on rank %d: %s\n", me, e.what());
    return 1;  // leaving fails the other ranks' calls that wait for this one
  }
  if (failed > 0) {
    if (me == 0)
      std::fprintf(stderr, "verification FAILED: %d of %zu checks\n", failed, demo::check_count());
    return 1;
  }
  if (me == 0)
    std::printf("verification: all collectives correct (%zu checks on %d ranks)\n",
                demo::check_count(), n);
  if (!c.trace.empty()) {
    try {
      auto calls = troupe::gather_object(w->default_group(), w->flight_record(), 0);
      if (me == 0) {
        troupe::write_chrome_trace(c.trace, calls);
        std::printf("trace: %s (open it in ui.perfetto.dev)\n", c.trace.c_str());
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "troupe-demo: the trace FAILED on rank %d: %s\n", me, e.what());
      return 1;
    }
  }
  std::fflush(stdout);

  // 2. Timing.
  try {
    auto rows = demo::run_benchmarks(*w, c.timing);
    if (me == 0) demo::print_table(c.timing, rows);
    std::fflush(stdout);
    w->default_group().barrier().wait();  // leave together
  } catch (const std::exception& e) {
    std::fprintf(stderr, "timing FAILED on rank %d: %s\n", me, e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  try {
    c = parse(argc, argv);
    if (troupe::launched_by_launcher() && c.ranks_given)
      throw std::invalid_argument(
          "--ranks does not apply under a launcher: the launcher's -n sets the rank count");
  } catch (const std::exception& e) {
    std::cerr << "troupe-demo: " << e.what() << "\n";
    usage(argv[0], std::cerr);
    return 2;
  }
  return troupe::launched_by_launcher() ? run_launched(c) : run_in_process(c);
}
