// allreduce of sparse COO tensors: the ranks' indices and values gathered,
// then added up on every rank (see sparse_allreduce.hpp).
//
// Terms: a rank's "description" is its coalesced sum's sparse_dim,
// dense_dim, nnz (non-zero entries) and sizes; "indices" are its
// sparse_dim x nnz coordinates, "values" its nnz x (dense sizes) entries.
// Step 1: every rank sums its tensors and coalesces the sum.
// Step 2: allgather of the descriptions (waited for here): every rank checks
//         that all ranks hold one shape, and learns every rank's nnz.
// Step 3: allgatherv of the indices and of the values, counts from step 2.
// Step 4: every rank adds the ranks' tensors up, coalesces the sum and
//         copies it into each of its tensors; the work completes.

#include "sparse_allreduce.hpp"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <string>

#include "callback_pool.hpp"
#include "troupe/error.hpp"
#include "troupe_torch/process_group.hpp"
#include "troupe_torch/tensor.hpp"

namespace troupe_torch::detail {
namespace {

constexpr const char* op_name = "allreduce";
constexpr std::int64_t head = 3;  // sparse_dim, dense_dim, nnz; then the sizes

[[noreturn]] void invalid(const std::string& what) {
  throw troupe::error(troupe::errc::invalid_argument, what);
}

std::string shape_text(at::IntArrayRef sizes) {
  std::string r = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) r += (i ? ", " : "") + std::to_string(sizes[i]);
  return r + "]";
}

/// One rank's description, as gathered.
struct description {
  std::int64_t sparse_dim, dense_dim, nnz;
  std::vector<std::int64_t> sizes;

  std::string text() const {
    return "shape " + shape_text(sizes) + " with " + std::to_string(sparse_dim) + " sparse dims";
  }
  bool same_shape(const description& o) const {
    return sparse_dim == o.sparse_dim && dense_dim == o.dense_dim && sizes == o.sizes;
  }
};

void check_inputs(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) invalid("allreduce: no tensors");
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (!t.defined()) invalid("allreduce: tensor " + std::to_string(i) + " is undefined");
    if (!t.is_sparse())
      invalid("allreduce: tensor " + std::to_string(i) +
              " is not sparse while tensor 0 is: one call reduces one layout");
    if (t.sizes() != tensors[0].sizes())
      invalid("allreduce: sparse tensor " + std::to_string(i) + " has shape " +
              shape_text(t.sizes()) + ", tensor 0 " + shape_text(tensors[0].sizes()));
  }
}

/// Step 2: every rank's description; throws on every rank alike when the
/// ranks' shapes differ.
std::vector<description> gather_descriptions(troupe::process_group& g, const at::Tensor& sum) {
  const std::int64_t len = head + sum.dim();
  auto mine = at::empty({len}, at::kLong);
  auto m = mine.accessor<std::int64_t, 1>();
  m[0] = sum.sparse_dim();
  m[1] = sum.dense_dim();
  m[2] = sum._nnz();
  for (std::int64_t d = 0; d < sum.dim(); ++d) m[head + d] = sum.size(d);
  auto all = at::empty({g.size() * len}, at::kLong);
  g.allgather_into_tensor(to_troupe_dense(all, op_name, "sparse descriptions"),
                          to_troupe_dense(mine, op_name, "sparse description"))
      .wait();
  std::vector<description> r;
  auto a = all.accessor<std::int64_t, 1>();
  for (int p = 0; p < g.size(); ++p) {
    const auto base = p * len;
    description d{a[base], a[base + 1], a[base + 2], {}};
    for (std::int64_t k = head; k < len; ++k) d.sizes.push_back(a[base + k]);
    r.push_back(std::move(d));
  }
  for (int p = 1; p < g.size(); ++p)
    if (!r[p].same_shape(r[0]))
      invalid("allreduce: the ranks' sparse tensors differ: rank 0 has " + r[0].text() + ", rank " +
              std::to_string(p) + " has " + r[p].text());
  return r;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> sparse_allreduce(troupe::process_group& g,
                                                std::vector<at::Tensor>& tensors, c10d::ReduceOp op,
                                                int rank) {
  if (op != c10d::ReduceOp::SUM)
    invalid("allreduce: sparse tensors are reduced with SUM only, not reduce op " +
            std::to_string(static_cast<int>(op.op_)));
  check_inputs(tensors);
  // The sums are not part of any autograd graph (as gloo's).
  at::AutoDispatchBelowAutograd no_autograd;
  // Step 1
  at::Tensor sum = tensors[0];
  for (std::size_t i = 1; i < tensors.size(); ++i) sum = sum + tensors[i];
  sum = sum.coalesce();
  // Step 2
  const auto ranks = gather_descriptions(g, sum);
  // Step 3
  const auto sparse_dim = sum.sparse_dim();
  std::int64_t entry = 1;  // elements of one value: the dense sizes' product
  for (auto d = sparse_dim; d < sum.dim(); ++d) entry *= sum.size(d);
  std::vector<std::int64_t> index_counts, value_counts;
  std::int64_t indices_total = 0, values_total = 0;
  for (const auto& d : ranks) {
    index_counts.push_back(sparse_dim * d.nnz);
    value_counts.push_back(entry * d.nnz);
    indices_total += index_counts.back();
    values_total += value_counts.back();
  }
  auto indices = sum._indices().contiguous().view({-1});
  auto values = sum._values().contiguous().view({-1});
  auto all_indices = at::empty({indices_total}, indices.options());
  auto all_values = at::empty({values_total}, values.options());
  auto gathered = troupe::work::when_all(
      op_name, g.name(),
      {g.allgatherv(to_troupe_dense(all_indices, op_name, "sparse indices"),
                    to_troupe_dense(indices, op_name, "sparse indices"), index_counts),
       g.allgatherv(to_troupe_dense(all_values, op_name, "sparse values"),
                    to_troupe_dense(values, op_name, "sparse values"), value_counts)});
  // Step 4
  auto done = troupe::work::make(op_name, g.name());
  auto dense_sizes = sum._values().sizes().vec();
  gathered.on_complete([=](const troupe::work& w) {
    post_callback([=] {
      try {
        if (!w.is_success()) std::rethrow_exception(w.exception());
        at::AutoDispatchBelowAutograd no_autograd_here;
        at::Tensor total;
        std::int64_t io = 0, vo = 0;
        for (const auto& d : ranks) {
          auto shape = dense_sizes;
          shape[0] = d.nnz;
          auto part = at::sparse_coo_tensor(
              all_indices.narrow(0, io, sparse_dim * d.nnz).view({sparse_dim, d.nnz}),
              all_values.narrow(0, vo, entry * d.nnz).view(shape), d.sizes);
          io += sparse_dim * d.nnz;
          vo += entry * d.nnz;
          total = total.defined() ? total + part : part;
        }
        total = total.coalesce();
        for (auto t : tensors) t.copy_(total);
        done.complete({});
      } catch (...) {
        done.fail(std::current_exception());
      }
    });
  });
  return make_work(std::move(done), c10d::OpType::ALLREDUCE, {tensors}, rank, "troupe:all_reduce",
                   tensors);
}

}  // namespace troupe_torch::detail
