#pragma once
// open_inline_engines — sets up a group's inline engines when the group is created, the
// same way on every rank (inline/engine.hpp says what an inline engine is).

#include <memory>
#include <string>
#include <vector>

#include "base/rank_names.hpp"
#include "troupe/backend.hpp"

namespace troupe::detail {

class data_plane;
class inline_engine;

struct inline_engines {
  /// allreduce and barrier (shared memory), or every collective (messages).
  std::shared_ptr<inline_engine> main;
  /// Beside a shared-memory engine: the collectives the segment has no
  /// algorithm for, as messages.
  std::shared_ptr<inline_engine> messages;
  bool shm = false;  ///< main's medium is shared memory
};

/// The inline engines of the group `ctx` describes (none with
/// TROUPE_ENGINE=actors; a group of one rank has them too: its calls cost a
/// step of the engine, 0.5-1 us, instead of a round through its group
/// actor, 20-35 us). `names[r]` describes group rank r in messages; `key`
/// names the group of this job in the process; `plane` reaches the ranks of
/// other processes; `verbose` reports why shared memory was not available.
///  - shm: every member shares this host's memory; rank 0 creates the
///    segment, the others map it (TROUPE_ENGINE=staged makes ranks of one process stage
///    as if apart). Once all mapped it, its name is removed, so a crash
///    leaves nothing behind.
///  - messages: handed over to ranks in this process and sent as frames to
///    the others; the medium starts receiving before this rank says it is
///    ready.
/// Each rank writes the mode it can run to the group's store; inline engines are
/// used only when all wrote the same one.
/// Whether TROUPE_ENGINE=actors sends every call to the group actors
/// (collectives and point to point).
bool inline_engines_off();

inline_engines open_inline_engines(const backend_context& ctx, const rank_names& names,
                                   const std::shared_ptr<data_plane>& plane, const std::string& key,
                                   bool verbose);

}  // namespace troupe::detail
