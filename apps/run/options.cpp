#include "run/options.hpp"

#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <optional>

namespace troupe_run {

namespace {

int parse_int(const std::string& option, const std::string& text, int lo, int hi) {
  int value = 0;
  const char* first = text.data();
  const char* last = first + text.size();
  auto [end, ec] = std::from_chars(first, last, value);
  if (text.empty() || ec != std::errc{} || end != last || value < lo || value > hi) {
    throw usage_error("invalid value '" + text + "' for " + option + ": expected an integer from " +
                      std::to_string(lo) + " to " + std::to_string(hi));
  }
  return value;
}

double parse_seconds(const std::string& option, const std::string& text) {
  char* end = nullptr;
  double value = text.empty() ? -1.0 : std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value) || value < 0 ||
      value > 86400) {
    throw usage_error("invalid value '" + text + "' for " + option +
                      ": expected a number of seconds from 0 to 86400");
  }
  return value;
}

}  // namespace

options parse_options(const std::vector<std::string>& args) {
  options o;
  bool have_nproc = false;
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program starts here
    std::string name = arg;
    std::optional<std::string> inline_value;
    if (arg.rfind("--", 0) == 0) {
      if (auto eq = arg.find('='); eq != std::string::npos) {
        name = arg.substr(0, eq);
        inline_value = arg.substr(eq + 1);
      }
    } else if (arg.size() > 2 && arg[1] == 'n') {  // -n4
      name = "-n";
      inline_value = arg.substr(2);
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) throw usage_error("option " + name + " needs a value");
      return args[++i];
    };
    if (name == "-h" || name == "--help") {
      o.help = true;
      return o;
    } else if (name == "-n" || name == "--nproc-per-node") {
      o.nproc = parse_int(name, value(), 1, 65536);
      have_nproc = true;
    } else if (name == "--nnodes") {
      o.nnodes = parse_int(name, value(), 1, 65536);
    } else if (name == "--node-rank") {
      o.node_rank = parse_int(name, value(), 0, 65535);
    } else if (name == "--master-addr") {
      o.master_addr = value();
      if (o.master_addr.empty()) throw usage_error("invalid value '' for --master-addr");
    } else if (name == "--master-port") {
      o.master_port = parse_int(name, value(), 1, 65535);
    } else if (name == "--grace-seconds") {
      o.grace_seconds = parse_seconds(name, value());
    } else if (name == "--keep-going") {
      o.keep_going = true;
    } else if (name == "--bind") {
      o.bind = value();
      if (o.bind != "auto" && o.bind != "core" && o.bind != "none")
        throw usage_error("invalid value '" + o.bind + "' for --bind: expected auto, core or none");
    } else {
      throw usage_error("unknown option '" + arg + "'");
    }
  }
  o.program.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());

  if (!have_nproc) throw usage_error("missing -n N: the number of processes to start");
  if (o.program.empty()) throw usage_error("missing the program to run (after the options)");
  if (o.node_rank >= o.nnodes) {
    throw usage_error("invalid value '" + std::to_string(o.node_rank) +
                      "' for --node-rank: must be below --nnodes " + std::to_string(o.nnodes));
  }
  if (static_cast<long long>(o.nproc) * o.nnodes > INT_MAX) {
    throw usage_error("-n " + std::to_string(o.nproc) + " times --nnodes " +
                      std::to_string(o.nnodes) + " is too many ranks");
  }
  if (o.nnodes > 1 && o.master_port == 0) {
    throw usage_error("--master-port is required with --nnodes " + std::to_string(o.nnodes) +
                      ": every node must be given the same port of the job's store");
  }
  return o;
}

std::string usage() {
  return "Usage: troupe-run -n N [--nnodes M --node-rank K --master-addr A --master-port P]\n"
         "                  [--grace-seconds S] [--bind auto|core|none] [--keep-going]\n"
         "                  [--] program [args...]\n"
         "Run 'troupe-run --help' for details.\n";
}

std::string help_text() {
  return R"(Usage: troupe-run -n N [--nnodes M --node-rank K --master-addr A --master-port P]
                  [--grace-seconds S] [--bind auto|core|none] [--keep-going]
                  [--] program [args...]

Starts N processes of `program args...` on this node as ranks of one troupe
job, prefixes their output with their rank and supervises them.

Options:
  -n, --nproc-per-node N  processes to start on this node (required, N >= 1)
  --nnodes M              nodes in the job (default 1): run troupe-run once on
                          each node with the same N, --master-addr, --master-port
  --node-rank K           this node's index, 0 <= K < M (default 0)
  --master-addr A         host of the job's store, node 0 (default 127.0.0.1)
  --master-port P         port of the job's store; by default a free port is
                          picked, which needs --nnodes 1: with more nodes
                          --master-port is required
  --grace-seconds S       seconds the ranks get to exit after SIGTERM before
                          they are killed with SIGKILL (default 5)
  --bind B                where the ranks may run: "core" binds local rank i
                          to the i-th CPU this process may use (round robin
                          when there are more ranks than CPUs); "none" leaves
                          them to the scheduler; "auto" (default) is "core".
                          Two ranks that the scheduler puts on one CPU wait
                          for each other's time slices (mpirun binds too);
                          with more ranks than CPUs, ranks that poll and
                          yield are left on one CPU by the scheduler for
                          long stretches while another idles
  --keep-going            a rank that fails or is killed does not stop the
                          others (for programs that recover, e.g. with
                          world::shrink); see Exit status
  -h, --help              print this help and exit
  --                      ends the options (the program may start with '-')

Environment of each rank (what troupe::init_world() reads):
  RANK = K*N + local index, WORLD_SIZE = N*M, LOCAL_RANK = local index,
  LOCAL_WORLD_SIZE = N, MASTER_ADDR, MASTER_PORT, TROUPE_STORE_EXTERNAL=1,
  and TROUPE_JOB_TOKEN: kept when already set, else 32 random hex
  characters. With --nnodes > 1 set the same TROUPE_JOB_TOKEN on every node
  before starting troupe-run.

The job's store: troupe-run on node 0 serves it (at --master-addr, or
TROUPE_BIND_ADDR when set, and --master-port), so that the job's shared
state outlives any rank: with --keep-going the survivors of a killed rank,
rank 0 included, can still agree (world::shrink). When its own ranks have
ended, troupe-run on node 0 serves on while other nodes' ranks still use it.
TROUPE_STORE_EXTERNAL in troupe-run's environment chooses otherwise: 1, a
store you run (troupe-store) at --master-addr:--master-port serves it;
0, rank 0 hosts it (the ranks then get TROUPE_STORE_EXTERNAL=0).

Output: each line a rank writes is printed as "[RANK] line", its stdout to
stdout and its stderr to stderr.

Signals: SIGINT, SIGTERM and SIGHUP are forwarded to every rank's process
group (each rank runs in its own, so its children get them too); ranks still
running after the grace period are killed.

Failures: when a rank exits non-zero or is killed by a signal, the other ranks
get SIGTERM, then SIGKILL after the grace period, and troupe-run exits with
the first failing rank's exit code (128+S when it was killed by signal S).

Exit status: 0 when every rank exits 0; the first failing rank's status;
with --keep-going, ranks killed by a signal are reported but do not count
(the job went on without them): 0 when every other rank exits 0;
128+S when troupe-run itself was stopped by signal S; 2 for a bad command line.

mpirun and srun: troupe-run is not needed under them. The library reads
OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK and SLURM_PROCID/_NTASKS/_LOCALID
directly, so start the program itself:  mpirun -n 4 program args...
When troupe-run finds OMPI_COMM_WORLD_SIZE or SLURM_NTASKS set, the job is
already launched: it warns, ignores -n and runs the program once in its place,
so `mpirun -n 4 troupe-run -n 1 program` still runs 4 ranks.
)";
}

}  // namespace troupe_run
