#pragma once
// host_backend — the built-in backend, registered as "actor" (its users' name
// for it), for cpu and cuda tensors. It turns each c10d call into one
// collective_call over flat buffers (host_plan.cpp), picks the engine that
// runs it and numbers it (host_route.cpp): the inline engine's shared-memory
// operations when every rank of the group shares this host, the inline
// engine's message algorithms between hosts and for what the segment does
// not run, the device exchange for cuda tensors of ranks of one process,
// point to point through the mailbox (inline/mailbox.hpp), the group actors
// for the rest (monitored_barrier, cuda tensors staged through host memory,
// everything with TROUPE_ENGINE=actors). Setting up a group (its group actor, the
// actor engine's transport, the inline engines) and tearing it down is
// host_backend.cpp. Arguments arrive validated by process_group; ranks that
// disagree are caught by the call's agreement (base/agreement.hpp).

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/actors.hpp"
#include "base/call.hpp"
#include "base/futex_lock.hpp"
#include "inline/engine.hpp"
#include "troupe/backend.hpp"
#include "troupe/debug.hpp"

namespace troupe::detail {

class rank_runtime;
class mailbox;
class actor_peers;
struct tiny_call;
struct work_state;
namespace gpu {
class device_exchange;
}

class host_backend final : public backend {
 public:
  /// Sets up the group (collective: every member constructs it at once).
  explicit host_backend(const backend_context& ctx);
  ~host_backend() override;
  std::string name() const override;

  // -- the c10d calls, planned in host_plan.cpp --------------------------------
  work broadcast(tensor_list& ts, const broadcast_options& o) override;
  work allreduce(tensor_list& ts, const allreduce_options& o) override;
  work allreduce_coalesced(tensor_list& ts, const allreduce_coalesced_options& o) override;
  work reduce(tensor_list& ts, const reduce_options& o) override;
  work broadcast_one(tensor& t, const broadcast_options& o) override;
  work allreduce_one(tensor& t, const allreduce_options& o) override;
  work reduce_one(tensor& t, const reduce_options& o) override;
  work allgather(std::vector<tensor_list>& outs, tensor_list& ins,
                 const allgather_options& o) override;
  work allgather_coalesced(std::vector<tensor_list>& outs, tensor_list& ins,
                           const allgather_options& o) override;
  work allgather_into_tensor_coalesced(tensor_list& outs, tensor_list& ins,
                                       const allgather_options& o) override;
  work allgather_into_tensor(tensor& out, tensor& in, const allgather_options& o) override;
  work allgatherv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                  const allgather_options& o) override;
  work gather(std::vector<tensor_list>& outs, tensor_list& ins, const gather_options& o) override;
  work gather_one(tensor_list& outs, tensor& in, const gather_options& o) override;
  work gatherv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
               const gather_options& o) override;
  work scatter(tensor_list& outs, std::vector<tensor_list>& ins, const scatter_options& o) override;
  work scatter_one(tensor& out, tensor_list& ins, const scatter_options& o) override;
  work scatterv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                const scatter_options& o) override;
  work reduce_scatter(tensor_list& outs, std::vector<tensor_list>& ins,
                      const reduce_scatter_options& o) override;
  work reduce_scatter_tensor(tensor& out, tensor& in, const reduce_scatter_options& o) override;
  work reduce_scatterv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                       const reduce_scatter_options& o) override;
  work reduce_scatter_tensor_coalesced(tensor_list& outs, tensor_list& ins,
                                       const reduce_scatter_options& o) override;
  work alltoall_single(tensor& out, tensor& in, const std::vector<std::int64_t>& out_splits,
                       const std::vector<std::int64_t>& in_splits,
                       const alltoall_options& o) override;
  work alltoall(tensor_list& outs, tensor_list& ins, const alltoall_options& o) override;
  work barrier(const barrier_options& o) override;
  work monitored_barrier(const monitored_barrier_options& o) override;
  work send(tensor_list& ts, int dst, const p2p_options& o) override;
  work recv(tensor_list& ts, int src, const p2p_options& o) override;
  work recv_any_source(tensor_list& ts, const p2p_options& o) override;
  work send_one(tensor& t, int dst, const p2p_options& o) override;
  work recv_one(tensor& t, int src, const p2p_options& o) override;
  work recv_any_source_one(tensor& t, const p2p_options& o) override;
  work batch_isend_irecv(std::vector<p2p_op>& ops) override;

  std::uint64_t sequence_number() override;
  void abort(const std::string& reason) override;

 private:
  // -- planning (host_plan.cpp) --------------------------------------------------
  static tensor_list flatten(const std::vector<tensor_list>& lists);
  std::vector<std::int64_t> rows_to_elements(const tensor& t,
                                             const std::vector<std::int64_t>& splits) const;
  /// allreduce and reduce over several tensors, combined locally first.
  work reducing(op_code code, const char* name, const reduce_op& op, int root, int root_tensor,
                timeout_t timeout, tensor_list& ts, bool root_only);
  /// allreduce and reduce over one tensor, in place.
  work reducing_one(op_code code, const char* name, const reduce_op& op, int root,
                    timeout_t timeout, tensor& t);
  /// An allgather of this rank's `ins` packed into one block; `scatter_out`
  /// copies the gathered buffer into the caller's outputs, unless `in_row`
  /// (the outputs in the buffer's order, adjacent()) is written in place.
  template <class F>
  work gather_blocks(const char* name, timeout_t timeout, const tensor_list& ins, F scatter_out,
                     const tensor_list& outputs, const tensor& in_row);
  /// A gather of tensors of several dtypes (backends/mixed_blocks.hpp):
  /// this rank's `ins` as a block of bytes behind their layout; tensor i of
  /// rank r goes to out(r, i) once every rank's layout agrees.
  work gather_mixed(const char* name, timeout_t timeout, const tensor_list& ins,
                    const tensor_list& outputs, std::function<tensor(int, std::size_t)> out);
  /// The tensors as one input: in place where they lie in a row and do not
  /// overlap `output`, else packed into a buffer of the call's own.
  static tensor packed(const tensor_list& ts, const tensor& output);
  /// The call's output: `row` (the outputs in the buffer's order, adjacent())
  /// where it holds `numel` elements and does not overlap the call's input;
  /// else a buffer of its own, of `like`'s dtype and device, that
  /// `unpack_out(buffer)` copies into the caller's outputs on success.
  template <class F>
  static void set_output(collective_call& c, const tensor& row, const tensor& like_of,
                         std::int64_t numel, F unpack_out);
  /// A call whose work returns `outputs` (a list of one tensor is held as
  /// the call's sole output: no list per call).
  collective_call make_call(op_code code, const char* name, timeout_t timeout,
                            const tensor_list& outputs);
  collective_call make_call(op_code code, const char* name, timeout_t timeout,
                            const tensor& output);
  /// A call's common part (its name, timeout and work), without outputs.
  collective_call new_call(op_code code, const char* name, timeout_t timeout);

  // -- routing: where a call runs, the one path out (host_route.cpp) -------------
  /// Where a planned call runs: chosen from what every rank passes alike
  /// (op, devices, sizes, the group's shape), so all ranks choose the same.
  route choose(const collective_call& c) const;
  /// Runs a planned call where choose() sends it. A call that runs
  /// straight between the ranks' buffers moves into its operation (one
  /// allocation for both); the others are shared with what runs them.
  work submit(collective_call&& c);
  /// The one path every collective leaves by: the group's next sequence
  /// number, announced to the inline engine with the call's route, then
  /// `hand(seq)` gives the call to its engine, all under issue_mtx_ (numbers
  /// follow the order of submission, and every engine sees them in order).
  template <class Hand>
  work issue(op_code code, route r, Hand&& hand);
  /// issue() onto an inline engine: `owned` (op itself), or op made on the
  /// caller's stack (inline_engine::submit_borrowed); its work is the
  /// engine's to make unless op.handle is set.
  work to_engine(inline_engine& engine, route r, inline_op& op, std::unique_ptr<inline_op> owned,
                 op_code code, const char* name, const tensor& data, timeout_t timeout,
                 tensor_list outputs);
  /// The device exchange's and the group actors' calls: their work made (the
  /// inline engine makes its own), tracked and logged.
  work issued_work(collective_call& c, const tensor& data);
  work on_device(const call_ptr& c);
  work on_actors(const call_ptr& c);
  /// `c` with float16/bfloat16 sums carried in float32: a ring or tree that
  /// sent partial sums in half precision would round them at every hop
  /// (3 ranks, 1 Mi float16 elements: 229k differed from the float32 sum
  /// rounded once). Two ranks reduce each element once, so stay as they are.
  call_ptr with_float_sums(const call_ptr& c) const;
  /// The one-tensor calls host_plan.cpp keeps off planning. allreduce of one
  /// CPU tensor: on the segment, else the messages' algorithm.
  work allreduce_inline(tensor& t, const allreduce_options& o);
  /// allreduce (root -1) or reduce of one CPU tensor through the shared
  /// segment (inline/shm/allreduce_shm.hpp): a reduce then costs no more
  /// than the allreduce of its buffer.
  work on_segment(op_code code, const char* name, tensor& t, const reduce_op& op, int root,
                  timeout_t timeout);
  /// Whether a `code` call of even blocks runs on the segment's tiny lane
  /// (inline/shm/tiny_direct.hpp): ranks of one host, CPU tensors, and
  /// sources that fit it, `block` being one rank's share (the same answer on
  /// every rank that passes the same sizes). `other`: the call's other
  /// tensor, if any; `root_list`: the root's outputs (gather) or inputs (scatter).
  bool on_tiny_lane(op_code code, const tensor& block, const tensor& other,
                    const tensor_list& root_list) const;
  /// Runs `c` there, without a planned call (nor an operation on the heap
  /// when it ends at once); the work's result is `sole` where defined
  /// (`c.output` is then flat(sole)), else `outputs`.
  work on_tiny(tiny_call c, const char* name, timeout_t timeout, const tensor& sole,
               tensor_list outputs);
  work barrier_inline(const barrier_options& o);
  /// Whether a call runs on a message engine: every collective on CPU
  /// tensors (the waiting threads run it, without the actor path's hops)
  /// but monitored_barrier, which reports the ranks that did not
  /// arrive (an actor's job). The choice depends on the op alone, so every
  /// rank makes the same one.
  static bool fits_inline(const collective_call& c);
  work submit_p2p(p2p_call::kind_t kind, const char* name, int peer, const tensor& buf,
                  const p2p_options& o);

  // -- tracking and tear-down (host_backend.cpp) ----------------------------------
  /// TROUPE_DEBUG=DETAIL: one line when a call is issued and one when it ends.
  void log_detail(const work& w, const tensor& data) const;
  /// Remembers pending works so that destroying the group fails them instead of
  /// leaving a waiter behind.
  void track(const work& w);
  static bool work_done(work_state& s);
  void shutdown(const std::string& reason);

  rank_runtime& rt_;
  timeout_t timeout_;
  debug_level debug_;
  std::string key_prefix_;
  group_actor group_;
  std::shared_ptr<actor_peers> net_;  // how the group actor reaches its peers (names them)
  std::mutex mtx_;
  std::vector<std::weak_ptr<work_state>> pending_;
  futex_lock issue_mtx_;  // numbering and submission happen in one order
  std::atomic<std::uint64_t> issued_{0};
  std::shared_ptr<inline_engine> engine_;
  std::shared_ptr<inline_engine> messages_;  // beside a shared-memory engine: the other collectives
  bool shm_ = false;  // the inline engine's medium is shared memory (else the network)
  std::shared_ptr<gpu::device_exchange> exchange_;  // cuda tensors, every rank in this process
  std::shared_ptr<mailbox> mailbox_;  // point to point (null: through the group actor)
};

}  // namespace troupe::detail
