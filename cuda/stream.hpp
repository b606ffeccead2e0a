#pragma once
// Opaque handles of device work, so that code outside cuda/ never includes a
// CUDA header.

namespace troupe::detail::gpu {

using stream_t = void*;  ///< a cudaStream_t
using event_t = void*;   ///< a cudaEvent_t

}  // namespace troupe::detail::gpu
