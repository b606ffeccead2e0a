// troupe-run — starts the ranks of a troupe job on this node, the way
// torchrun does for PyTorch:
//
//   troupe-run -n N [--nnodes M --node-rank K --master-addr A --master-port P]
//              [--grace-seconds S] [--] program args...
//
// Each of the N processes gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT and TROUPE_JOB_TOKEN (see <troupe/launch.hpp>); its
// output lines come out prefixed with "[RANK] "; SIGINT/SIGTERM are forwarded;
// when one rank fails the others are stopped and troupe-run exits with the
// failing rank's status. troupe-run serves the job's store itself (node 0),
// so that no rank's death takes it along (run/job_store.hpp). `troupe-run
// --help` says it all.

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "run/job.hpp"
#include "run/job_store.hpp"
#include "run/options.hpp"
#include "run/output.hpp"
#include "run/supervisor.hpp"

namespace {

using namespace troupe_run;

void say(const std::string& text) {
  write_all(2, "troupe-run: " + text + "\n");
}

/// Under mpirun or srun the job is already launched: run the program once,
/// in place of troupe-run, leaving the launcher's variables to the library.
[[noreturn]] void run_in_place(const options& o, const std::string& launched_by) {
  const bool ompi = launched_by.rfind("OMPI_", 0) == 0;
  say("warning: " + launched_by + " is set: the job was already launched by " +
      (ompi ? "mpirun" : "srun") + " and the library reads its variables itself, so -n " +
      std::to_string(o.nproc) + " is ignored and '" + o.program[0] +
      "' runs once, in place of troupe-run (start it without troupe-run to avoid this warning)");
  std::vector<char*> argv;
  for (const std::string& a : o.program) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  const int e = errno;
  say("cannot run '" + o.program[0] + "': " + strerror(e));
  std::exit(e == ENOENT ? 127 : 126);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    o = parse_options(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const usage_error& e) {
    write_all(2, std::string("troupe-run: ") + e.what() + "\n" + usage());
    return 2;
  }
  if (o.help) {
    write_all(1, help_text());
    return 0;
  }
  if (auto launched_by = launched_by_scheduler()) run_in_place(o, *launched_by);

  job j;
  j.nproc = o.nproc;
  j.nnodes = o.nnodes;
  j.node_rank = o.node_rank;
  j.master_addr = o.master_addr;
  store_host host = store_host::launcher;
  try {
    host = choose_store_host(o.node_rank);
  } catch (const std::invalid_argument& e) {
    say(e.what());
    return 2;
  }
  if (host == store_host::elsewhere && o.nnodes == 1 && o.master_port == 0) {
    say("TROUPE_STORE_EXTERNAL=1: the job's store is served by a process you run (troupe-store); "
        "pass its port with --master-port (and its host with --master-addr)");
    return 2;
  }
  j.store_external = store_external_value(host);
  std::unique_ptr<job_store> store;  // served until every rank is done with it
  try {
    if (const char* token = std::getenv("TROUPE_JOB_TOKEN"); token != nullptr && *token != 0) {
      j.token = token;
    } else if (o.nnodes > 1) {
      say("TROUPE_JOB_TOKEN is not set: with --nnodes " + std::to_string(o.nnodes) +
          " every node must be given the same token; set it on every node, e.g. "
          "export TROUPE_JOB_TOKEN=$(openssl rand -hex 16)");
      return 2;
    } else {
      j.token = make_token();
    }
    if (host == store_host::launcher) {
      // It listens where the ranks will connect, unless TROUPE_BIND_ADDR says otherwise.
      const char* bind = std::getenv("TROUPE_BIND_ADDR");
      store = std::make_unique<job_store>(bind != nullptr && *bind != 0 ? bind : o.master_addr,
                                          o.master_port, j.token);
      j.master_port = store->port();
    } else {
      j.master_port = o.master_port != 0 ? o.master_port : pick_free_port(o.master_addr);
    }
  } catch (const std::exception& e) {
    say(e.what());
    return 1;
  }

  std::vector<rank_spec> ranks;
  const auto cpus = rank_cpus(o.bind, o.nproc);
  for (int local = 0; local < o.nproc; ++local) {
    ranks.push_back(rank_spec{global_rank(j, local), o.program, rank_environment(j, local),
                              cpus[static_cast<std::size_t>(local)]});
  }
  // With other nodes, their ranks may still use the store after this node's ended.
  std::function<std::size_t()> store_users;
  if (store && o.nnodes > 1) store_users = [&store] { return store->clients(); };
  return supervise(ranks, o.grace_seconds, o.keep_going, store_users);
}
