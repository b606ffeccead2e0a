// Launching one job's plan on the stream (see backends/nccl_launch.hpp).

#include "backends/nccl_launch.hpp"

#include <cuda_runtime.h>

#include <thread>

#include "base/texts.hpp"

namespace troupe::detail::nccl {

namespace {

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
        throw error(errc::timeout, std::string(op_) + ": cuda:" + std::to_string(device_) + ": " +
                                       timeout_after(timeout_) + ": " + call +
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

}  // namespace

void launch(const char* op, int device, ncclComm_t comm, gpu::stream_t stream,
            const std::atomic<bool>& stop, timeout_t timeout, const plan& p) {
  launcher{op, device, comm, stream, stop, timeout}.run(p);
}

}  // namespace troupe::detail::nccl
