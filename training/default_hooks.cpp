#include "troupe/default_hooks.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <string>

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

comm_hook compress_hook(process_group& pg, dtype wire, const char* name) {
  auto cache = std::make_shared<compressed_buffers>();
  return {[&pg, wire, name, cache](const grad_bucket& b) {
            const auto& buffer = b.buffer();
            auto compressed = cache->get(buffer, wire);
            // Divide first: the sum of n values stays in the narrow type's range.
            detail::cast_scaled(name, compressed, buffer, 1.0 / pg.size());
            return pg.allreduce(compressed, reduce_op::SUM)
                .then([buffer, compressed, name](const work& w) {
                  w.result();
                  detail::cast_scaled(name, buffer, compressed);
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
