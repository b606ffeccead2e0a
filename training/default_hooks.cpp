#include "troupe/default_hooks.hpp"

#include <string>

#include "training/tensor_ops.hpp"
#include "training/work_chain.hpp"
#include "troupe/error.hpp"

namespace troupe {

namespace {

comm_hook compress_hook(process_group& pg, dtype wire, const char* name) {
  return {[&pg, wire, name](const grad_bucket& b) {
            const auto& buffer = b.buffer();
            // Divide first: the sum of n values stays in float16's range.
            auto compressed = detail::cast_copy(name, buffer, wire, 1.0 / pg.size());
            if (!buffer.is_cpu())
              compressed = [&] {
                auto d = tensor::empty(compressed.shape(), wire, buffer.get_device());
                d.copy_from(compressed);
                return d;
              }();
            return detail::then_driving(pg.allreduce(compressed, reduce_op::SUM),
                                        [buffer, compressed, name](const work& w) {
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
            return detail::then_driving(pg.allreduce(buffer, reduce_op::AVG),
                                        [buffer](const work& w) {
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
