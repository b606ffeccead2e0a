// gloo_bench_worker — Gloo's side of the collectives benchmark (Debian
// libgloo-dev, TCP transport on 127.0.0.1): the same collectives, sizes,
// checks and timing as troupe_bench_worker (bench_common.cpp drives them).
//
//   gloo_bench_worker --ranks N [--csv F] [--quick] [--check-only] [--iters K]
//                     [--ops allreduce,broadcast,...|all] [--rss] [--transport LABEL]
//                     [--local L --node-rank K --store DIR --address A]
//
// Forks N rank processes that rendezvous through a gloo::rendezvous::FileStore
// in a fresh temporary directory and connect a full mesh of TCP pairs on
// 127.0.0.1. Across hosts (bench/hosts_bench.sh runs it on every emulated
// host), each host's worker forks only its L ranks, K*L to K*L+L-1 of N, whose
// pairs listen on A (this host's address), and every host's ranks rendezvous
// in DIR, a folder of a file system the hosts share (empty, made before).
// --transport labels the records (default tcp).
// allreduce, broadcast, allgather and alltoall use Gloo's options API (what
// PyTorch's ProcessGroupGloo calls); Gloo has no reduce_scatter there, so
// reduce_scatter is the older ReduceScatterHalvingDoubling algorithm object
// (in place: rank r's block lands at the front of its input buffer). With
// --ops (all): reduce (in place), gather and scatter (root 0) and barrier
// through the options API too; pingpong and halo on Gloo's unbound buffers
// (what ProcessGroupGloo's send and recv use): send + waitSend, recv +
// waitRecv, one buffer per pending operation.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/gather.h"
#include "gloo/math.h"
#include "gloo/reduce.h"
#include "gloo/reduce_scatter.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/scatter.h"
#include "gloo/transport/tcp/device.h"

namespace {

using context_ptr = std::shared_ptr<gloo::Context>;
using reduce_fn = void (*)(void*, const void*, const void*, size_t);

/// Tags of the options API: one per call, the same sequence on every rank.
struct tags {
  uint32_t next = 1;
  uint32_t operator()() { return next++; }
};

/// Slots of the point-to-point ops (below the options API's, which carry a
/// prefix in the top byte): halo's tell the direction, as troupe's tags.
constexpr uint64_t slot_base = uint64_t{0x7e} << 56;  // far from nextSlot()'s small numbers
constexpr uint64_t slot_pingpong = slot_base + 1, slot_rightward = slot_base + 2,
                   slot_leftward = slot_base + 3;

/// Gloo reports a timed-out wait by throwing; an aborted one returns false.
void check_wait(bool completed, const char* what) {
  if (!completed) throw std::runtime_error(std::string(what) + " aborted");
}

bench::prepared_op prepare(const context_ptr& ctx, tags& tag, bench::op_kind op,
                           const bench::layout& l) {
  using bench::op_kind;
  auto in = bench::alloc_floats(l.in_elems);
  auto out = in;  // in place unless the op has its own output
  float* i = in.get();
  std::function<void()> run;
  std::shared_ptr<void> algo;
  switch (op) {
    case op_kind::allreduce:
      run = [ctx, &tag, i, l] {
        gloo::AllreduceOptions o(ctx);
        o.setOutput(i, l.in_elems);
        o.setReduceFunction(static_cast<reduce_fn>(&gloo::sum<float>));
        o.setTag(tag());
        gloo::allreduce(o);
      };
      break;
    case op_kind::broadcast:
      run = [ctx, &tag, i, l] {
        gloo::BroadcastOptions o(ctx);
        o.setOutput(i, l.in_elems);
        o.setRoot(0);
        o.setTag(tag());
        gloo::broadcast(o);
      };
      break;
    case op_kind::allgather:
      out = bench::alloc_floats(l.out_elems);
      run = [ctx, &tag, i, o_ = out.get(), l] {
        gloo::AllgatherOptions o(ctx);
        o.setInput(i, l.in_elems);
        o.setOutput(o_, l.out_elems);
        o.setTag(tag());
        gloo::allgather(o);
      };
      break;
    case op_kind::alltoall:
      out = bench::alloc_floats(l.out_elems);
      run = [ctx, &tag, i, o_ = out.get(), l] {
        gloo::AlltoallOptions o(ctx);
        o.setInput(i, l.in_elems);
        o.setOutput(o_, l.out_elems);
        o.setTag(tag());
        gloo::alltoall(o);
      };
      break;
    case op_kind::reduce:
      run = [ctx, &tag, i, l] {
        gloo::ReduceOptions o(ctx);
        o.setOutput(i, l.in_elems);  // in place, as ProcessGroupGloo's reduce
        o.setRoot(0);
        o.setReduceFunction(static_cast<reduce_fn>(&gloo::sum<float>));
        o.setTag(tag());
        gloo::reduce(o);
      };
      break;
    case op_kind::gather:
      out = bench::alloc_floats(l.out_elems);
      run = [ctx, &tag, i, o_ = out.get(), l] {
        gloo::GatherOptions o(ctx);
        o.setInput(i, l.in_elems);
        if (ctx->rank == 0) o.setOutput(o_, l.out_elems);
        o.setRoot(0);
        o.setTag(tag());
        gloo::gather(o);
      };
      break;
    case op_kind::scatter:
      out = bench::alloc_floats(l.out_elems);
      run = [ctx, &tag, i, o_ = out.get(), l] {
        gloo::ScatterOptions o(ctx);
        if (ctx->rank == 0) {
          std::vector<float*> blocks;
          for (int r = 0; r < ctx->size; ++r) blocks.push_back(i + r * l.block);
          o.setInputs(blocks, l.block);
        }
        o.setOutput(o_, l.out_elems);
        o.setRoot(0);
        o.setTag(tag());
        gloo::scatter(o);
      };
      break;
    case op_kind::barrier:
      run = [ctx, &tag] {
        gloo::BarrierOptions o(ctx);
        o.setTag(tag());
        gloo::barrier(o);
      };
      break;
    case op_kind::pingpong: {
      // Rank 0 sends `in` and receives the echo into `out`; its partner
      // receives into `out` and sends it back (one buffer, one operation at
      // a time); the others wait.
      out = bench::alloc_floats(l.out_elems);
      const std::size_t bytes = l.in_elems * sizeof(float);
      std::shared_ptr<gloo::transport::UnboundBuffer> send_buf = ctx->createUnboundBuffer(i, bytes);
      std::shared_ptr<gloo::transport::UnboundBuffer> recv_buf =
          ctx->createUnboundBuffer(out.get(), bytes);
      const int partner = bench::pingpong_partner(ctx->size);
      if (ctx->rank == 0)
        run = [send_buf, recv_buf, partner] {
          send_buf->send(partner, slot_pingpong);
          check_wait(send_buf->waitSend(), "pingpong send");
          recv_buf->recv(partner, slot_pingpong);
          check_wait(recv_buf->waitRecv(), "pingpong recv");
        };
      else if (ctx->rank != partner)
        run = [] {};  // waits (the barrier before each iteration)
      else
        run = [recv_buf] {
          recv_buf->recv(0, slot_pingpong);
          check_wait(recv_buf->waitRecv(), "pingpong recv");
          recv_buf->send(0, slot_pingpong);
          check_wait(recv_buf->waitSend(), "pingpong send");
        };
      algo = std::make_shared<std::vector<std::shared_ptr<void>>>(
          std::vector<std::shared_ptr<void>>{send_buf, recv_buf});
      break;
    }
    case op_kind::halo: {
      // My block to both ring neighbours, theirs into the halves of `out`:
      // four buffers (two over the same input), all posted, then all waited.
      out = bench::alloc_floats(l.out_elems);
      const std::size_t bytes = l.in_elems * sizeof(float);
      const int left = (ctx->rank + ctx->size - 1) % ctx->size, right = (ctx->rank + 1) % ctx->size;
      std::shared_ptr<gloo::transport::UnboundBuffer> to_left = ctx->createUnboundBuffer(i, bytes);
      std::shared_ptr<gloo::transport::UnboundBuffer> to_right = ctx->createUnboundBuffer(i, bytes);
      std::shared_ptr<gloo::transport::UnboundBuffer> from_left =
          ctx->createUnboundBuffer(out.get(), bytes);
      std::shared_ptr<gloo::transport::UnboundBuffer> from_right =
          ctx->createUnboundBuffer(out.get() + l.in_elems, bytes);
      run = [=] {
        from_left->recv(left, slot_rightward);
        from_right->recv(right, slot_leftward);
        to_left->send(left, slot_leftward);
        to_right->send(right, slot_rightward);
        check_wait(to_left->waitSend(), "halo send");
        check_wait(to_right->waitSend(), "halo send");
        check_wait(from_left->waitRecv(), "halo recv");
        check_wait(from_right->waitRecv(), "halo recv");
      };
      algo = std::make_shared<std::vector<std::shared_ptr<void>>>(
          std::vector<std::shared_ptr<void>>{to_left, to_right, from_left, from_right});
      break;
    }
    case op_kind::reduce_scatter: {
      // Built once per size (it sets up its pair buffers collectively), run many times.
      std::vector<int> counts(ctx->size, static_cast<int>(l.block));
      auto rs = std::make_shared<gloo::ReduceScatterHalvingDoubling<float>>(
          ctx, std::vector<float*>{i}, static_cast<int>(l.in_elems), counts);
      run = [rs] { rs->run(); };
      algo = rs;
      break;
    }
  }
  float* o_ptr = op == op_kind::reduce_scatter ? i : out.get();
  auto keep = std::make_shared<std::vector<std::shared_ptr<void>>>(
      std::vector<std::shared_ptr<void>>{in, out, algo});
  return {i, o_ptr, std::move(run), keep};
}

/// Where this worker's ranks are: all N of them on this host (the default),
/// or L of them on host K of several (--local, --node-rank, --store, --address).
struct placement {
  int local = 0;  ///< ranks this worker forks; 0: all
  int node_rank = 0;
  std::string store;  ///< the shared rendezvous folder; empty: a fresh temporary one
  std::string address = "127.0.0.1";  ///< where this host's ranks listen
};

/// Takes the placement options out of argv (the rest goes to parse_worker_args).
placement take_placement(int& argc, char** argv) {
  placement p;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f != "--local" && f != "--node-rank" && f != "--store" && f != "--address") {
      argv[kept++] = argv[i];
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(f + " expects a value");
    const std::string v = argv[++i];
    auto number = [&](int least) {
      std::size_t used = 0;
      int n = -1;
      try {
        n = std::stoi(v, &used);
      } catch (const std::exception&) {
      }
      if (used != v.size() || n < least)
        throw std::invalid_argument(f + " expects an integer >= " + std::to_string(least) +
                                    ", got '" + v + "'");
      return n;
    };
    if (f == "--local")
      p.local = number(1);
    else if (f == "--node-rank")
      p.node_rank = number(0);
    else if (f == "--store")
      p.store = v;
    else
      p.address = v;
  }
  argc = kept;
  return p;
}

/// One rank process: connect, then run everything.
int run_rank_process(int rank, const std::string& dir, const std::string& address,
                     const bench::worker_args& a) {
  gloo::transport::tcp::attr attr;
  attr.hostname = address;
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(dir);
  auto rctx = std::make_shared<gloo::rendezvous::Context>(rank, a.ranks);
  rctx->setTimeout(std::chrono::minutes(5));
  rctx->connectFullMesh(store, dev);
  context_ptr ctx = rctx;
  tags tag;

  bench::rank_runtime rt;
  rt.rank = rank;
  rt.size = a.ranks;
  rt.barrier = [&] {
    gloo::BarrierOptions o(ctx);
    o.setTag(tag());
    gloo::barrier(o);
  };
  rt.max_all = [&](std::vector<double>& v) {
    gloo::AllreduceOptions o(ctx);
    o.setOutput(v.data(), v.size());
    o.setReduceFunction(static_cast<reduce_fn>(&gloo::max<double>));
    o.setTag(tag());
    gloo::allreduce(o);
  };
  rt.prepare = [&](bench::op_kind op, const bench::layout& l) { return prepare(ctx, tag, op, l); };

  const bench::run_config c =
      bench::config_of(a, "gloo", a.transport.empty() ? "tcp" : a.transport);
  if (a.rss) {
    bench::report_rss(rt, c, a.csv);
    return 0;
  }
  auto rows = bench::run_rank(rt, c);
  if (rank != 0) return 0;
  if (a.check_only) {
    std::printf("gloo/%s, %d ranks: every collective and size correct\n", c.transport.c_str(),
                a.ranks);
  } else {
    bench::print_records(rows);
    if (!a.csv.empty()) bench::append_csv(a.csv, rows);
  }
  std::fflush(stdout);
  return 0;
}

/// Waits for every child; when one fails, stops the others. Returns the first failure's status.
int wait_all(std::vector<pid_t> pids) {
  int result = 0;
  while (!pids.empty()) {
    int status = 0;
    const pid_t p = ::waitpid(-1, &status, 0);
    if (p < 0) break;
    std::erase(pids, p);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && result == 0) {
      result = code;
      for (pid_t q : pids) ::kill(q, SIGTERM);
    }
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  bench::worker_args a;
  placement where;
  try {
    where = take_placement(argc, argv);
    a = bench::parse_worker_args(argc, argv);
    if (a.ranks < 2) throw std::invalid_argument("give --ranks N with N >= 2");
    if (a.memcpy) throw std::invalid_argument("--memcpy is troupe_bench_worker's");
    if (where.local == 0) where.local = a.ranks;
    if ((where.node_rank + 1) * where.local > a.ranks)
      throw std::invalid_argument("--node-rank " + std::to_string(where.node_rank) + " of " +
                                  std::to_string(where.local) + " ranks is beyond --ranks " +
                                  std::to_string(a.ranks));
    if (where.local < a.ranks && where.store.empty())
      throw std::invalid_argument("--local needs --store DIR, a folder every host shares");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_bench_worker: %s\n", e.what());
    return 2;
  }
  std::string dir = where.store;
  if (dir.empty()) {
    char tmpl[] = "/tmp/gloo-bench-XXXXXX";
    if (!::mkdtemp(tmpl)) {
      std::perror("gloo_bench_worker: mkdtemp");
      return 1;
    }
    dir = tmpl;
  }
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int i = 0; i < where.local; ++i) {
    const int rank = where.node_rank * where.local + i;
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = run_rank_process(rank, dir, where.address, a);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gloo_bench_worker rank %d: %s\n", rank, e.what());
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  const int status = wait_all(pids);
  std::error_code ec;
  if (where.store.empty()) std::filesystem::remove_all(dir, ec);  // the shared one is its maker's
  return status;
}
