#pragma once
/// Running the ranks of one node: starting them, prefixing their output,
/// forwarding signals to them and stopping them all when one fails.

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace troupe_run {

struct rank_spec {
  int rank = 0;                   ///< printed as the "[RANK] " prefix
  std::vector<std::string> argv;  ///< argv[0] is looked up in PATH
  std::vector<std::string> env;   ///< the whole environment, "NAME=value"
  int cpu = -1;                   ///< the CPU the process is bound to (-1: any)
};

/// Starts one process per spec, each in its own process group, and returns
/// when all have exited: 0 when every one exited 0, else the status of the
/// first one that failed (its exit code, or 128+S for signal S), or 128+S when
/// troupe-run itself got signal S (which it forwarded). Ranks still running
/// `grace_seconds` after being told to stop get SIGKILL.
/// With `keep_going`, a failing rank does not stop the others, and ranks
/// killed by a signal do not set the status (the job recovered without them).
/// With `store_users` (the connections to the store this troupe-run serves),
/// it returns only once they are gone too, or on SIGINT/SIGTERM/SIGHUP:
/// ranks of other nodes may still use the store after this node's ended.
int supervise(const std::vector<rank_spec>& ranks, double grace_seconds, bool keep_going = false,
              const std::function<std::size_t()>& store_users = {});

}  // namespace troupe_run
