#pragma once
/// Starting a rank the way distributed jobs are started: rank and size from
/// the launcher's environment, the store from an init method, the world from both.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "troupe/store.hpp"
#include "troupe/world.hpp"

namespace troupe {

/// What the environment says about this process.
struct launch_env {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  std::string master_addr;        ///< empty when not set
  std::uint16_t master_port = 0;  ///< 0 when not set
  std::string token;              ///< TROUPE_JOB_TOKEN, may be empty
  /// Which convention provided rank and size: "troupe-run/torchrun" (RANK,
  /// WORLD_SIZE, LOCAL_RANK), "mpirun" (OMPI_COMM_WORLD_*), "srun" (SLURM_*).
  std::string source;
};

/// Reads RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT, else
/// OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK, else SLURM_PROCID /
/// SLURM_NTASKS / SLURM_LOCALID. A missing, malformed or contradictory
/// variable (e.g. RANK >= WORLD_SIZE, or RANK and OMPI_COMM_WORLD_RANK
/// disagreeing) is errc::invalid_argument naming the variable.
launch_env read_launch_env();

/// A store from an init method: "env://" (TCP store at MASTER_ADDR:MASTER_PORT,
/// served by rank 0 unless TROUPE_STORE_EXTERNAL=1: troupe-run sets it, as it
/// serves the store of the ranks it starts), "tcp://host:port"
/// (served by rank 0 likewise), "file:///path" (file_store). Anything else is
/// errc::invalid_argument naming the method.
std::shared_ptr<store> make_store(const std::string& init_method, const launch_env& env,
                                  std::chrono::milliseconds timeout);

struct init_options {
  std::string backend = "actor";
  std::string init_method = "env://";
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
};

/// The world of this process's rank, from the environment and the init method.
std::unique_ptr<world> init_world(const init_options& opts = {});

/// Whether a launcher started this process as one rank of a job: RANK
/// (troupe-run, torchrun), OMPI_COMM_WORLD_RANK (mpirun) or SLURM_PROCID
/// (srun) is set.
bool launched_by_launcher();

/// Runs a program's ranks either way it may be started: when a launcher
/// started this process, `body(w, true)` in its world (init_world(opts)),
/// then a barrier, so no rank leaves while another still runs; else
/// `body(w, false)` for `ranks` ranks as threads of this process
/// (testing::run_ranks, each rank's timeout opts.timeout). Rethrows the
/// first failure.
void run_job(int ranks, const std::function<void(world&, bool launched)>& body,
             const init_options& opts = {});

}  // namespace troupe
