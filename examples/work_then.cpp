// work_then — chaining work::then continuations in an asynchronous
// application: each rank issues several collectives without waiting, chains
// continuations on their works (allreduce -> average -> norm -> a clipping
// factor that rank 0 derives and broadcasts), and waits only at the end.
//
// Ranks must issue their collectives in the same order. Here every rank issues
// three from its own thread, then nothing more; the fourth (the broadcast) is
// issued by a continuation, so it comes fourth on every rank.

#include <troupe/testing.hpp>
#include <troupe/troupe.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <vector>

namespace {

using troupe::tensor;
using troupe::tensor_list;
using troupe::work;

/// Runs `next` once `w` completed and returns a work that completes when the
/// work `next` returns does: a continuation that starts another collective
/// without blocking any thread.
work and_then(const work& w, std::function<work(const work&)> next) {
  auto result = work::make(w.op_name() + ".and_then", w.group_name());
  w.on_complete([result, next](const work& done) {
    try {
      next(done).on_complete([result](const work& inner) {
        if (inner.is_success())
          result.complete(inner.result());
        else
          result.fail(inner.exception());
      });
    } catch (...) {
      result.fail(std::current_exception());
    }
  });
  return result;
}

std::vector<float> local_gradient(int r) {
  return {1.0f + r, 2.0f * r, -1.0f, 0.5f * r};
}
float local_loss(int r) {
  return 0.25f * static_cast<float>(r + 1);
}
float clip_factor(float norm, float worst_loss) {
  return std::min(1.0f, 1.0f / (norm * worst_loss));
}

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(what);
}

}  // namespace

int main() {
  constexpr int n = 4;
  try {
    troupe::testing::run_ranks(n, [](troupe::world& w) {
      auto& pg = w.default_group();
      const int r = w.rank();
      auto grad = tensor::from_vector(local_gradient(r));
      auto loss = tensor::from_vector<float>({local_loss(r)});
      auto squares = tensor::zeros({n}, troupe::dtype::int32);

      // 1. Three collectives in flight at once; nothing waits.
      auto summed = pg.allreduce(grad);
      auto worst = pg.allreduce(loss, troupe::reduce_op::MAX);
      auto gathered = pg.allgather_into_tensor(squares, tensor::from_vector<std::int32_t>({r * r}));

      // 2. Continuations run when the allreduce completes: average, then the norm.
      auto mean = summed.then([grad](const work& done) {
        done.result();  // rethrows if the allreduce failed
        for (auto* p = grad.data_as<float>(); p != grad.data_as<float>() + grad.numel(); ++p)
          *p /= n;
        return tensor_list{grad};
      });
      auto norm = mean.then([](const work& done) {
        auto g = done.result()[0].to_vector<float>();
        float s = 0;
        for (float x : g) s += x * x;
        return tensor_list{tensor::from_vector<float>({std::sqrt(s)})};
      });

      // 3. Once the norm and the worst loss are known, rank 0 derives a clipping
      //    factor and broadcasts it; the broadcast is issued by the continuation.
      auto clip = tensor::zeros({1}, troupe::dtype::float32);
      auto ready = work::when_all("norm+loss", pg.name(), {norm, worst});
      auto shared = and_then(ready, [&pg, clip, r](const work& done) {
        auto out = done.result();  // [norm, worst loss]
        if (r == 0)
          clip.data_as<float>()[0] =
              clip_factor(out[0].to_vector<float>()[0], out[1].to_vector<float>()[0]);
        return pg.broadcast(clip, 0);
      });

      // 4. The rank is free to do other work here. Wait only at the end.
      shared.wait();
      gathered.wait();

      // Check against values computed locally.
      std::vector<float> want_mean(4, 0.0f);
      float want_worst = 0;
      for (int q = 0; q < n; ++q) {
        auto g = local_gradient(q);
        for (std::size_t i = 0; i < g.size(); ++i) want_mean[i] += g[i];
        want_worst = std::max(want_worst, local_loss(q));
      }
      float s = 0;
      for (auto& x : want_mean) {
        x /= n;
        s += x * x;
      }
      const float want_clip = clip_factor(std::sqrt(s), want_worst);
      const float got_clip = clip.to_vector<float>()[0];
      check(grad.to_vector<float>() == want_mean, "the averaged gradient is wrong");
      check(loss.to_vector<float>()[0] == want_worst, "the worst loss is wrong");
      check(std::fabs(got_clip - want_clip) <= 1e-6f * want_clip, "the clipping factor is wrong");
      auto sq = squares.to_vector<std::int32_t>();
      for (int q = 0; q < n; ++q)
        check(sq[static_cast<std::size_t>(q)] == q * q, "allgather is wrong");

      if (r == 0) {
        auto m = grad.to_vector<float>();
        std::printf("mean gradient: %g %g %g %g\n", m[0], m[1], m[2], m[3]);
        std::printf("worst loss: %g, clipping factor from rank 0: %g\n", want_worst, got_clip);
        std::printf("gathered r*r: %d %d %d %d\n", sq[0], sq[1], sq[2], sq[3]);
        std::printf("collectives issued on group '%s': %llu\n", pg.name().c_str(),
                    static_cast<unsigned long long>(pg.sequence_number()));
      }
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "work_then FAILED: %s\n", e.what());
    return 1;
  }
  std::printf("work_then: all ranks agree\n");
  return 0;
}
