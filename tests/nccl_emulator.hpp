#pragma once
// nccl_emulator — a host emulator of NCCL for the "nccl" backend's mapping
// tests (test_nccl_mapping.cpp): each rank's backend hands its plans to it
// instead of the group's NCCL state, so the mapping of every c10d call onto
// NCCL plans is checked without a GPU. Only with NCCL's headers
// (TROUPE_HAVE_NCCL).
//
// The emulator (one per group, one plan_runner per rank)
//   matching     a communicator (the group's, or a pair's for send/recv) runs
//                its members' k-th plans together, once every member issued
//                its k-th; ranks are driven from one thread, so the last
//                rank's call runs the plans and completes every rank's work.
//   a plan       per rank: pack (memcpy), combine (the CPU kernels); then the
//                NCCL group: collectives index by index across ranks, then the
//                sends matched in order with the peers' receives; then per
//                rank: unpack (memcpy), spread (the CPU kernels).
//   NCCL rules   collectives run on the wire type (bool as uint8, complex as
//                pairs of reals) with ncclSum/Prod/Min/Max/Avg and PREMUL_SUM;
//                ranks must agree on every collective's kind, count, type, op
//                and root, and on every send's count, and buffers of one
//                NCCL group may not overlap except in NCCL's in-place forms.
//                What would hang or race on NCCL fails the call instead,
//                saying why.

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../backends/direct_plan.hpp"
#include "../backends/nccl_backend.hpp"
#include "../backends/nccl_runner.hpp"
#include "troupe/troupe.hpp"

namespace troupe::test::nccl_emulator {

namespace nccl = troupe::detail::nccl;
namespace gpu = troupe::detail::gpu;

// -- the emulator ---------------------------------------------------------------------

/// Fails the calls being run: what NCCL would hang on, race on or refuse.
/// (Each rank's work fails with "OP: NCCL emulator: WHY".)
[[noreturn]] inline void emulation_fails(const std::string& why) {
  throw error(errc::backend, why);
}

inline dtype dtype_of_wire(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
      return dtype::int8;
    case ncclUint8:
      return dtype::uint8;
    case ncclInt32:
      return dtype::int32;
    case ncclInt64:
      return dtype::int64;
    case ncclFloat16:
      return dtype::float16;
    case ncclBfloat16:
      return dtype::bfloat16;
    case ncclFloat32:
      return dtype::float32;
    case ncclFloat64:
      return dtype::float64;
    default:
      break;
  }
  throw error(errc::internal, "NCCL emulator: unexpected ncclDataType_t " + std::to_string(t));
}

/// A buffer as NCCL sees it: `n` elements of the wire type.
struct on_wire {
  dtype type;
  std::size_t n;
  std::size_t bytes() const { return n * element_size(type); }
};

inline on_wire wire(const std::string& op, dtype t, std::size_t count) {
  const auto w = nccl::wire_of(op.c_str(), t);
  return {dtype_of_wire(w.type), count * w.lanes};
}

inline const char* kind_name(nccl::collective::kind_t k) {
  static const char* names[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather",
                                "ncclReduceScatter"};
  return names[k];
}

/// Byte ranges one rank's NCCL group reads or writes, for the overlap check.
struct span {
  const char* at;
  std::size_t bytes;
  bool overlaps(const span& o) const {
    return bytes > 0 && o.bytes > 0 && at < o.at + o.bytes && o.at < at + bytes;
  }
};

struct access {
  std::string what;
  std::vector<span> reads, writes;
};

/// One call a rank issued, waiting for its peers'.
struct pending_call {
  std::string op;
  int rank = 0;  ///< group rank
  nccl::plan p;
  tensor_list outputs;
  int source = -1;
  work w;
};

/// The ranks of one group, their communicators and their pending calls.
class emulator {
 public:
  emulator(int size, std::string group) : size_(size), group_(std::move(group)), issued_(size) {}

  work issue(int rank, const char* op, int peer, nccl::plan p, tensor_list outputs, int source) {
    auto w = work::make(op, group_);
    const auto r = static_cast<std::size_t>(rank);
    w.set_sequence_number(++issued_[r]);
    if (broken_) {
      w.fail(std::make_exception_ptr(error(errc::aborted, std::string(op) + ": " + *broken_)));
      return w;
    }
    auto& c = communicator(rank, peer);
    const auto at = static_cast<std::size_t>(std::find(c.members.begin(), c.members.end(), rank) -
                                             c.members.begin());
    c.queues[at].push_back({op, rank, std::move(p), std::move(outputs), source, w});
    if (std::all_of(c.queues.begin(), c.queues.end(), [](auto& q) { return !q.empty(); })) {
      std::vector<pending_call> calls;
      for (auto& q : c.queues) {
        calls.push_back(std::move(q.front()));
        q.pop_front();
      }
      finish(calls);
    }
    return w;
  }

  std::uint64_t sequence(int rank) const { return issued_[static_cast<std::size_t>(rank)]; }

  /// Fails every pending call (of every rank: a broken NCCL group never completes) and later ones.
  void abort(const std::string& reason) {
    if (!broken_) broken_ = "aborted: " + reason;
    for (auto& [key, c] : comms_)
      for (auto& q : c.queues) {
        for (auto& call : q)
          call.w.fail(std::make_exception_ptr(error(errc::aborted, call.op + ": " + *broken_)));
        q.clear();
      }
  }

 private:
  struct comm {
    std::vector<int> members;  ///< comm rank -> group rank
    std::vector<std::deque<pending_call>> queues;
  };

  comm& communicator(int rank, int peer) {
    std::vector<int> members;
    if (peer == nccl::whole_group)
      for (int r = 0; r < size_; ++r) members.push_back(r);
    else
      members = {std::min(rank, peer), std::max(rank, peer)};
    std::string key;
    for (auto m : members) key += std::to_string(m) + ",";
    auto& c = comms_[peer == nccl::whole_group ? "group" : key];
    if (c.members.empty()) {
      c.members = members;
      c.queues.resize(members.size());
    }
    return c;
  }

  /// Runs the calls (calls[i]: the communicator's rank i) and completes or fails them all.
  void finish(std::vector<pending_call>& calls) {
    try {
      run(calls);
    } catch (const error& e) {
      for (auto& c : calls)
        c.w.fail(std::make_exception_ptr(
            error(e.code(), c.op + ": NCCL emulator: " + std::string(e.what()))));
      return;
    }
    for (auto& c : calls) c.w.complete(c.outputs, c.source);
  }

  static void copy(const std::vector<gpu::copy_segment>& segments) {
    for (auto& s : segments) std::memmove(s.dst, s.src, s.bytes);
  }

  void run(std::vector<pending_call>& calls) {
    for (auto& c : calls) check_lifetimes(c, calls.size());
    for (auto& c : calls) {
      copy(c.p.pack);
      detail::run_on_cpu(c.p.combine);
    }
    check_overlaps(calls);
    run_collectives(calls);
    run_transfers(calls);
    for (auto& c : calls) {
      copy(c.p.unpack);
      detail::run_on_cpu(c.p.spread);
    }
  }

  // -- collectives ----------------------------------------------------------------------

  void run_collectives(std::vector<pending_call>& calls) {
    const auto& op = calls[0].op;
    const auto count = calls[0].p.collectives.size();
    for (auto& c : calls)
      if (c.p.collectives.size() != count)
        emulation_fails("rank " + std::to_string(c.rank) + " issues " +
                        std::to_string(c.p.collectives.size()) + " collectives, rank " +
                        std::to_string(calls[0].rank) + " " + std::to_string(count) +
                        ": NCCL would hang");
    for (std::size_t j = 0; j < count; ++j) {
      std::vector<const nccl::collective*> cs;
      for (auto& c : calls) cs.push_back(&c.p.collectives[j]);
      run_collective(op, j, cs);
    }
  }

  static void agree(const std::string& op, std::size_t j,
                    const std::vector<const nccl::collective*>& cs) {
    const auto& a = *cs[0];
    for (std::size_t i = 1; i < cs.size(); ++i) {
      const auto& b = *cs[i];
      auto differ = [&](const std::string& what, const std::string& x, const std::string& y) {
        emulation_fails("collective " + std::to_string(j) + " (" + kind_name(a.kind) +
                        "): comm rank 0 has " + what + " " + x + ", comm rank " +
                        std::to_string(i) + " has " + y);
      };
      if (a.kind != b.kind) differ("kind", kind_name(a.kind), kind_name(b.kind));
      const auto wa = wire(op, a.type, a.count), wb = wire(op, b.type, b.count);
      if (wa.type != wb.type)
        differ("wire type", std::string(to_string(wa.type)), std::string(to_string(wb.type)));
      if (wa.n != wb.n) differ("count", std::to_string(wa.n), std::to_string(wb.n));
      if (a.root != b.root) differ("root", std::to_string(a.root), std::to_string(b.root));
      if (a.red.op != b.red.op || a.red.premul != b.red.premul || a.red.scale != b.red.scale)
        differ("reduction", std::to_string(a.red.op), std::to_string(b.red.op));
    }
    if (a.root < 0 || a.root >= static_cast<int>(cs.size()))
      emulation_fails("collective " + std::to_string(j) + " has root " + std::to_string(a.root) +
                      " outside the communicator");
  }

  /// The reduction step of collective `c` on the wire, from `srcs` into `dst`.
  static gpu::reduce_args reduction(const nccl::collective& c, on_wire w,
                                    std::vector<const void*> srcs, void* dst) {
    gpu::reduce_args a{w.type, reduce_op::SUM, w.n, std::move(srcs), {}, {dst}, 0.0};
    if (c.red.premul) {
      if (c.red.op != ncclSum) emulation_fails("PREMUL_SUM must be made from ncclSum");
      a.scales.assign(a.srcs.size(), c.red.scale);
      return a;
    }
    switch (c.red.op) {
      case ncclSum:
        break;
      case ncclProd:
        a.op = reduce_op::PRODUCT;
        break;
      case ncclMin:
        a.op = reduce_op::MIN;
        break;
      case ncclMax:
        a.op = reduce_op::MAX;
        break;
      case ncclAvg:
        if (!is_floating_point(w.type))
          emulation_fails("ncclAvg on " + std::string(to_string(w.type)));
        a.divisor = static_cast<double>(a.srcs.size());
        break;
      default:
        emulation_fails("unknown ncclRedOp_t " + std::to_string(c.red.op));
    }
    return a;
  }

  static void run_collective(const std::string& op, std::size_t j,
                             const std::vector<const nccl::collective*>& cs) {
    agree(op, j, cs);
    const auto& c0 = *cs[0];
    const auto w = wire(op, c0.type, c0.count);
    if (w.n == 0) return;  // as the launcher: every rank skips it
    const auto m = cs.size();
    const auto b = w.bytes();
    auto send = [&](std::size_t i) { return static_cast<const char*>(cs[i]->send); };
    auto recv = [&](std::size_t i) { return static_cast<char*>(cs[i]->recv); };
    std::vector<const void*> sends;
    for (std::size_t i = 0; i < m; ++i) sends.push_back(send(i));
    const auto root = static_cast<std::size_t>(c0.root);
    switch (c0.kind) {
      case nccl::collective::allreduce: {
        std::vector<char> acc(b);
        detail::run_on_cpu({reduction(c0, w, sends, acc.data())});
        for (std::size_t i = 0; i < m; ++i) std::memcpy(recv(i), acc.data(), b);
        return;
      }
      case nccl::collective::broadcast: {
        std::vector<char> v(send(root), send(root) + b);
        for (std::size_t i = 0; i < m; ++i) std::memcpy(recv(i), v.data(), b);
        return;
      }
      case nccl::collective::reduce: {
        std::vector<char> acc(b);
        detail::run_on_cpu({reduction(c0, w, sends, acc.data())});
        std::memcpy(recv(root), acc.data(), b);
        return;
      }
      case nccl::collective::allgather: {
        std::vector<char> all(b * m);
        for (std::size_t i = 0; i < m; ++i) std::memcpy(all.data() + i * b, send(i), b);
        for (std::size_t i = 0; i < m; ++i) std::memcpy(recv(i), all.data(), b * m);
        return;
      }
      case nccl::collective::reduce_scatter: {
        std::vector<char> acc(b * m);
        for (std::size_t k = 0; k < m; ++k) {
          std::vector<const void*> blocks;
          for (std::size_t i = 0; i < m; ++i) blocks.push_back(send(i) + k * b);
          detail::run_on_cpu({reduction(c0, w, blocks, acc.data() + k * b)});
        }
        for (std::size_t i = 0; i < m; ++i) std::memcpy(recv(i), acc.data() + i * b, b);
        return;
      }
    }
  }

  // -- sends and receives ---------------------------------------------------------------

  void run_transfers(std::vector<pending_call>& calls) {
    const auto& op = calls[0].op;
    const auto m = calls.size();
    // ops[i][p]: comm rank i's sends to (or receives from) comm rank p, in order.
    using lists = std::vector<std::vector<std::vector<const nccl::transfer*>>>;
    lists sends(m, std::vector<std::vector<const nccl::transfer*>>(m)), recvs = sends;
    for (std::size_t i = 0; i < m; ++i)
      for (auto& t : calls[i].p.transfers) {
        if (t.peer < 0 || static_cast<std::size_t>(t.peer) >= m)
          emulation_fails("rank " + std::to_string(calls[i].rank) + " names peer " +
                          std::to_string(t.peer) + " of a communicator of " + std::to_string(m));
        (t.send ? sends : recvs)[i][static_cast<std::size_t>(t.peer)].push_back(&t);
      }
    auto who = [&](std::size_t i) { return "rank " + std::to_string(calls[i].rank); };
    // Match, and read every send before any receive is written.
    std::vector<std::pair<void*, std::vector<char>>> deliveries;
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t p = 0; p < m; ++p) {
        const auto& s = sends[i][p];
        const auto& r = recvs[p][i];
        if (s.size() != r.size())
          emulation_fails(who(i) + " posts " + std::to_string(s.size()) + " sends to " + who(p) +
                          ", which posts " + std::to_string(r.size()) +
                          " receives from it: NCCL would hang");
        for (std::size_t k = 0; k < s.size(); ++k) {
          const auto ws = wire(op, s[k]->type, s[k]->count), wr = wire(op, r[k]->type, r[k]->count);
          if (ws.type != wr.type || ws.n != wr.n)
            emulation_fails(who(i) + "'s send " + std::to_string(k) + " to " + who(p) +
                            " carries " + std::to_string(ws.n) + " " +
                            std::string(to_string(ws.type)) + ", the receive takes " +
                            std::to_string(wr.n) + " " + std::string(to_string(wr.type)) +
                            ": NCCL would hang or truncate");
          const auto* from = static_cast<const char*>(s[k]->buf);
          deliveries.push_back({r[k]->buf, std::vector<char>(from, from + ws.bytes())});
        }
      }
    for (auto& [to, data] : deliveries) std::memcpy(to, data.data(), data.size());
  }

  // -- lifetimes: the job holds the plan (keep) and the outputs, nothing else -----------

  static void check_lifetimes(const pending_call& c, std::size_t m) {
    auto held = [&](const void* p, std::size_t bytes) {
      if (bytes == 0) return;
      const auto* at = static_cast<const char*>(p);
      auto inside = [&](const tensor& t) {
        if (!t.defined()) return false;
        const auto* base = static_cast<const char*>(t.data());
        return at >= base && at + bytes <= base + t.nbytes();
      };
      if (std::none_of(c.p.keep.begin(), c.p.keep.end(), inside) &&
          std::none_of(c.outputs.begin(), c.outputs.end(), inside))
        emulation_fails("rank " + std::to_string(c.rank) + "'s plan uses " + std::to_string(bytes) +
                        " bytes that neither its keep list nor its outputs hold alive");
    };
    for (auto& s : c.p.pack) held(s.src, s.bytes), held(s.dst, s.bytes);
    for (auto& s : c.p.unpack) held(s.src, s.bytes), held(s.dst, s.bytes);
    for (const auto* steps : {&c.p.combine, &c.p.spread})
      for (auto& a : *steps) {
        const auto b = a.count * element_size(a.type);
        for (auto* p : a.srcs) held(p, b);
        for (auto* p : a.dsts) held(p, b);
      }
    for (auto& x : c.p.collectives) {
      // (the buffers non-roots pass but NCCL ignores included)
      const auto b = wire(c.op, x.type, x.count).bytes();
      held(x.send, x.kind == nccl::collective::reduce_scatter ? b * m : b);
      held(x.recv, x.kind == nccl::collective::allgather ? b * m : b);
    }
    for (auto& t : c.p.transfers) held(t.buf, wire(c.op, t.type, t.count).bytes());
  }

  // -- overlaps within one NCCL group ---------------------------------------------------

  /// Buffers of one rank's NCCL group: one operation's writes may not touch
  /// another's reads or writes; a collective's own send and recv overlap only
  /// in NCCL's in-place forms.
  void check_overlaps(const std::vector<pending_call>& calls) const {
    const auto m = calls.size();
    for (std::size_t i = 0; i < m; ++i) {
      const auto& c = calls[i];
      std::vector<access> acc;
      for (std::size_t j = 0; j < c.p.collectives.size(); ++j) {
        const auto& x = c.p.collectives[j];
        const auto w = wire(c.op, x.type, x.count);
        if (w.n == 0) continue;
        const auto b = w.bytes();
        const auto* s = static_cast<const char*>(x.send);
        const auto* r = static_cast<const char*>(x.recv);
        const bool root = static_cast<std::size_t>(x.root) == i;
        access a{"collective " + std::to_string(j) + " (" + kind_name(x.kind) + ")", {}, {}};
        bool in_place = s == r;
        switch (x.kind) {
          case nccl::collective::allreduce:
            a.reads = {{s, b}};
            a.writes = {{r, b}};
            break;
          case nccl::collective::broadcast:
            if (root) a.reads = {{s, b}};
            a.writes = {{r, b}};
            break;
          case nccl::collective::reduce:
            a.reads = {{s, b}};
            if (root) a.writes = {{r, b}};
            break;
          case nccl::collective::allgather:
            a.reads = {{s, b}};
            a.writes = {{r, b * m}};
            in_place = s == r + i * b;
            break;
          case nccl::collective::reduce_scatter:
            a.reads = {{s, b * m}};
            a.writes = {{r, b}};
            in_place = r == s + i * b;
            break;
        }
        if (!in_place)
          for (auto& rd : a.reads)
            for (auto& wr : a.writes)
              if (rd.overlaps(wr))
                emulation_fails("rank " + std::to_string(c.rank) + ": " + a.what +
                                " has overlapping send and recv buffers that are not "
                                "NCCL's in-place form");
        acc.push_back(std::move(a));
      }
      for (std::size_t k = 0; k < c.p.transfers.size(); ++k) {
        const auto& t = c.p.transfers[k];
        const auto w = wire(c.op, t.type, t.count);
        access a{std::string(t.send ? "ncclSend " : "ncclRecv ") + std::to_string(k), {}, {}};
        (t.send ? a.reads : a.writes).push_back({static_cast<const char*>(t.buf), w.bytes()});
        acc.push_back(std::move(a));
      }
      for (std::size_t x = 0; x < acc.size(); ++x)
        for (std::size_t y = 0; y < acc.size(); ++y) {
          if (x == y) continue;
          for (auto& wr : acc[x].writes) {
            auto clash = [&](const std::vector<span>& v) {
              return std::any_of(v.begin(), v.end(), [&](const span& s) { return wr.overlaps(s); });
            };
            if (clash(acc[y].reads) || clash(acc[y].writes))
              emulation_fails("rank " + std::to_string(c.rank) + ": " + acc[x].what +
                              " writes memory that " + acc[y].what +
                              " of the same NCCL group uses: a race on a GPU");
          }
        }
    }
  }

  int size_;
  std::string group_;
  std::vector<std::uint64_t> issued_;
  std::map<std::string, comm> comms_;
  std::optional<std::string> broken_;
};

/// One rank's view of the emulator: what the backend runs its plans on.
class host_runner final : public nccl::plan_runner {
 public:
  host_runner(std::shared_ptr<emulator> e, int rank) : e_(std::move(e)), rank_(rank) {}

  int bind(const char*, const tensor_list&) override { return 0; }
  int bind_default(const char*) override { return 0; }
  tensor scratch(dtype t, std::size_t n, int device) override {
    scratch_devices.push_back(device);
    return tensor::empty({static_cast<std::int64_t>(n)}, t);
  }
  /// The device each scratch buffer was asked for, in order.
  std::vector<int> scratch_devices;
  work issue(const char* op, int peer, nccl::plan p, tensor_list outputs, timeout_t,
             int source = -1) override {
    return e_->issue(rank_, op, peer, std::move(p), std::move(outputs), source);
  }
  std::uint64_t sequence() const override { return e_->sequence(rank_); }
  void abort(const std::string& reason) override { e_->abort(reason); }
  void shutdown() override {}

 private:
  std::shared_ptr<emulator> e_;
  int rank_;
};

/// n "nccl" backends, one per rank, on one emulator.
struct emulated_group {
  explicit emulated_group(int n) : emu(std::make_shared<emulator>(n, "mapping")) {
    for (int r = 0; r < n; ++r) {
      backend_context ctx;
      ctx.rank = r;
      ctx.size = n;
      ctx.group_name = "mapping";
      ctx.timeout = std::chrono::seconds(10);
      runners.push_back(std::make_shared<host_runner>(emu, r));
      ranks.push_back(detail::make_nccl_backend(ctx, runners.back()));
    }
  }
  backend& operator[](int r) { return *ranks[static_cast<std::size_t>(r)]; }
  int size() const { return static_cast<int>(ranks.size()); }

  /// Issues fn(r) for every rank in order, then checks that every work completed.
  template <class F>
  void run(const std::string& what, F&& fn) {
    std::vector<work> ws;
    for (int r = 0; r < size(); ++r) ws.push_back(fn(r));
    for (int r = 0; r < size(); ++r) {
      INFO(what << ": rank " << r);
      auto& w = ws[static_cast<std::size_t>(r)];
      REQUIRE_MESSAGE(w.is_completed(), "the call is still pending in the emulator");
      if (auto e = w.exception()) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          FAIL(std::string(x.what()));
        }
      }
    }
  }

  std::shared_ptr<emulator> emu;
  std::vector<std::shared_ptr<host_runner>> runners;
  std::vector<std::shared_ptr<backend>> ranks;
};

}  // namespace troupe::test::nccl_emulator
