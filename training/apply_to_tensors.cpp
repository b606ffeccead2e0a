#include "troupe/apply_to_tensors.hpp"

#include "training/tensor_ops.hpp"
#include "troupe/error.hpp"

namespace troupe {

tensor to_dtype(const tensor& t, dtype to) {
  if (!t.defined()) throw error(errc::invalid_argument, "to_dtype: undefined tensor");
  if (t.scalar_type() == to) return t;
  if (!detail::is_training_float(to) || !detail::is_training_float(t.scalar_type()))
    throw error(errc::invalid_argument,
                "to_dtype: casts are between float16, bfloat16, float32 "
                "and float64; got " +
                    t.describe() + " to " + std::string(to_string(to)));
  auto src = t.is_contiguous() ? t : t.clone();
  auto host = detail::cast_copy("to_dtype", src, to);
  return to_device(host, t.get_device());
}

tensor to_device(const tensor& t, const device& d) {
  if (!t.defined()) throw error(errc::invalid_argument, "to_device: undefined tensor");
  if (t.get_device() == d) return t;
  auto r = tensor::empty(t.shape(), t.scalar_type(), d);
  r.copy_from(t.is_contiguous() ? t : t.clone());
  return r;
}

}  // namespace troupe
