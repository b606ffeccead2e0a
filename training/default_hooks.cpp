#include "troupe/default_hooks.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "base/tensor_util.hpp"
#include "training/tensor_ops.hpp"
#include "training/work_chain.hpp"
#include "troupe/error.hpp"

namespace troupe {

namespace {

/// The compressed buffers of a hook, one per bucket buffer, kept between steps
/// (a fresh 50 MB buffer a step costs its page faults; a kept one is also
/// shared in place between processes after its second allreduce).
struct compressed_buffers {
  std::mutex mtx;
  std::map<const void*, tensor> by_bucket;

  tensor get(const tensor& buffer, dtype wire) {
    std::lock_guard<std::mutex> g{mtx};
    auto& t = by_bucket[buffer.data()];
    if (!t.defined() || t.numel() != buffer.numel() || !(t.get_device() == buffer.get_device()))
      t = tensor::empty({buffer.numel()}, wire, buffer.get_device());
    return t;
  }
};

/// `t`, or the pairs of reals a complex `t` is made of.
tensor as_reals(const tensor& t) {
  const auto d = t.scalar_type();
  if (!is_complex(d)) return t;
  return detail::tensor_access::reinterpreted(
      t, d == dtype::complex64 ? dtype::float32 : dtype::float64);
}

comm_hook compress_hook(process_group& pg, dtype wire, const char* name) {
  auto cache = std::make_shared<compressed_buffers>();
  return {[&pg, wire, name, cache](const grad_bucket& b) {
            const auto& buffer = b.buffer();
            // A complex bucket travels as the pairs of reals it is made of
            // (c10d's hook casts it to a real dtype, which drops the
            // imaginary parts).
            const auto reals = as_reals(buffer);
            auto compressed = cache->get(reals, wire);
            // Divide first: the sum of n values stays in the narrow type's range.
            detail::cast_scaled(name, compressed, reals, 1.0 / pg.size());
            return pg.allreduce(compressed, reduce_op::SUM)
                .then([buffer, reals, compressed, name](const work& w) {
                  w.result();
                  detail::cast_scaled(name, reals, compressed);
                  return tensor_list{buffer};
                });
          },
          hook_ordering::concurrent, name};
}

}  // namespace

comm_hook allreduce_hook(process_group& pg) {
  return {[&pg](const grad_bucket& b) {
            auto buffer = b.buffer();
            return pg.allreduce(buffer, reduce_op::AVG).then([buffer](const work& w) {
              w.result();
              return tensor_list{buffer};
            });
          },
          hook_ordering::concurrent, "allreduce"};
}

comm_hook fp16_compress_hook(process_group& pg) {
  return compress_hook(pg, dtype::float16, "fp16_compress");
}

comm_hook bf16_compress_hook(process_group& pg) {
  return compress_hook(pg, dtype::bfloat16, "bf16_compress");
}

}  // namespace troupe
