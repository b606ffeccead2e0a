// cuda tensors in the actor backend outside the device exchange (see
// backends/cuda_staging.hpp).

#include "backends/cuda_staging.hpp"

#include "backends/flat_buffers.hpp"
#include "memory/device_memory.hpp"
#ifdef TROUPE_HAVE_CUDA
#include "cuda/kernels.hpp"
#endif

namespace troupe::detail {

namespace {

/// A flat host copy of `t` (undefined stays undefined).
tensor host_copy(const tensor& t) {
  if (!t.defined()) return t;
  auto h = tensor::empty({t.numel()}, t.scalar_type());
  h.copy_from(flat(t));
  return h;
}

}  // namespace

collective_call staged_through_host(const collective_call& c) {
  auto h = c;
  h.input = host_copy(c.input);
  h.output = c.output.is_same(c.input) ? h.input : host_copy(c.output);
  h.on_success = [out = c.output, host = h.output, then = c.on_success] {
    if (out.defined() && host.defined()) flat(out).copy_from(host);
    if (then) then();
  };
  return h;
}

work p2p_staged_through_host(p2p_call& c) {
  auto device_buf = c.buffer;
  auto result = c.handle;
  c.buffer = c.kind == p2p_call::send
                 ? host_copy(device_buf)
                 : tensor::empty({device_buf.numel()}, device_buf.scalar_type());
  c.handle = work::make(c.name, result.group_name());
  c.handle.on_complete(
      [result, device_buf, host = c.buffer, recv = c.kind != p2p_call::send](const work& w) {
        if (!w.is_success()) return result.fail(w.exception());
        try {
          if (recv) flat(device_buf).copy_from(host);
          result.complete({device_buf}, w.source_rank());
        } catch (...) {
          result.fail(std::current_exception());
        }
      });
  return result;
}

void combine_on_device(const char* name, reduce_op::kind op, const tensor& dst,
                       const std::vector<const void*>& srcs) {
#ifdef TROUPE_HAVE_CUDA
  gpu::reduce_args a;
  a.type = dst.scalar_type();
  a.op = op;
  a.count = static_cast<std::size_t>(dst.numel());
  a.srcs = srcs;
  a.dsts = {dst.data()};
  const int dev = dst.get_device().index;
  // The caller's thread, on the device's legacy stream (ordered after the
  // user's work there), waiting for the result: a local step before the call.
  gpu::set_device(name, dev);
  gpu::reduce(name, dev, a, nullptr);
  gpu::synchronize(name, dev);
#else
  (void)op;
  (void)srcs;
  gpu::check_device(name, dst.get_device());
#endif
}

}  // namespace troupe::detail
