#pragma once
// The internal description of one call as it travels from the façade to the
// group actor: what to run (collective_call / p2p_call) and what travels
// between the group actors of one group (envelope / p2p_envelope).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/reduce_op.hpp"
#include "troupe/tensor.hpp"
#include "troupe/work.hpp"

namespace troupe::detail {

struct call_fingerprint;
/// What a rank called (base/agreement.hpp), shared read-only by its messages.
using fingerprint_ptr = std::shared_ptr<const call_fingerprint>;

/// The algorithm families the group actor runs. Every public collective is
/// planned onto one of them (see backends/host_backend.cpp).
enum class op_code : std::uint8_t {
  allreduce,
  broadcast,
  reduce,
  allgatherv,
  gatherv,
  scatterv,
  reduce_scatterv,
  alltoallv,
  barrier,
  monitored_barrier,
};

const char* to_string(op_code c) noexcept;

/// One collective, planned on flat contiguous one-dimensional buffers.
struct collective_call {
  op_code code = op_code::barrier;
  const char* name = "";  ///< the public call ("allreduce_coalesced"), for messages (a literal)
  std::uint64_t seq = 0;  ///< the group's sequence number (assigned at issue)
  reduce_op op;
  int root = 0;
  tensor input;   ///< flat; may be the same memory as output (in place)
  tensor output;  ///< flat
  /// Elements per rank (allgatherv, gatherv, scatterv, reduce_scatterv), or
  /// elements this rank sends to each rank (alltoallv).
  std::vector<std::int64_t> counts;
  /// Elements this rank receives from each rank (alltoallv).
  std::vector<std::int64_t> recv_counts;
  /// Extra divisor for AVG when a rank contributed several local tensors.
  std::int64_t avg_local = 1;
  /// The dtype the caller passed, where the call moves another one (sums of
  /// float16 travel as float32): what the ranks agree on.
  std::optional<dtype> user_dtype;
  bool wait_all_ranks = false;
  /// alltoall_single without split sizes: this rank sends every rank
  /// counts[0] elements and receives as many from each.
  bool even_splits = false;
  /// The alltoall runs Bruck's steps (algorithms/alltoall_bruck.cpp), which
  /// only ranks of even splits can: chosen where the group's topology is
  /// known (op_context::set_topology), and said in the call's fingerprint,
  /// so a rank that passed split sizes disagrees instead of waiting.
  bool bruck_alltoall = false;
  /// 1 + the algorithm (algorithms/cost_model.hpp's algorithm_kind) the
  /// engine runs for this call, set where the group's topology is known
  /// (op_context::set_topology); 0 before. Said in the call's fingerprint:
  /// ranks told other link costs or algorithms disagree instead of meeting
  /// each other's messages at the wrong steps.
  std::uint8_t algorithm = 0;
  std::chrono::milliseconds timeout{};
  /// Runs in the group actor after the algorithm succeeded, before the work
  /// completes (copies packed results into the caller's tensors).
  std::function<void()> on_success;
  /// What work.result() returns: `sole_output` alone where the call has one
  /// output tensor (no list is built per call), else `outputs`.
  tensor_list outputs;
  tensor sole_output;
  work handle;

  /// The outputs as one list, whichever of the two holds them.
  tensor_list result() const { return sole_output.defined() ? tensor_list{sole_output} : outputs; }
};
using call_ptr = std::shared_ptr<collective_call>;

/// The receives of one batch (batch_isend_irecv) counted together: each
/// that came counts `left` down, and the last completes their shared work
/// (p2p_call::handle) with `outputs`; a failure of one fails it. Counting
/// starts at one for the batch itself, released once all are posted.
struct receive_count {
  std::atomic<int> left{1};
  tensor_list outputs;
};

/// One send or receive.
struct p2p_call {
  enum kind_t : std::uint8_t { send, recv, recv_any } kind = send;
  const char* name = "";  ///< "send", "recv", "recv_any_source" (a literal)
  int peer = -1;          ///< group rank (ignored for recv_any)
  int tag = 0;
  tensor buffer;
  std::chrono::milliseconds timeout{};
  int source = -1;  ///< the sender, set by the group actor when a receive matched
  work handle;
  /// A receive of a batch (inline/mailbox.hpp): `handle` is the batch's
  /// receives' work, shared, completed by the last of them. Null: the
  /// receive's own work.
  std::shared_ptr<receive_count> count;
};
using p2p_ptr = std::shared_ptr<p2p_call>;

/// Collective data between group actors: step `step` of operation `seq`,
/// sent by group rank `src`. The payload is shared read-only, never copied.
/// The first message of a call to each peer carries the sender's
/// fingerprint; a message of step `describe_step` carries only that.
struct envelope {
  std::uint64_t seq = 0;
  std::uint32_t step = 0;
  std::int32_t src = 0;
  op_code code = op_code::barrier;
  tensor payload;
  fingerprint_ptr fp;
};

/// The step of a message that only says what its sender called.
inline constexpr std::uint32_t describe_step = 0xffffffffu;
/// The same, from a rank that found the ranks' calls differ: its peers
/// switch to the full exchange of fingerprints (base/agreement.hpp).
inline constexpr std::uint32_t alarm_step = 0xfffffffeu;
/// Round k of the agreement's dissemination (base/agreement.hpp) is step
/// agreement_round_step + k (k < 32).
inline constexpr std::uint32_t agreement_round_step = 0xffffff00u;

/// A large message between processes of one host, lent instead of copied
/// through the connection: where the receiver finds the sender's buffer
/// (memory/peer_memory.hpp), its size and dtype, and the loan's number
/// (per sender, never reused), which the receiver's reply names.
struct p2p_loan {
  std::uint64_t id = 0;
  std::uint64_t share_id = 0;
  std::uint64_t share_size = 0;
  std::uint64_t share_offset = 0;
  std::uint64_t nbytes = 0;
  std::int32_t share_fd = -1;
  std::uint8_t dtype = 0;
  std::uint8_t reserved[3] = {};
};
static_assert(sizeof(p2p_loan) == 48);

/// A point-to-point message (`kind` message), or what a loan needs said:
/// `lent` (the sender's buffer, in `loan`), `returned` (the receiver's
/// answer to loan `loan.id`: taken when `payload` is undefined, else why it
/// could not be, as text), `withdrawn` (the sender gave loan `loan.id` up:
/// it failed, so the message must not be received), and for a large
/// message copied by both: `help` (the receiver asks the lender of loan
/// `loan.id` to copy the message's last `loan.nbytes` bytes into the
/// receive buffer that `loan` names) and `helped` (the lender's answer:
/// copied when `payload` is undefined, else why not, as text).
struct p2p_envelope {
  enum kind_t : std::uint8_t { message, lent, returned, withdrawn, help, helped };
  std::int32_t src = 0;
  std::int32_t tag = 0;
  tensor payload;
  kind_t kind = message;
  p2p_loan loan{};
};

}  // namespace troupe::detail
