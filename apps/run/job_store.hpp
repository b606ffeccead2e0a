#pragma once
/// Who serves the job's store, and the store troupe-run serves itself.
///
/// troupe-run serves the store of the jobs it starts (on node 0 with
/// --nnodes), as torchrun's agent does, so that no rank's death takes the
/// job's shared state with it: ranks killed under --keep-going, rank 0
/// included, leave survivors that can still agree (world::shrink). The
/// ranks are told so with TROUPE_STORE_EXTERNAL=1. TROUPE_STORE_EXTERNAL in
/// troupe-run's own environment chooses otherwise: 1, a store the user runs
/// (troupe-store) at --master-addr:--master-port; 0, rank 0 hosts it.

#include <cstddef>
#include <memory>
#include <string>

namespace troupe {
class tcp_store_server;
}

namespace troupe_run {

enum class store_host {
  launcher,   ///< this troupe-run (node 0) serves it
  elsewhere,  ///< another node's troupe-run, or the user's own store
  rank0,      ///< rank 0 hosts it (TROUPE_STORE_EXTERNAL=0)
};

/// Who serves the job's store, from this node's index (--node-rank) and
/// TROUPE_STORE_EXTERNAL (unset or empty, "0" or "1"). Throws
/// std::invalid_argument naming the variable's value when it is none of them.
store_host choose_store_host(int node_rank);

/// The value of TROUPE_STORE_EXTERNAL the ranks get.
inline const char* store_external_value(store_host h) {
  return h == store_host::rank0 ? "0" : "1";
}

/// The store this troupe-run serves while its job runs.
class job_store {
 public:
  /// Serves on bind_address:port (0: a free port), admitting `token`;
  /// throws std::runtime_error naming the address when it cannot.
  job_store(const std::string& bind_address, int port, const std::string& token);
  ~job_store();
  job_store(const job_store&) = delete;
  job_store& operator=(const job_store&) = delete;
  int port() const;
  /// Ranks' connections open now (each rank's process holds one or more).
  std::size_t clients() const;

 private:
  std::unique_ptr<troupe::tcp_store_server> server_;
};

}  // namespace troupe_run
