#pragma once
// open_fabrics — sets up a group's fabrics when the group is created, the
// same way on every rank (fabric/fabric.hpp says what a fabric is).

#include <memory>
#include <string>
#include <vector>

#include "troupe/backend.hpp"

namespace troupe::detail {

class data_plane;
class fabric;

struct group_fabrics {
  /// allreduce and barrier (shared memory), or every collective (messages).
  std::shared_ptr<fabric> main;
  /// Beside a shared-memory fabric: the collectives the segment has no
  /// algorithm for, as messages.
  std::shared_ptr<fabric> messages;
  bool shm = false;  ///< main's medium is shared memory
};

/// The fabrics of the group `ctx` describes (none for one rank, or with
/// TROUPE_FABRIC=off). `names[r]` describes group rank r in messages; `key`
/// names the group of this job in the process; `plane` reaches the ranks of
/// other processes; `verbose` reports why shared memory was not available.
///  - shm: every member shares this host's memory; rank 0 creates the
///    segment, the others map it ("staged" makes ranks of one process stage
///    as if apart). Once all mapped it, its name is removed, so a crash
///    leaves nothing behind.
///  - messages: handed over to ranks in this process and sent as frames to
///    the others; the medium starts receiving before this rank says it is
///    ready.
/// Each rank writes the mode it can run to the group's store; fabrics are
/// used only when all wrote the same one.
group_fabrics open_fabrics(const backend_context& ctx, const std::vector<std::string>& names,
                           const std::shared_ptr<data_plane>& plane, const std::string& key,
                           bool verbose);

}  // namespace troupe::detail
