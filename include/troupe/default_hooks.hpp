#pragma once
/// The built-in communication hooks without state (c10d's default_hooks):
/// plain averaging, and averaging in half precision. Each issues one
/// allreduce before it returns (hook_ordering::concurrent), so buckets reduce
/// while the backward goes on. `pg` must outlive the hook.

#include "troupe/comm_hook.hpp"
#include "troupe/process_group.hpp"

namespace troupe {

/// The bucket averaged over the group's ranks, in place (allreduce AVG): what
/// the reducer does without a hook.
comm_hook allreduce_hook(process_group& pg);

/// The bucket divided by size() and cast to float16, summed by allreduce,
/// and cast back into the bucket: half the bytes on the wire, at float16's
/// precision (about 3 decimal digits; values beyond 65504 overflow). A
/// complex bucket is compressed as the pairs of reals it is made of (c10d's
/// hook casts it to float16 and so drops its imaginary parts).
comm_hook fp16_compress_hook(process_group& pg);

/// As fp16_compress_hook with bfloat16: float32's range, about 2 decimal digits.
comm_hook bf16_compress_hook(process_group& pg);

}  // namespace troupe
