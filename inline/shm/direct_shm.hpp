#pragma once
// direct_shm — broadcast, allgather, gather, scatter, reduce_scatter and alltoall among
// the ranks of one process, straight between their buffers (one copy per
// byte, by the rank that needs it). inline/shm/direct_shm.cpp says how.

#include <memory>

#include "inline/engine.hpp"

namespace troupe::detail {

struct collective_call;

/// Whether `c` can run as a direct_shm operation (the same answer on every
/// rank of a group whose ranks pass the same arguments).
bool fits_direct_shm(const collective_call& c, int size);
/// The operation for `c` (fits_direct_shm), which it keeps and may change
/// (alltoall in place reads a copy of its input); the caller sets the op's
/// fields and runs it on the inline engine of a group whose ranks share this host.
std::unique_ptr<inline_op> make_direct_shm(collective_call&& c);
/// The same for an alltoall that a rank began on its tiny lane (tiny_direct)
/// and found a rank in the slots: it posts in the slots at once, as
/// direct_shm's own ranks on the tiny lane then do.
std::unique_ptr<inline_op> make_direct_shm_in_slots(collective_call&& c);

}  // namespace troupe::detail
