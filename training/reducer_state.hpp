#pragma once
// The reducer's state and its step machinery: buckets of gradients reduced
// as they become ready.
//
// Terms: a parameter is *ready* once its gradient sits in its bucket slot
// (copied there, or zeroed when unused); a bucket is *ready* once all its
// parameters are; a bucket is *launched* once its reduction started; *done*
// once that work completed. A step runs:
//   1. mark_ready / mark_unused fill slots; each completed bucket may launch.
//   2. The launcher (whichever thread finds the next bucket launchable; one at
//      a time) launches buckets strictly in index order: bucket b needs b
//      ready, and under a serial hook also b-1 done (its completion launches
//      the next). With find_unused_parameters the used-bitmap allreduce
//      follows the last bucket.
//   3. finish_step waits for every bucket in order, copies results that came
//      back in another tensor into the bucket, and writes the averages back
//      to the gradients of parameters some rank used.
// static_graph's first step delays everything to finish_step (step 3 after
// filling every slot there), and records which parameters are used.

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/bucket_assignment.hpp"
#include "troupe/reducer.hpp"

namespace troupe {

namespace detail {
/// errc::invalid_argument "reducer<op>: <what>".
[[noreturn]] void reducer_refuse(const std::string& op, const std::string& what);
}  // namespace detail

struct reducer::impl : std::enable_shared_from_this<impl> {
  struct bucket {
    tensor buffer;
    std::vector<std::size_t> params;
    std::vector<std::int64_t> offsets;
    std::vector<shape_t> shapes;
    tensor_list views;
    // per step
    std::size_t pending = 0;
    bool ready = false;
    bool launched = false;
    bool done = false;
    work w;
  };
  struct slot {
    std::size_t bucket;
    std::size_t pos;
  };

  impl(process_group& g, reducer_options o) : pg(g), opts(std::move(o)) {}

  process_group& pg;
  reducer_options opts;
  tensor_list grads;  // what gradient(i) returns
  std::vector<bucket> buckets;
  std::vector<std::vector<std::size_t>> indices;
  std::vector<std::size_t> limits;
  std::vector<slot> where;
  comm_hook hook;
  bool has_hook = false;

  mutable std::mutex mtx;
  std::condition_variable cv;
  std::uint64_t steps = 0;
  std::uint64_t generation = 0;  // tells a late callback of an earlier step apart
  // per step
  bool in_step = false;
  std::vector<int> marks_left;     // marks still expected before the parameter is ready
  std::vector<bool> ready;         // slot filled (or being filled)
  std::vector<std::uint8_t> used;  // marked with a gradient in this step
  std::vector<int> first_counts;   // static_graph's first step: marks per parameter
  std::vector<tensor> latest;      // static_graph's first step: where to read at finish
  std::size_t next_launch = 0;
  bool launching = false;
  bool failed = false;  // a bucket failed: launch no more
  bool used_launched = false;
  work used_work;
  // static_graph, from the first step on
  std::vector<int> static_counts;
  std::vector<std::uint8_t> static_global_unused;
  // the first step's order of marks, for rebuilding the buckets
  std::vector<std::int64_t> ready_order;

  // -- helpers ----------------------------------------------------------------

  std::size_t size() const { return grads.size(); }
  bool serial() const { return has_hook && hook.ordering == hook_ordering::serial; }
  bool static_first() const { return opts.static_graph && steps == 0; }
  bool static_later() const { return opts.static_graph && steps > 0; }
  bool dynamic_find_unused() const { return opts.find_unused_parameters && !opts.static_graph; }

  std::string label(std::size_t i) const;
  std::string with_name(std::size_t i) const;
  std::string list(const std::vector<std::size_t>& ps) const;

  void check_index(const char* op, std::size_t i) const;

  tensor& view(std::size_t i) { return buckets[where[i].bucket].views[where[i].pos]; }

  /// c10d's assignment for gradients that become ready in `order`: the first
  /// bucket capped at first_bucket_bytes, the others at bucket_cap_bytes.
  bucket_assignment assignment_for(const std::vector<std::int64_t>& order) const;
  /// Allocates the buckets of `indices` (buffers, views, slots); with bucket
  /// views the gradients move into them, values and all.
  void allocate_buckets();
  /// After the first step: buckets in the order of rank 0's marks (c10d's
  /// rebuild; one broadcast). Returns whether the assignment changed.
  bool rebuild_buckets();

  /// Starts a step if none is open; returns the parameters static_graph marks
  /// unused by itself (to be zeroed and completed outside the lock).
  std::vector<std::size_t> begin_step_locked();

  /// Zeroes the slots of `ps` (outside the lock).
  void zero_slots(const std::vector<std::size_t>& ps);

  /// The slots of `ps` are filled: complete their buckets and launch what can go.
  void complete(const std::vector<std::size_t>& ps);

  /// Launches the next buckets while they may go (one launcher at a time).
  void try_launch();

  /// Bucket b's work completed (in step `gen`): a serial hook's next bucket may go.
  void on_bucket_done(std::size_t b, std::uint64_t gen, bool ok);

  /// The failed work of a bucket not launched because an earlier one failed.
  work not_launched(std::size_t b);

  /// Starts bucket b's reduction: the hook, or an averaging allreduce.
  work launch(std::size_t b);

  /// Copies `grad` into parameter i's slot unless it is the slot.
  void fill_slot(std::size_t i, const tensor& grad);

  // -- the end of a step --------------------------------------------------------

  /// static_graph's first step: fill every slot now and launch every bucket.
  void delayed_reduction();

  /// Waits for every bucket; returns the first failure (empty: none).
  std::exception_ptr wait_buckets(std::size_t& failed_bucket);

  /// Which parameters no rank used: from the allreduced bitmap.
  std::vector<std::uint8_t> global_unused();

  /// Puts a hook's result into its bucket when it came back elsewhere.
  void take_result(std::size_t b);

  [[noreturn]] void rethrow_bucket_failure(std::exception_ptr e, std::size_t b);
};

}  // namespace troupe
