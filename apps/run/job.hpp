#pragma once
/// What every rank of one troupe-run is told: the environment variables of
/// include/troupe/launch.hpp, and how their defaults are found.

#include <optional>
#include <string>
#include <vector>

namespace troupe_run {

struct job {
  int nproc = 1;  ///< ranks on this node (LOCAL_WORLD_SIZE)
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;
  int master_port = 0;
  std::string token;  ///< TROUPE_JOB_TOKEN
  /// TROUPE_STORE_EXTERNAL: "1" when no rank hosts the store (troupe-run
  /// or the user's store serves it), "0" when rank 0 does.
  std::string store_external = "1";
};

/// 32 hex characters from /dev/urandom. Throws std::runtime_error.
std::string make_token();

/// A port that was free on `addr`, for rank 0's store (TROUPE_STORE_EXTERNAL=0):
/// binds port 0 there and reads the port the system chose, keeping it bound
/// (never listening) while troupe-run runs. Throws std::runtime_error naming addr.
int pick_free_port(const std::string& addr);

/// When this process was itself started by mpirun or srun, the variable that
/// says so, as "NAME=value"; else nothing.
std::optional<std::string> launched_by_scheduler();

/// The environment of the rank with `local_rank` on this node: this process's
/// environment with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
/// MASTER_ADDR, MASTER_PORT, TROUPE_JOB_TOKEN and TROUPE_STORE_EXTERNAL
/// replaced, as "NAME=value".
std::vector<std::string> rank_environment(const job& j, int local_rank);

/// The CPU each local rank is bound to under `bind` ("auto", "core",
/// "none"; see --bind), from the CPUs this process may use; -1: not bound.
std::vector<int> rank_cpus(const std::string& bind, int nproc);

/// RANK of the process with `local_rank` on this node.
inline int global_rank(const job& j, int local_rank) {
  return j.node_rank * j.nproc + local_rank;
}

}  // namespace troupe_run
