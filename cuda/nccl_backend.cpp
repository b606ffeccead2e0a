// The "nccl" backend (c10d's ProcessGroupNCCL) for cuda tensors.
//
// Design
//   communicators  One NCCL communicator per group, on the device of the
//                  group's first call (later calls on another device are
//                  refused, naming both), created lazily at that first call.
//                  send/recv between two ranks run on a communicator of just
//                  that pair (key "lo:hi"), so point to point never needs the
//                  rest of the group. The communicator's rank 0 (group rank 0,
//                  or the pair's lower rank) makes the unique id and sets it
//                  in the group's store under "nccl/uid/KEY" (KEY: "0" for the
//                  group's communicator, numbered as ProcessGroupNCCL numbers
//                  its communicators, "lo:hi" for a pair's); the others wait
//                  for it in the calling thread, within the group's timeout.
//   device actor   Every NCCL call and every kernel runs in a job of the
//                  rank's device actor, on its stream, in issue order. The
//                  caller's thread validates, allocates scratch memory and
//                  builds a plan (kernels before, one NCCL group, kernels
//                  after); nothing else.
//   set-up         A job creates the communicator with ncclCommInitRankConfig
//                  in non-blocking mode (config.blocking = 0), which returns
//                  at once. Until NCCL reports it ready, the calls on it are
//                  held here in issue order, so the device actor never waits
//                  for a peer: a timer actor submits a probe job every
//                  millisecond that polls ncclCommGetAsyncError; when the
//                  state leaves ncclInProgress the probe submits the held
//                  calls, on an error or past the group's timeout it fails
//                  the group.
//   launching      A non-blocking communicator launches in the background
//                  (ncclGroupEnd returns ncclInProgress). Each job issues its
//                  NCCL calls in one group and polls ncclCommGetAsyncError
//                  until the launch is done before it enqueues anything else,
//                  as NCCL requires; so the stream runs the jobs in order.
//                  That takes microseconds, except for a first call that
//                  connects new peers (it waits for them there), and is
//                  bounded by the job's timeout and by abort().
//   failures       Every NCCL result is checked ("OP: cuda:N: ncclXxx failed:
//                  STRING (LAST ERROR)"), and pending jobs poll the
//                  communicator's asynchronous error. The first failure or
//                  abort() breaks the group: held calls (and, for abort, all
//                  pending ones) fail, the communicators are aborted with
//                  ncclCommAbort in the device actor, and every later call
//                  fails at once naming the group and that first failure. The
//                  destructor destroys idle communicators (ncclCommDestroy) and
//                  aborts the others, so it never waits for a peer.
//
// Mapping (one helper per pattern: NCCL collectives on flat buffers, grouped
// send/recv, pack/unpack with gpu::copy_segments)
//   broadcast                  ncclBroadcast in place; copies into the other local tensors
//   allreduce, reduce          ncclAllReduce / ncclReduce in place; several local tensors:
//                              gpu::reduce into one, NCCL, gpu::reduce into the outputs
//   allreduce_coalesced        grouped ncclAllReduce, one per tensor
//   allgather(_coalesced)      grouped ncclAllGather into flat buffers, unpacked
//   allgather_into_tensor(_coalesced)    (grouped) ncclAllGather into the outputs
//   allgatherv                 grouped ncclBroadcast: root r sends block r
//   gather(v), scatter(v)      grouped ncclSend/ncclRecv with the root
//   alltoall(_single)          grouped ncclSend/ncclRecv with every rank
//   reduce_scatter             inputs packed into one buffer, ncclReduceScatter
//   reduce_scatter_tensor(_coalesced)    (grouped) ncclReduceScatter
//   reduce_scatterv            grouped ncclReduce: root r receives block r
//   barrier                    ncclAllReduce of one byte on the group's device
//   send, recv                 ncclSend / ncclRecv on the pair's communicator (tags ignored)
//   recv_any_source, monitored_barrier   not supported (backend::unsupported)
// Reductions: SUM, PRODUCT, MIN, MAX, AVG (ncclAvg) and PREMUL_SUM
// (ncclRedOpCreatePreMulSum with a host-immediate scalar, destroyed after
// the launch); BAND, BOR and BXOR are refused as PyTorch does. bool travels as
// uint8 (SUM as MAX, PRODUCT as MIN), complex as pairs of reals (SUM, AVG,
// PREMUL_SUM and data movement only); int16 has no NCCL type.

#include "cuda/nccl_backend.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/rank_runtime.hpp"
#include "cuda/device_actor.hpp"
#include "cuda/kernels.hpp"
#include "src/tensor_util.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

namespace {

using clock = std::chrono::steady_clock;
/// How often a communicator that is being set up is polled.
constexpr auto init_poll_interval = std::chrono::milliseconds(1);
/// How long the destructor waits for the device actor to release the communicators.
constexpr auto teardown_wait = std::chrono::seconds(10);
/// The `peer` of calls on the group's communicator (send and recv name their
/// peer instead, for the pair's communicator).
constexpr int whole_group = -1;

clock::time_point deadline_after(timeout_t t) {
  return t.count() > 0 ? clock::now() + t : clock::time_point::max();
}

std::string in_ms(timeout_t t) {
  return std::to_string(t.count()) + " ms";
}

// -- NCCL types, reductions and errors ---------------------------------------------

/// "OP: cuda:N: CALL failed: STRING (LAST ERROR)".
error nccl_error(const char* op, int device, const std::string& call, ncclResult_t r) {
  const char* last = ncclGetLastError(nullptr);
  return error(errc::backend, std::string(op) + ": cuda:" + std::to_string(device) + ": " + call +
                                  " failed: " + ncclGetErrorString(r) + " (" +
                                  (last && *last ? last : "no details") + ")");
}

[[noreturn]] void refuse(const char* op, const std::string& why) {
  throw error(errc::invalid_argument, std::string(op) + ": " + why);
}

/// How a dtype travels through NCCL: `lanes` elements of `type` per element.
struct wire {
  ncclDataType_t type = ncclUint8;
  std::size_t lanes = 1;
};

wire wire_of(const char* op, dtype t) {
  switch (t) {
    case dtype::bool_:
    case dtype::uint8:
      return {ncclUint8, 1};
    case dtype::int8:
      return {ncclInt8, 1};
    case dtype::int32:
      return {ncclInt32, 1};
    case dtype::int64:
      return {ncclInt64, 1};
    case dtype::float16:
      return {ncclFloat16, 1};
    case dtype::bfloat16:
      return {ncclBfloat16, 1};
    case dtype::float32:
      return {ncclFloat32, 1};
    case dtype::float64:
      return {ncclFloat64, 1};
    case dtype::complex64:
      return {ncclFloat32, 2};
    case dtype::complex128:
      return {ncclFloat64, 2};
    case dtype::int16:
      break;
  }
  refuse(op, "Input tensor data type is not supported for NCCL process group: " +
                 std::string(to_string(t)));
}

/// Refuses any tensor whose dtype has no NCCL type.
void check_types(const char* op, const tensor_list& ts) {
  for (auto& t : ts)
    if (t.defined()) wire_of(op, t.scalar_type());
}

/// A reduce_op as NCCL runs it on one dtype.
struct reduction {
  ncclRedOp_t op = ncclSum;
  bool premul = false;  ///< PREMUL_SUM: a scaling op is made for each launch
  double scale = 1.0;
};

reduction reduction_of(const char* op, const reduce_op& r, dtype t) {
  const auto k = r.op();
  const std::string name = std::string("ReduceOp.") + to_string(k);
  if (k == reduce_op::BAND || k == reduce_op::BOR || k == reduce_op::BXOR)
    refuse(op, "Cannot use " + name + " with NCCL");
  if (is_complex(t) && (k == reduce_op::PRODUCT || k == reduce_op::MIN || k == reduce_op::MAX))
    refuse(op, name + " is not supported on complex tensors (" + std::string(to_string(t)) +
                   ") with NCCL");
  if (!is_floating_point(t) && !is_complex(t) &&
      (k == reduce_op::AVG || k == reduce_op::PREMUL_SUM))
    refuse(op, "Cannot use " + name + " with " + std::string(to_string(t)) + " inputs");
  const bool boolean = t == dtype::bool_;  // uint8 on the wire: or = max, and = min
  switch (k) {
    case reduce_op::SUM:
      return {boolean ? ncclMax : ncclSum};
    case reduce_op::PRODUCT:
      return {boolean ? ncclMin : ncclProd};
    case reduce_op::MIN:
      return {ncclMin};
    case reduce_op::MAX:
      return {ncclMax};
    case reduce_op::AVG:
      return {ncclAvg};
    case reduce_op::PREMUL_SUM:
      return {ncclSum, true, r.scale()};
    default:
      break;
  }
  refuse(op, "Unhandled " + name);
}

/// PREMUL_SUM's factor as NCCL reads it: one element of `type` in host memory.
struct scalar {
  alignas(8) unsigned char bytes[8] = {};
};

scalar scalar_of(double v, ncclDataType_t type) {
  scalar s;
  auto put = [&](auto x) { std::memcpy(s.bytes, &x, sizeof x); };
  if (type == ncclFloat16) put(float16_t(static_cast<float>(v)).bits);
  if (type == ncclBfloat16) put(bfloat16_t(static_cast<float>(v)).bits);
  if (type == ncclFloat32) put(static_cast<float>(v));
  if (type == ncclFloat64) put(v);
  return s;
}

// -- plans: what a call issues, built in the caller's thread ------------------------

/// One NCCL collective on flat device buffers (counts in elements of `type`).
struct collective {
  enum kind_t { allreduce, broadcast, reduce, allgather, reduce_scatter } kind;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;  ///< per rank for allgather and reduce_scatter
  dtype type = dtype::uint8;
  reduction red;
  int root = 0;
};

/// One ncclSend or ncclRecv; `peer` is a rank of the communicator.
struct transfer {
  bool send = true;
  void* buf = nullptr;
  std::size_t count = 0;
  dtype type = dtype::uint8;
  int peer = 0;
};

/// Everything one call issues on the stream, in this order.
struct plan {
  std::vector<gpu::copy_segment> pack;    ///< inputs into flat buffers
  std::vector<gpu::reduce_args> combine;  ///< several local tensors into one
  std::vector<collective> collectives;    ///< one NCCL group with ...
  std::vector<transfer> transfers;        ///< ... these sends and receives
  std::vector<gpu::copy_segment> unpack;  ///< flat buffers into the outputs
  std::vector<gpu::reduce_args> spread;   ///< one result into several local tensors
  tensor_list keep;                       ///< memory that must outlive the job
};

std::size_t numel(const tensor& t) {
  return static_cast<std::size_t>(t.numel());
}

/// Address of element `i` of `t`.
char* at(const tensor& t, std::size_t i) {
  return static_cast<char*>(t.data()) + i * t.element_size();
}

collective on(collective::kind_t k, const tensor& send, const tensor& recv, std::size_t n,
              reduction red = {}, int root = 0) {
  return {k, send.data(), recv.data(), n, send.scalar_type(), red, root};
}

/// Copies `n` elements of `src` from `src_at` into `dst` at `dst_at`.
gpu::copy_segment segment(const tensor& dst, std::size_t dst_at, const tensor& src,
                          std::size_t src_at, std::size_t n) {
  return {at(dst, dst_at), at(src, src_at), n * src.element_size()};
}

/// Adds a send (or receive) of `n` elements of `t` from element `i` to `peer`.
void exchange(plan& p, bool send, const tensor& t, std::size_t i, std::size_t n, int peer) {
  if (n > 0) p.transfers.push_back({send, at(t, i), n, t.scalar_type(), peer});
}

/// Where each rank's block starts, for counts in elements.
std::vector<std::size_t> starts(const std::vector<std::int64_t>& counts) {
  std::vector<std::size_t> r;
  std::size_t off = 0;
  for (auto c : counts) {
    r.push_back(off);
    off += static_cast<std::size_t>(c);
  }
  return r;
}

tensor_list flatten(const std::vector<tensor_list>& lists) {
  tensor_list r;
  for (auto& l : lists) r.insert(r.end(), l.begin(), l.end());
  return r;
}

tensor_list both(const tensor_list& a, const tensor_list& b) {
  tensor_list r = a;
  r.insert(r.end(), b.begin(), b.end());
  return r;
}

tensor scratch(const tensor& like, std::size_t n, int device) {
  return tensor::empty({static_cast<std::int64_t>(n)}, like.scalar_type(), device::cuda(device));
}

/// A plan that keeps `ts` (inputs that are not outputs) alive.
plan keeping(const tensor_list& ts) {
  plan p;
  p.keep = ts;
  return p;
}

// -- launching: one job's work on the stream (device actor) -------------------------

class launcher {
 public:
  launcher(const char* op, int device, ncclComm_t comm, gpu::stream_t stream,
           const std::atomic<bool>& stop, timeout_t timeout)
      : op_(op),
        device_(device),
        comm_(comm),
        stream_(stream),
        stop_(stop),
        timeout_(timeout),
        deadline_(deadline_after(timeout)) {}
  ~launcher() {
    for (auto o : ops_) ncclRedOpDestroy(o, comm_);  // after a failure only
  }
  launcher(const launcher&) = delete;
  launcher& operator=(const launcher&) = delete;

  /// Issues `p`: kernels before, one NCCL group, kernels after.
  void run(const plan& p) {
    if (!p.pack.empty()) gpu::copy_segments(op_, device_, p.pack, stream_);
    for (auto& a : p.combine) gpu::reduce(op_, device_, a, stream_);
    // Make the PREMUL_SUM ops first, then launch everything in one group.
    std::vector<ncclRedOp_t> reds;
    for (auto& c : p.collectives) reds.push_back(op_for(c));
    in_group([&] {
      for (std::size_t i = 0; i < p.collectives.size(); ++i) issue(p.collectives[i], reds[i]);
      for (auto& t : p.transfers) issue(t);
    });
    release_ops();
    if (!p.unpack.empty()) gpu::copy_segments(op_, device_, p.unpack, stream_);
    for (auto& a : p.spread) gpu::reduce(op_, device_, a, stream_);
  }

 private:
  /// Throws for an NCCL error; ncclInProgress (a launch in the background) passes.
  void check(const char* call, ncclResult_t r) const {
    if (r != ncclSuccess && r != ncclInProgress) throw nccl_error(op_, device_, call, r);
  }

  /// check(), then waits for a background launch outside a group.
  void check_settled(const char* call, ncclResult_t r) const {
    check(call, r);
    if (r == ncclInProgress) settle(call);
  }

  /// Polls the communicator until it left ncclInProgress: the launch is on
  /// the stream. Refuses to wait past the job's deadline or an abort.
  void settle(const char* call) const {
    for (;;) {
      ncclResult_t state = ncclInProgress;
      check("ncclCommGetAsyncError", ncclCommGetAsyncError(comm_, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) throw nccl_error(op_, device_, call, state);
      if (stop_.load())
        throw error(errc::aborted, std::string(op_) + ": cuda:" + std::to_string(device_) +
                                       ": the group was aborted while " + call + " launched");
      if (clock::now() >= deadline_)
        throw error(errc::timeout, std::string(op_) + ": cuda:" + std::to_string(device_) +
                                       ": Timeout after " + in_ms(timeout_) + ": " + call +
                                       " was still launching (ncclInProgress)");
      std::this_thread::yield();
    }
  }

  /// Runs `issue_all` between ncclGroupStart and ncclGroupEnd, then waits for the launch.
  template <class F>
  void in_group(F&& issue_all) {
    check("ncclGroupStart", ncclGroupStart());
    try {
      issue_all();
    } catch (...) {
      ncclGroupEnd();  // close the group; the first error is the one reported
      throw;
    }
    check("ncclGroupEnd", ncclGroupEnd());
    settle("ncclGroupEnd");
  }

  /// The NCCL op of `c`: built in, or a PREMUL_SUM op made for this launch.
  ncclRedOp_t op_for(const collective& c) {
    if (!c.red.premul) return c.red.op;
    const auto w = wire_of(op_, c.type);
    auto factor = scalar_of(c.red.scale, w.type);
    ncclRedOp_t o{};
    check_settled(
        "ncclRedOpCreatePreMulSum",
        ncclRedOpCreatePreMulSum(&o, factor.bytes, w.type, ncclScalarHostImmediate, comm_));
    ops_.push_back(o);
    return o;
  }

  /// Destroys the PREMUL_SUM ops once the launch took them.
  void release_ops() {
    while (!ops_.empty()) {
      const auto o = ops_.back();
      ops_.pop_back();
      check_settled("ncclRedOpDestroy", ncclRedOpDestroy(o, comm_));
    }
  }

  void issue(const collective& c, ncclRedOp_t red) const {
    const auto w = wire_of(op_, c.type);
    const auto n = c.count * w.lanes;
    if (n == 0) return;  // every rank skips it alike: counts agree across ranks
    auto s = static_cast<cudaStream_t>(stream_);
    switch (c.kind) {
      case collective::allreduce:
        return check("ncclAllReduce", ncclAllReduce(c.send, c.recv, n, w.type, red, comm_, s));
      case collective::broadcast:
        return check("ncclBroadcast", ncclBroadcast(c.send, c.recv, n, w.type, c.root, comm_, s));
      case collective::reduce:
        return check("ncclReduce", ncclReduce(c.send, c.recv, n, w.type, red, c.root, comm_, s));
      case collective::allgather:
        return check("ncclAllGather", ncclAllGather(c.send, c.recv, n, w.type, comm_, s));
      case collective::reduce_scatter:
        return check("ncclReduceScatter",
                     ncclReduceScatter(c.send, c.recv, n, w.type, red, comm_, s));
    }
  }

  void issue(const transfer& t) const {
    const auto w = wire_of(op_, t.type);
    auto s = static_cast<cudaStream_t>(stream_);
    if (t.send)
      check("ncclSend", ncclSend(t.buf, t.count * w.lanes, w.type, t.peer, comm_, s));
    else
      check("ncclRecv", ncclRecv(t.buf, t.count * w.lanes, w.type, t.peer, comm_, s));
  }

  const char* op_;
  int device_;
  ncclComm_t comm_;
  gpu::stream_t stream_;
  const std::atomic<bool>& stop_;
  timeout_t timeout_;
  clock::time_point deadline_;
  std::vector<ncclRedOp_t> ops_;
};

// -- communicators ------------------------------------------------------------------

/// A call issued while its communicator was still being set up.
struct held_job {
  gpu::device_job job;
  clock::time_point since;
};

/// One NCCL communicator of the group: the group's own, or a pair's.
struct communicator {
  std::string key;    ///< "0" for the group's, "lo:hi" for a pair's
  int nranks = 1;     ///< ranks in the communicator
  int rank = 0;       ///< this rank in the communicator
  int publisher = 0;  ///< the group rank that makes the unique id
  int device = 0;
  std::string label;          ///< "GROUP/KEY" (NCCL's commName)
  const char* first_op = "";  ///< the call that created it (for messages)
  timeout_t init_timeout{};
  clock::time_point init_deadline;
  std::atomic<bool> ready{false};    ///< set up: calls go straight to the device actor
  std::atomic<bool> settled{false};  ///< ready or failed: the set-up poll stops
  std::vector<held_job> held;        ///< under nccl_group::mtx_
  ncclComm_t comm = nullptr;         ///< touched by device-actor jobs only

  std::string store_key() const { return "nccl/uid/" + key; }
};

/// The first failure that broke the group.
struct failure {
  errc code;
  std::string why;
};

/// The NCCL state of one group: shared by the backend and its jobs, which
/// may outlive it in the device actor.
class nccl_group : public std::enable_shared_from_this<nccl_group> {
 public:
  explicit nccl_group(const backend_context& ctx)
      : rt_(runtime_of(ctx)),
        store_(ctx.store),
        rank_(ctx.rank),
        size_(ctx.size),
        group_(ctx.group_name),
        timeout_(ctx.timeout) {}

  // -- the caller's side -------------------------------------------------------------

  /// Checks that every tensor is on the group's device (the first call picks it); returns it.
  int bind(const char* op, const tensor_list& ts) {
    std::lock_guard<std::mutex> g{mtx_};
    for (auto& t : ts) {
      if (!t.defined()) continue;
      const auto& d = t.get_device();
      if (d.type != device_type::cuda)
        refuse(op, "the nccl backend takes cuda tensors, not " + t.describe());
      if (device_ < 0) use_device(d.index);
      if (d.index != device_)
        refuse(op, "group '" + group_ + "' runs NCCL on cuda:" + std::to_string(device_) +
                       " (its communicator was created there), but this call has a tensor on " +
                       to_string(d) + " (" + t.describe() + ")");
    }
    if (device_ < 0) use_device(guess_device(op));
    return device_;
  }

  /// The group's device for a call without tensors (barrier): rank % devices until bound.
  int bind_default(const char* op) { return bind(op, {}); }

  /// Issues `p` on the group's communicator (peer == whole_group) or on the
  /// pair with group rank `peer`. The work completes with `outputs` (and,
  /// for recv, `source` as its source rank).
  work issue(const char* op, int peer, plan p, tensor_list outputs, timeout_t t, int source = -1) {
    if (t == use_group_timeout) t = timeout_;
    std::shared_ptr<communicator> c;
    try {
      c = communicator_for(op, peer);
    } catch (const error& e) {
      mark_broken(e.code(), e.what(), false);
      return work::failed(op, group_, std::current_exception());
    }
    auto user = work::make(op, group_);
    auto job = call_job(op, c, std::make_shared<plan>(std::move(p)), t);
    job.outputs = std::move(outputs);
    job.handle = source < 0 ? user : forwarded(user, op, source);
    if (!enqueue(*c, std::move(job), user)) user.fail(std::make_exception_ptr(refusal(op)));
    return user;
  }

  std::uint64_t sequence() const {
    std::lock_guard<std::mutex> g{mtx_};
    return issued_;
  }

  /// Fails every pending call and aborts the communicators (ncclCommAbort).
  void abort(const std::string& reason) {
    mark_broken(errc::aborted, "aborted: " + reason, true);
    submit_teardown(true);
  }

  /// The backend goes away: fails what is pending, destroys idle
  /// communicators and aborts the others, waiting (bounded) for the device actor.
  void shutdown() {
    const bool unfinished = mark_broken(errc::aborted, "the group was destroyed", true);
    auto done = submit_teardown(unfinished);
    if (done.valid() && std::this_thread::get_id() != actor_thread_.load()) {
      try {
        done.wait(teardown_wait);
      } catch (...) {
        // the device actor is gone or late: nothing more to release from here
      }
    }
    // Jobs still in the device actor hold this state: let go of the actor.
    std::lock_guard<std::mutex> g{mtx_};
    queue_.reset();
  }

 private:
  static rank_runtime& runtime_of(const backend_context& ctx) {
    if (!ctx.runtime)
      throw error(errc::backend, "backend 'nccl' for group '" + ctx.group_name +
                                     "' needs the rank's actor runtime");
    return *static_cast<rank_runtime*>(ctx.runtime);
  }

  /// rank % devices, as ProcessGroupNCCL guesses a device for calls without tensors.
  int guess_device(const char* op) const {
    const int n = cuda_device_count();
    if (n == 0)
      throw error(errc::backend,
                  std::string(op) + ": no CUDA device is usable (" + cuda_status() + ")");
    return rank_ % n;
  }

  void use_device(int device) {
    queue_ = gpu::device_queue_of(rt_, device);
    device_ = device;
  }

  /// The communicator for `peer`, created (and its set-up started) on first
  /// use. Its set-up (unique id, init) is bounded by the group's timeout.
  std::shared_ptr<communicator> communicator_for(const char* op, int peer) {
    const auto t = timeout_;
    std::lock_guard<std::mutex> create{create_mtx_};
    std::shared_ptr<communicator> c;
    {
      std::lock_guard<std::mutex> g{mtx_};
      if (broken_) throw refusal_locked(op);
      c = describe(op, peer, t);
      if (auto i = comms_.find(c->key); i != comms_.end()) return i->second;
    }
    std::optional<bytes> uid;
    if (rank_ != c->publisher) uid = fetch_uid(op, *c, t);
    {
      std::lock_guard<std::mutex> g{mtx_};
      if (broken_) throw refusal_locked(op);
      comms_.emplace(c->key, c);
      queue_->submit(
          internal_job(op, [self = shared_from_this(), c, uid] { self->start(*c, uid); }));
    }
    watch_init(c);
    return c;
  }

  /// A new communicator's description (under mtx_).
  std::shared_ptr<communicator> describe(const char* op, int peer, timeout_t t) const {
    auto c = std::make_shared<communicator>();
    c->device = device_;
    if (peer == whole_group) {
      c->key = "0";
      c->nranks = size_;
      c->rank = rank_;
      c->publisher = 0;
    } else {
      const int lo = std::min(rank_, peer), hi = std::max(rank_, peer);
      c->key = std::to_string(lo) + ":" + std::to_string(hi);
      c->nranks = 2;
      c->rank = rank_ == lo ? 0 : 1;
      c->publisher = lo;
    }
    c->label = group_ + "/" + c->key;
    c->first_op = op;
    c->init_timeout = t;
    c->init_deadline = deadline_after(t);
    return c;
  }

  /// Waits (in the caller's thread) for the publisher's unique id in the store.
  bytes fetch_uid(const char* op, const communicator& c, timeout_t t) const {
    const auto key = c.store_key();
    const auto who = "rank " + std::to_string(c.publisher);
    try {
      store_->wait({key}, t);
      auto id = store_->get(key);
      if (id.size() == sizeof(ncclUniqueId)) return id;
      throw error(errc::backend, "the value has " + std::to_string(id.size()) + " bytes, not " +
                                     std::to_string(sizeof(ncclUniqueId)));
    } catch (const error& e) {
      if (e.code() == errc::timeout)
        throw error(errc::timeout, std::string(op) + ": group '" + group_ + "': " + who +
                                       " did not publish the NCCL unique id under store key '" +
                                       key + "' within " + in_ms(t) + " (" + e.what() + ")");
      throw error(e.code(), std::string(op) + ": group '" + group_ +
                                "': reading the NCCL unique id of " + who + " from store key '" +
                                key + "' failed: " + e.what());
    }
  }

  /// Polls the communicator's set-up every init_poll_interval until it settles.
  void watch_init(const std::shared_ptr<communicator>& c) {
    std::weak_ptr<nccl_group> weak = weak_from_this();
    rt_.system().spawn([weak, c](caf::event_based_actor* self) -> caf::behavior {
      self->delayed_send(self, init_poll_interval, timeout_atom::value);
      return {[=](timeout_atom) {
        auto g = weak.lock();
        if (!g || c->settled || g->stopping_) return self->quit();
        g->submit_probe(c);
        self->delayed_send(self, init_poll_interval, timeout_atom::value);
      }};
    });
  }

  void submit_probe(const std::shared_ptr<communicator>& c) {
    std::lock_guard<std::mutex> g{mtx_};
    if (!queue_) return;  // shut down
    queue_->submit(internal_job(c->first_op, [self = shared_from_this(), c] { self->probe(*c); }));
  }

  /// A job of the backend itself (set-up, probes, teardown): a failure breaks the group.
  gpu::device_job internal_job(const char* op, std::function<void()> fn) {
    gpu::device_job j;
    j.name = op;
    j.enqueue = [fn = std::move(fn)](gpu::stream_t) { fn(); };
    j.on_failure = [self = shared_from_this()](const std::string& why) { self->failed(why); };
    j.handle = work::make(op, group_);
    return j;
  }

  /// The job of one call (see the header comment for each step's role).
  gpu::device_job call_job(const char* op, std::shared_ptr<communicator> c, std::shared_ptr<plan> p,
                           timeout_t t) {
    auto self = shared_from_this();
    gpu::device_job j;
    j.name = op;
    j.enqueue = [self, c, p, op, t](gpu::stream_t s) { self->launch(op, *c, *p, s, t); };
    // Keeps the plan's memory until the stream passed the job, and refuses
    // the result once the group broke (an aborted NCCL kernel ends early).
    j.after = [self, p, op] {
      if (self->stopping_) throw self->refusal(op);
    };
    j.health = [self, c, op] { return self->health(op, *c); };
    j.on_failure = [self](const std::string& why) { self->failed(why); };
    j.timeout = t;
    return j;
  }

  /// recv: the device actor completes the inner work; `user` gets the sender's rank too.
  work forwarded(const work& user, const char* op, int source) const {
    auto inner = work::make(op, group_);
    inner.on_complete([user, source](const work& w) {
      if (auto e = w.exception())
        user.fail(e);
      else
        user.complete(w.result(), source);
    });
    return inner;
  }

  /// Numbers the call and hands it to the device actor, or holds it while its
  /// communicator is set up. False when the group is broken.
  bool enqueue(communicator& c, gpu::device_job job, const work& user) {
    std::lock_guard<std::mutex> g{mtx_};
    if (broken_) return false;
    user.set_sequence_number(++issued_);
    track(user);
    if (c.ready)
      queue_->submit(std::move(job));
    else
      c.held.push_back({std::move(job), clock::now()});
    return true;
  }

  /// Remembers pending works so that abort() and the destructor can fail them.
  void track(const work& w) {
    if (pending_.size() > 64)
      std::erase_if(pending_, [](const work& p) { return p.is_completed(); });
    pending_.push_back(w);
  }

  // -- the device actor's side ---------------------------------------------------------

  /// Set-up job: makes (rank 0) or takes the unique id and starts a
  /// non-blocking ncclCommInitRankConfig.
  void start(communicator& c, const std::optional<bytes>& uid) {
    actor_thread_ = std::this_thread::get_id();
    const char* op = c.first_op;
    if (stopping_) throw refusal(op);
    ncclUniqueId id{};
    if (uid) {
      std::memcpy(&id, uid->data(), sizeof id);
    } else {
      const auto r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) throw nccl_error(op, c.device, "ncclGetUniqueId", r);
      const auto* b = reinterpret_cast<const std::uint8_t*>(&id);
      store_->set(c.store_key(), bytes(b, b + sizeof id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = c.label.c_str();
    const auto r = ncclCommInitRankConfig(&c.comm, c.nranks, id, c.rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (c.comm) ncclCommAbort(c.comm);
      c.comm = nullptr;
      throw nccl_error(op, c.device, "ncclCommInitRankConfig", r);
    }
    probe(c);
  }

  /// Probe job: once the set-up left ncclInProgress, opens the communicator;
  /// throws (breaking the group) when it failed or ran past its timeout.
  void probe(communicator& c) {
    const char* op = c.first_op;
    if (c.settled || stopping_ || !c.comm) return;
    ncclResult_t state = ncclInProgress;
    const auto r = ncclCommGetAsyncError(c.comm, &state);
    if (r != ncclSuccess) throw nccl_error(op, c.device, "ncclCommGetAsyncError", r);
    if (state == ncclSuccess) return open(c);
    if (state != ncclInProgress) throw nccl_error(op, c.device, "ncclCommInitRankConfig", state);
    if (clock::now() < c.init_deadline) return;
    // Break the group with errc::timeout before the job fails (its
    // on_failure only knows the message).
    error late(errc::timeout, std::string(op) + ": group '" + group_ + "': Timeout after " +
                                  in_ms(c.init_timeout) + ": the NCCL communicator '" + c.label +
                                  "' on cuda:" + std::to_string(c.device) +
                                  " was not set up (did every rank of it make the call?)");
    mark_broken(late.code(), late.what(), false);
    throw late;
  }

  /// Submits the calls held during the set-up, in order, with what is left of their timeouts.
  void open(communicator& c) {
    std::lock_guard<std::mutex> g{mtx_};
    if (broken_) return;  // the held calls already failed
    c.ready = true;
    c.settled = true;
    const auto now = clock::now();
    for (auto& h : c.held) {
      if (h.job.timeout.count() > 0) {
        auto left = h.job.timeout - std::chrono::duration_cast<timeout_t>(now - h.since);
        h.job.timeout = std::max(left, timeout_t{1});
      }
      queue_->submit(std::move(h.job));
    }
    c.held.clear();
  }

  /// Call job: issues the plan on the stream.
  void launch(const char* op, communicator& c, const plan& p, gpu::stream_t s, timeout_t t) {
    if (stopping_) throw refusal(op);
    launcher{op, c.device, c.comm, s, stopping_, t}.run(p);
  }

  /// Health check of a pending call: the communicator's asynchronous error, or the group's.
  std::string health(const char* op, const communicator& c) const {
    if (stopping_ || !c.comm) return refusal(op).what();
    return async_error(op, c);
  }

  std::string async_error(const char* op, const communicator& c) const {
    ncclResult_t state = ncclSuccess;
    const auto r = ncclCommGetAsyncError(c.comm, &state);
    if (r == ncclSuccess && (state == ncclSuccess || state == ncclInProgress)) return {};
    return nccl_error(op, c.device, "NCCL communicator of group '" + group_ + "'",
                      r != ncclSuccess ? r : state)
        .what();
  }

  /// A job failed: the group is broken and its communicators are aborted.
  void failed(const std::string& why) {
    mark_broken(errc::backend, why, false);
    for (auto& c : communicators())
      if (c->comm) {
        ncclCommAbort(c->comm);  // frees it; nothing more to do when even this fails
        c->comm = nullptr;
      }
  }

  /// Teardown job: destroys idle, healthy communicators and aborts the others.
  void teardown(bool force) {
    for (auto& c : communicators()) {
      if (!c->comm) continue;
      const bool idle = !force && c->ready && async_error("destroy", *c).empty();
      if (idle)
        ncclCommDestroy(c->comm);
      else
        ncclCommAbort(c->comm);
      c->comm = nullptr;
    }
  }

  // -- both sides ------------------------------------------------------------------------

  /// Breaks the group with its first failure: held calls fail (and pending
  /// ones, with `fail_pending`). Returns whether any call was unfinished.
  bool mark_broken(errc code, const std::string& why, bool fail_pending) {
    std::vector<work> doomed;
    std::vector<held_job> dropped;  // destroyed outside the lock
    bool unfinished = false;
    {
      std::lock_guard<std::mutex> g{mtx_};
      if (broken_) return false;
      broken_ = failure{code, why};
      stopping_ = true;
      for (auto& kv : comms_) {
        kv.second->settled = true;
        for (auto& h : kv.second->held) dropped.push_back(std::move(h));
        kv.second->held.clear();
      }
      for (auto& w : pending_)
        if (!w.is_completed()) {
          unfinished = true;
          if (fail_pending) doomed.push_back(w);
        }
    }
    for (auto& h : dropped) doomed.push_back(h.job.handle);
    for (auto& w : doomed)
      w.fail(std::make_exception_ptr(
          error(code, w.op_name() + " on group '" + group_ + "' failed: " + why)));
    return unfinished;
  }

  /// Submits the teardown job (a failure already aborted every communicator);
  /// its work completes once it ran.
  work submit_teardown(bool force) {
    std::lock_guard<std::mutex> g{mtx_};
    if (!queue_) return {};
    auto self = shared_from_this();
    auto j = internal_job("nccl teardown", [self, force] { self->teardown(force); });
    auto done = j.handle;
    queue_->submit(std::move(j));
    return done;
  }

  error refusal(const char* op) const {
    std::lock_guard<std::mutex> g{mtx_};
    return refusal_locked(op);
  }

  error refusal_locked(const char* op) const {
    const auto code = broken_ ? broken_->code : errc::aborted;
    const auto why = broken_ ? broken_->why : std::string("it is shutting down");
    return error(code, std::string(op) + ": group '" + group_ + "' can no longer be used: " + why);
  }

  std::vector<std::shared_ptr<communicator>> communicators() const {
    std::lock_guard<std::mutex> g{mtx_};
    std::vector<std::shared_ptr<communicator>> r;
    for (auto& kv : comms_) r.push_back(kv.second);
    return r;
  }

  rank_runtime& rt_;
  std::shared_ptr<store> store_;
  int rank_;
  int size_;
  std::string group_;
  timeout_t timeout_;
  std::mutex create_mtx_;   // one communicator set-up at a time (may wait on the store)
  mutable std::mutex mtx_;  // everything below
  int device_ = -1;         // the group's device, once bound
  std::shared_ptr<gpu::device_queue> queue_;
  std::map<std::string, std::shared_ptr<communicator>> comms_;
  std::vector<work> pending_;
  std::uint64_t issued_ = 0;
  std::optional<failure> broken_;
  std::atomic<bool> stopping_{false};  // broken_ is set (read without the lock)
  std::atomic<std::thread::id> actor_thread_{};
};

// -- the backend: each call's plan -----------------------------------------------------

class nccl_backend final : public backend {
 public:
  explicit nccl_backend(const backend_context& ctx)
      : backend(ctx), g_(std::make_shared<nccl_group>(ctx)) {}
  ~nccl_backend() override { g_->shutdown(); }

  std::string name() const override { return "nccl"; }

  work broadcast(tensor_list& ts, const broadcast_options& o) override {
    const char* op = "broadcast";
    prepare(op, ts);
    const auto& src = ts[static_cast<std::size_t>(rank() == o.root_rank ? o.root_tensor : 0)];
    plan p;
    p.collectives.push_back(on(collective::broadcast, src, src, numel(src), {}, o.root_rank));
    for (auto& t : ts)
      if (!t.is_same(src)) p.unpack.push_back(segment(t, 0, src, 0, numel(src)));
    return g_->issue(op, whole_group, std::move(p), ts, o.timeout);
  }

  work allreduce(tensor_list& ts, const allreduce_options& o) override {
    return reducing("allreduce", collective::allreduce, ts, o.op, 0, 0, o.timeout);
  }

  work allreduce_coalesced(tensor_list& ts, const allreduce_coalesced_options& o) override {
    return paired("allreduce_coalesced", collective::allreduce, ts, ts, o.op, o.timeout);
  }

  work reduce(tensor_list& ts, const reduce_options& o) override {
    return reducing("reduce", collective::reduce, ts, o.op, o.root_rank, o.root_tensor, o.timeout);
  }

  work allgather(std::vector<tensor_list>& outs, tensor_list& ins,
                 const allgather_options& o) override {
    // outs[i][r] <- rank r's ins[i]
    return gathered("allgather", outs, ins, o.timeout,
                    [&](std::size_t i, std::size_t r) -> const tensor& { return outs[i][r]; });
  }

  work allgather_coalesced(std::vector<tensor_list>& outs, tensor_list& ins,
                           const allgather_options& o) override {
    // outs[r][i] <- rank r's ins[i]
    return gathered("allgather_coalesced", outs, ins, o.timeout,
                    [&](std::size_t i, std::size_t r) -> const tensor& { return outs[r][i]; });
  }

  work allgather_into_tensor(tensor& out, tensor& in, const allgather_options& o) override {
    tensor_list outs{out}, ins{in};
    return paired("allgather_into_tensor", collective::allgather, outs, ins, {}, o.timeout);
  }

  work allgather_into_tensor_coalesced(tensor_list& outs, tensor_list& ins,
                                       const allgather_options& o) override {
    return paired("allgather_into_tensor_coalesced", collective::allgather, outs, ins, {},
                  o.timeout);
  }

  work allgatherv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                  const allgather_options& o) override {
    // Rank r broadcasts its block into everyone's output.
    const char* op = "allgatherv";
    prepare(op, {out, in});
    auto p = keeping({in});
    const auto off = starts(counts);
    for (int r = 0; r < size(); ++r) {
      auto block = at(out, off[rank_index(r)]);
      const void* send = r == rank() ? in.data() : block;  // only the root's is read
      p.collectives.push_back(
          {collective::broadcast, send, block, count_of(counts, r), out.scalar_type(), {}, r});
    }
    return g_->issue(op, whole_group, std::move(p), {out}, o.timeout);
  }

  work gather(std::vector<tensor_list>& outs, tensor_list& ins, const gather_options& o) override {
    const char* op = "gather";
    auto all = flatten(outs);
    prepare(op, both(ins, all));
    auto p = keeping(ins);
    const auto m = numel(ins[0]);
    exchange(p, true, ins[0], 0, m, o.root_rank);
    if (rank() == o.root_rank)
      for (int r = 0; r < size(); ++r) exchange(p, false, outs[0][rank_index(r)], 0, m, r);
    return g_->issue(op, whole_group, std::move(p), all, o.timeout);
  }

  work gatherv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
               const gather_options& o) override {
    // The output matters on the root only.
    const char* op = "gatherv";
    const bool root = rank() == o.root_rank;
    tensor_list ts = root ? tensor_list{out, in} : tensor_list{in};
    prepare(op, ts);
    auto p = keeping({in});
    exchange(p, true, in, 0, count_of(counts, rank()), o.root_rank);
    const auto off = starts(counts);
    if (root)
      for (int r = 0; r < size(); ++r)
        exchange(p, false, out, off[rank_index(r)], count_of(counts, r), r);
    return g_->issue(op, whole_group, std::move(p), {out}, o.timeout);
  }

  work scatter(tensor_list& outs, std::vector<tensor_list>& ins,
               const scatter_options& o) override {
    const char* op = "scatter";
    auto all = flatten(ins);
    prepare(op, both(outs, all));
    auto p = keeping(all);
    const auto m = numel(outs[0]);
    if (rank() == o.root_rank)
      for (int r = 0; r < size(); ++r) exchange(p, true, ins[0][rank_index(r)], 0, m, r);
    exchange(p, false, outs[0], 0, m, o.root_rank);
    return g_->issue(op, whole_group, std::move(p), outs, o.timeout);
  }

  work scatterv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                const scatter_options& o) override {
    const char* op = "scatterv";
    const bool root = rank() == o.root_rank;
    tensor_list ts = root ? tensor_list{out, in} : tensor_list{out};
    prepare(op, ts);
    auto p = keeping(ts);
    const auto off = starts(counts);
    if (root)
      for (int r = 0; r < size(); ++r)
        exchange(p, true, in, off[rank_index(r)], count_of(counts, r), r);
    exchange(p, false, out, 0, count_of(counts, rank()), o.root_rank);
    return g_->issue(op, whole_group, std::move(p), {out}, o.timeout);
  }

  work reduce_scatter(tensor_list& outs, std::vector<tensor_list>& ins,
                      const reduce_scatter_options& o) override {
    // The inputs (one per rank) are packed into one buffer first.
    const char* op = "reduce_scatter";
    auto& parts = ins[0];
    const int dev = prepare(op, both(outs, parts));
    const auto m = numel(outs[0]);
    auto buf = scratch(outs[0], m * static_cast<std::size_t>(size()), dev);
    auto p = keeping(parts);
    p.keep.push_back(buf);
    for (int r = 0; r < size(); ++r)
      p.pack.push_back(segment(buf, rank_index(r) * m, parts[rank_index(r)], 0, m));
    p.collectives.push_back(on(collective::reduce_scatter, buf, outs[0], m,
                               reduction_of(op, o.op, outs[0].scalar_type())));
    return g_->issue(op, whole_group, std::move(p), outs, o.timeout);
  }

  work reduce_scatter_tensor(tensor& out, tensor& in, const reduce_scatter_options& o) override {
    tensor_list outs{out}, ins{in};
    return paired("reduce_scatter_tensor", collective::reduce_scatter, outs, ins, o.op, o.timeout);
  }

  work reduce_scatter_tensor_coalesced(tensor_list& outs, tensor_list& ins,
                                       const reduce_scatter_options& o) override {
    return paired("reduce_scatter_tensor_coalesced", collective::reduce_scatter, outs, ins, o.op,
                  o.timeout);
  }

  work reduce_scatterv(tensor& out, tensor& in, const std::vector<std::int64_t>& counts,
                       const reduce_scatter_options& o) override {
    // Every rank reduces block r into rank r's output.
    const char* op = "reduce_scatterv";
    prepare(op, {out, in});
    const auto red = reduction_of(op, o.op, in.scalar_type());
    auto p = keeping({in});
    const auto off = starts(counts);
    for (int r = 0; r < size(); ++r) {
      auto block = at(in, off[rank_index(r)]);
      void* recv = r == rank() ? out.data() : block;  // only the root's is written
      p.collectives.push_back(
          {collective::reduce, block, recv, count_of(counts, r), in.scalar_type(), red, r});
    }
    return g_->issue(op, whole_group, std::move(p), {out}, o.timeout);
  }

  work alltoall_single(tensor& out, tensor& in, const std::vector<std::int64_t>& out_splits,
                       const std::vector<std::int64_t>& in_splits,
                       const alltoall_options& o) override {
    const char* op = "alltoall_single";
    prepare(op, {out, in});
    const auto send = rows_to_elements(in, in_splits), recv = rows_to_elements(out, out_splits);
    const auto send_at = starts(send), recv_at = starts(recv);
    auto p = keeping({in});
    for (int r = 0; r < size(); ++r) {
      exchange(p, true, in, send_at[rank_index(r)], count_of(send, r), r);
      exchange(p, false, out, recv_at[rank_index(r)], count_of(recv, r), r);
    }
    return g_->issue(op, whole_group, std::move(p), {out}, o.timeout);
  }

  work alltoall(tensor_list& outs, tensor_list& ins, const alltoall_options& o) override {
    const char* op = "alltoall";
    prepare(op, both(outs, ins));
    auto p = keeping(ins);
    for (int r = 0; r < size(); ++r) {
      const auto& x = ins[rank_index(r)];
      const auto& y = outs[rank_index(r)];
      exchange(p, true, x, 0, numel(x), r);
      exchange(p, false, y, 0, numel(y), r);
    }
    return g_->issue(op, whole_group, std::move(p), outs, o.timeout);
  }

  work barrier(const barrier_options& o) override {
    // An allreduce of one byte, as ProcessGroupNCCL's barrier.
    const int dev = g_->bind_default("barrier");
    auto one = tensor::empty({1}, dtype::uint8, device::cuda(dev));
    auto p = keeping({one});
    p.collectives.push_back(on(collective::allreduce, one, one, 1));
    return g_->issue("barrier", whole_group, std::move(p), {}, o.timeout);
  }

  work send(tensor_list& ts, int dst, const p2p_options& o) override {
    return point_to_point("send", true, ts, dst, o);
  }

  work recv(tensor_list& ts, int src, const p2p_options& o) override {
    return point_to_point("recv", false, ts, src, o);
  }

  std::uint64_t sequence_number() override { return g_->sequence(); }

  void abort(const std::string& reason) override { g_->abort(reason); }

 private:
  /// Refuses dtypes without an NCCL type and tensors off the group's device; returns the device.
  int prepare(const char* op, const tensor_list& ts) {
    check_types(op, ts);
    return g_->bind(op, ts);
  }

  static std::size_t rank_index(int r) { return static_cast<std::size_t>(r); }

  static std::size_t count_of(const std::vector<std::int64_t>& counts, int r) {
    return static_cast<std::size_t>(counts[rank_index(r)]);
  }

  std::vector<std::int64_t> rows_to_elements(const tensor& t,
                                             const std::vector<std::int64_t>& splits) const {
    return split_elements(t, splits, size());
  }

  /// allreduce and reduce: in place on one tensor, or combined over several.
  work reducing(const char* op, collective::kind_t k, tensor_list& ts, const reduce_op& r, int root,
                int root_tensor, timeout_t t) {
    const int dev = prepare(op, ts);
    const auto red = reduction_of(op, r, ts[0].scalar_type());
    plan p;
    if (ts.size() == 1)
      p.collectives.push_back(on(k, ts[0], ts[0], numel(ts[0]), red, root));
    else
      p = combined(op, k, ts, r, root, root_tensor, dev);
    return g_->issue(op, whole_group, std::move(p), ts, t);
  }

  /// Several local tensors: gpu::reduce combines them into one buffer
  /// (scaled for PREMUL_SUM), NCCL reduces that buffer across ranks (SUM for
  /// AVG and PREMUL_SUM), and gpu::reduce writes the result, divided by
  /// size × tensors for AVG, into every tensor (allreduce) or the root tensor (reduce).
  plan combined(const char* op, collective::kind_t k, const tensor_list& ts, const reduce_op& r,
                int root, int root_tensor, int dev) const {
    const auto t = ts[0].scalar_type();
    const auto n = numel(ts[0]);
    const bool avg = r.op() == reduce_op::AVG, premul = r.op() == reduce_op::PREMUL_SUM;
    plan p;
    // allreduce reduces into the first tensor; reduce into scratch, so that
    // the tensors of ranks other than the root stay as they were.
    auto buf = k == collective::allreduce ? ts[0] : scratch(ts[0], n, dev);
    p.keep.push_back(buf);
    gpu::reduce_args in{t, avg || premul ? reduce_op::SUM : r.op(), n, {}, {}, {buf.data()}, 0.0};
    for (auto& x : ts) in.srcs.push_back(x.data());
    if (premul) in.scales.assign(ts.size(), r.scale());
    p.combine.push_back(in);
    const auto across =
        avg || premul ? reduction_of(op, reduce_op::SUM, t) : reduction_of(op, r, t);
    p.collectives.push_back(on(k, buf, buf, n, across, root));
    const double divisor = avg ? static_cast<double>(size()) * static_cast<double>(ts.size()) : 0.0;
    gpu::reduce_args out{t, reduce_op::SUM, n, {buf.data()}, {}, {}, divisor};
    if (k == collective::allreduce)
      for (auto& x : ts) out.dsts.push_back(x.data());
    else if (rank() == root)
      out.dsts.push_back(ts[static_cast<std::size_t>(root_tensor)].data());
    if (!out.dsts.empty()) p.spread.push_back(out);
    return p;
  }

  /// One NCCL collective per (input, output) pair, in one group (`r`: the
  /// reduction, for reducing kinds).
  work paired(const char* op, collective::kind_t k, tensor_list& outs, tensor_list& ins,
              const std::optional<reduce_op>& r, timeout_t t) {
    prepare(op, both(outs, ins));
    auto p = keeping(ins);
    for (std::size_t i = 0; i < ins.size(); ++i) {
      const auto n = k == collective::allgather ? numel(ins[i]) : numel(outs[i]);
      const auto red = r ? reduction_of(op, *r, ins[i].scalar_type()) : reduction{};
      p.collectives.push_back(on(k, ins[i], outs[i], n, red));
    }
    return g_->issue(op, whole_group, std::move(p), outs, t);
  }

  /// allgather into flat buffers (one per input), unpacked into out(i, r).
  template <class Out>
  work gathered(const char* op, std::vector<tensor_list>& outs, tensor_list& ins, timeout_t t,
                Out out) {
    auto all = flatten(outs);
    const int dev = prepare(op, both(ins, all));
    const auto n = static_cast<std::size_t>(size());
    auto p = keeping(ins);
    for (std::size_t i = 0; i < ins.size(); ++i) {
      const auto m = numel(ins[i]);
      auto buf = scratch(ins[i], m * n, dev);
      p.keep.push_back(buf);
      p.collectives.push_back(on(collective::allgather, ins[i], buf, m));
      for (std::size_t r = 0; r < n; ++r) p.unpack.push_back(segment(out(i, r), 0, buf, r * m, m));
    }
    return g_->issue(op, whole_group, std::move(p), all, t);
  }

  /// send and recv: one transfer on the pair's communicator (tags are ignored, as in NCCL).
  work point_to_point(const char* op, bool send, tensor_list& ts, int peer, const p2p_options& o) {
    prepare(op, ts);
    plan p;
    exchange(p, send, ts[0], 0, numel(ts[0]), peer < rank() ? 0 : 1);
    return g_->issue(op, peer, std::move(p), ts, o.timeout, send ? -1 : peer);
  }

  std::shared_ptr<nccl_group> g_;
};

}  // namespace

std::shared_ptr<backend> make_nccl_backend(const backend_context& ctx) {
  return std::make_shared<nccl_backend>(ctx);
}

}  // namespace troupe::detail
