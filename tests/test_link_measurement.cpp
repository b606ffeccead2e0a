// The link between hosts measured at start (TROUPE_LINK_COSTS=measure): the
// fit of the cost model's terms to measured times (algorithms/cost_fit.hpp),
// and worlds across emulated hosts (forked processes that name different
// hosts, TCP between them) that measure and then choose by one model.

#include <doctest/doctest.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/cost_fit.hpp"
#include "algorithms/cost_steps.hpp"
#include "approx.hpp"
#include "check_error.hpp"
#include "forked_ranks.hpp"
#include "troupe/troupe.hpp"

using namespace troupe;
using namespace troupe::detail;
using namespace std::chrono_literals;

namespace {

/// What the model's step prices `pairs` of the ranks of two hosts of
/// `per_host` each exchanging `bytes` each way on `m`: the times a world
/// would measure if the model were the truth.
double exchange_time(const cost_model& m, int per_host, int pairs, double bytes) {
  std::vector<std::string> names;
  for (int i = 0; i < 2 * per_host; ++i) names.push_back(i < per_host ? "a" : "b");
  return cost::step_time(
      *group_topology::of_hosts(names), m,
      [&](int r) {
        const int i = r % per_host;
        return i < pairs ? (r < per_host ? r + per_host : r - per_host) : -1;
      },
      [&](int) { return bytes; });
}

link_sample sample_of(const cost_model& truth, int per_host, int pairs) {
  link_sample s;
  s.one_way = truth.host.latency;
  s.bytes = 8 << 20;
  s.pair = exchange_time(truth, per_host, 1, s.bytes);
  s.pairs = pairs;
  s.all = pairs > 1 ? exchange_time(truth, per_host, pairs, s.bytes) : 0;
  s.ranks_per_host = per_host;
  return s;
}

}  // namespace

TEST_CASE("the link's terms come back from the times they give") {
  const cost_model base;
  SUBCASE("a link slower than the CPUs: its bandwidth; the CPU rate as given") {
    cost_model truth;
    truth.host = {40e-6, 125e6, truth.host.overhead};
    truth.cpu_rate = 2.3e9;
    const auto m = fit_link(base, sample_of(truth, 2, 2));
    CHECK(m.host.latency == test::relative(40e-6));
    CHECK(m.host.bandwidth == test::relative(125e6).epsilon(0.01));
    CHECK(m.cpu_rate == test::relative(base.cpu_rate));
  }
  SUBCASE("CPUs slower than the link: their rate; the link at least as given") {
    cost_model truth;
    truth.host = {25e-6, 1e10, truth.host.overhead};
    truth.cpu_rate = 2e9;
    const auto m = fit_link(base, sample_of(truth, 2, 2));
    CHECK(m.cpu_rate == test::relative(2e9).epsilon(0.01));
    CHECK(m.host.bandwidth >= base.host.bandwidth);
    // The model then prices what it was fitted on as measured.
    const auto s = sample_of(truth, 2, 2);
    CHECK(exchange_time(m, 2, 2, s.bytes) == test::relative(s.all).epsilon(0.02));
  }
  SUBCASE("one rank on each host: the time is the CPU's") {
    cost_model truth;
    truth.cpu_rate = 1.5e9;
    const auto m = fit_link(base, sample_of(truth, 1, 1));
    CHECK(m.cpu_rate == test::relative(1.5e9).epsilon(0.01));
    CHECK(m.host.bandwidth == test::relative(base.host.bandwidth));
  }
  SUBCASE("ranks that share CPUs: the barrier gives hop_wait") {
    cost_model m;
    m.ranks_per_cpu = 2;
    m.shared_wait = 0;
    m.hop_wait = 40e-6;
    const auto t = group_topology::of_hosts({"a", "a", "b", "b"});
    const double barrier = predict_fixed(op_code::barrier, 0, *t, m).seconds;
    m.shared_wait = 2.3;
    m.hop_wait = -1;
    const auto fitted = fit_sharing(m, *t, {barrier});
    CHECK(fitted.hop_wait == test::relative(40e-6).epsilon(0.01));
    CHECK(fitted.shared_wait == 0);
    CHECK(fitted.host.overhead == m.host.overhead);  // no alltoall measured
    CHECK(predict_fixed(op_code::barrier, 0, *t, fitted).seconds ==
          test::relative(barrier).epsilon(0.001));
    m.ranks_per_cpu = 1;  // a CPU each: nothing to fit
    CHECK(fit_sharing(m, *t, {barrier}).hop_wait < 0);
    CHECK(fit_sharing(m, *t, {barrier}).shared_wait == test::relative(2.3));
  }
  SUBCASE("the barrier and the alltoall give hop_wait and overhead together") {
    // 4 hosts x 2 ranks sharing a CPU each: the barrier's rounds send
    // further messages and the alltoall waits its hops, so neither term
    // comes back alone.
    cost_model truth;
    truth.ranks_per_cpu = 2;
    truth.shared_wait = 0;
    truth.hop_wait = 300e-6;
    truth.host.overhead = 80e-6;
    const auto t = group_topology::of_hosts({"a", "a", "b", "b", "c", "c", "d", "d"});
    layout_sample s;
    s.barrier = predict_fixed(op_code::barrier, 0, *t, truth).seconds;
    s.alltoall = predict(algorithm_kind::alltoall_pairwise, 4 * 8, *t, truth);
    cost_model start;
    start.ranks_per_cpu = 2;
    const auto fitted = fit_sharing(start, *t, s);
    CHECK(fitted.hop_wait == test::relative(300e-6).epsilon(0.01));
    CHECK(fitted.host.overhead == test::relative(80e-6).epsilon(0.01));
    CHECK(fitted.shared_wait == 0);
    SUBCASE("a CPU each: the overhead alone") {
      truth.ranks_per_cpu = start.ranks_per_cpu = 1;
      s.alltoall = predict(algorithm_kind::alltoall_pairwise, 4 * 8, *t, truth);
      const auto alone = fit_sharing(start, *t, s);
      CHECK(alone.host.overhead == test::relative(80e-6).epsilon(0.01));
      CHECK(alone.hop_wait < 0);
      CHECK(alone.shared_wait == test::relative(2.3));
    }
  }
  SUBCASE("the pair's exchange in the cache gives the cached rate, where the CPUs are the limit") {
    cost_model truth;
    truth.host = {25e-6, 1e10, truth.host.overhead};
    truth.cpu_rate = 2e9;
    auto s = sample_of(truth, 2, 2);
    cost_model cached = truth;
    cached.cpu_rate = 5e9;  // what of_call makes of cpu_cached=5GB/s
    s.cached_bytes = 1 << 20;
    s.pair_cached = exchange_time(cached, 2, 1, s.cached_bytes);
    CHECK(fit_link(base, s).cpu_cached_rate == test::relative(5e9).epsilon(0.01));
    // A link slower than the CPUs takes the cached exchange's time: unset.
    truth.host.bandwidth = 125e6;
    s = sample_of(truth, 2, 2);
    cached.host.bandwidth = 125e6;
    s.cached_bytes = 1 << 20;
    s.pair_cached = exchange_time(cached, 2, 1, s.cached_bytes);
    CHECK(fit_link(base, s).cpu_cached_rate == 0);
  }
  SUBCASE("a time that is not positive is refused, naming it") {
    auto s = sample_of(cost_model{}, 2, 2);
    s.pair = 0;
    test::check_error([&] { fit_link(base, s); }, errc::invalid_argument,
                      {"fit_link", "not positive"});
  }
}

TEST_CASE("TROUPE_LINK_COSTS: `measure`, and a model written back as the setting") {
  CHECK_FALSE(cost_model::parse("host=50us:").measure);
  const auto m = cost_model::parse("measure,host=50us:1Gbit/s,cpu=3GB/s,shared_wait=1.1");
  CHECK(m.measure);
  const auto back = cost_model::parse(m.to_text());
  CHECK(back.host.latency == test::relative(50e-6));
  CHECK(back.host.bandwidth == test::relative(125e6));
  CHECK(back.local.latency == test::relative(m.local.latency));
  CHECK(back.cpu_rate == test::relative(3e9));
  CHECK(back.shared_wait == test::relative(1.1));
  CHECK(back.ranks_per_cpu == test::relative(1));
  test::check_error([] { cost_model::parse("measured"); }, errc::invalid_argument,
                    {"TROUPE_LINK_COSTS", "'measured'", "measure"});
}

namespace {

/// The world's link_costs() on every rank of `w` is rank 0's.
bool same_on_every_rank(world& w, const std::string& text) {
  auto t = tensor::zeros({512}, dtype::uint8);
  if (w.rank() == 0) std::memcpy(t.data(), text.data(), std::min<std::size_t>(text.size(), 511));
  w.default_group().broadcast(t, 0).wait();
  return std::string(static_cast<const char*>(t.data())) == text;
}

/// Ranks on `hosts` (by name), each with TROUPE_LINK_COSTS `setting(r)`;
/// `body` runs on each rank's world and says whether it found it right.
void measured_world(const std::vector<std::string>& hosts,
                    const std::function<std::string(int)>& setting,
                    const std::function<bool(world&, const cost_model&)>& body) {
  const auto codes = test::fork_hosts(
      hosts, [&](int r) { ::setenv("TROUPE_LINK_COSTS", setting(r).c_str(), 1); },
      [&](world& w) {
        const auto text = w.link_costs();
        return test::expect(w.rank(), same_on_every_rank(w, text),
                            "rank 0's link costs: " + text) &&
               body(w, cost_model::parse(text));
      });
  const auto seen = test::codes_text(codes);
  CAPTURE(seen);
  CHECK(codes == std::vector<int>(hosts.size(), 0));
}

/// A measured link's terms are of a link: a latency from 1 us to 50 ms, rates
/// from 1 MB/s.
bool plausible(int r, const cost_model& m) {
  return test::expect(r, m.host.latency >= 1e-6 && m.host.latency <= 0.05, "latency") &&
         test::expect(r, m.host.bandwidth >= 1e6 && m.cpu_rate >= 1e6, "rates");
}

bool allreduce_right(world& w, std::int64_t len) {
  auto t = tensor::empty({len}, dtype::float32);
  for (std::int64_t i = 0; i < len; ++i) t.data_as<float>()[i] = float(w.rank() + 1);
  w.default_group().allreduce(t).wait();
  const float want = float(w.size() * (w.size() + 1) / 2);
  bool ok = true;
  for (std::int64_t i = 0; i < len; i += 101) ok &= t.data_as<float>()[i] == want;
  return test::expect(w.rank(), ok, "allreduce of " + std::to_string(len));
}

}  // namespace

TEST_CASE("a world across hosts measures its link at start; every rank chooses by rank 0's") {
  SUBCASE("2 hosts of 2 ranks; one rank's other items are not its model") {
    // Rank 2 alone says a hop within a host takes 1 ms: told the process's
    // model, it would choose another allreduce of 1,000 floats than the
    // rest (and every rank fail with a mismatch); measured, every rank
    // chooses by rank 0's model.
    const auto t = group_topology::of_hosts({"a", "a", "b", "b"});
    const auto odd = cost_model::parse("local=1ms:");
    measured_world(
        {"a", "a", "b", "b"}, [](int r) { return r == 2 ? "measure,local=1ms:" : "measure"; },
        [&](world& w, const cost_model& m) {
          const int r = w.rank();
          return plausible(r, m) &&
                 test::expect(r,
                              choose(op_code::allreduce, 4000, *t, m).kind !=
                                  choose(op_code::allreduce, 4000, *t, odd).kind,
                              "rank 2's own model would choose another algorithm") &&
                 allreduce_right(w, 1000) && allreduce_right(w, 300000);
        });
  }
  SUBCASE("rank 0's setting decides whether to measure") {
    measured_world(
        {"a", "b", "a", "b"}, [](int r) { return r == 3 ? "host=9ms:" : "measure"; },
        [](world& w, const cost_model& m) {
          return plausible(w.rank(), m) &&
                 test::expect(w.rank(), m.host.latency < 9e-3, "measured, not rank 3's") &&
                 allreduce_right(w, 1000);
        });
  }
  SUBCASE("3 hosts, ranks interleaved, sharing CPUs: the first two hosts, hop_wait fitted") {
    measured_world(
        {"a", "b", "a", "b", "c"}, [](int) { return "measure,ranks_per_cpu=2,local=4us:"; },
        [](world& w, const cost_model& m) {
          const int r = w.rank();
          return plausible(r, m) &&
                 test::expect(r, m.ranks_per_cpu == 2, "ranks_per_cpu as given") &&
                 test::expect(r, m.local.latency == test::relative(4e-6), "local as given") &&
                 test::expect(r, m.hop_wait >= 0 && m.hop_wait <= 0.01, "hop_wait") &&
                 test::expect(r, m.shared_wait == 0, "shared_wait") &&
                 test::expect(r, m.host.overhead >= 0 && m.host.overhead <= 0.01, "overhead") &&
                 allreduce_right(w, 70001);
        });
  }
  SUBCASE("one rank on each of 2 hosts") {
    measured_world(
        {"a", "b"}, [](int) { return "measure"; },
        [](world& w, const cost_model& m) {
          return plausible(w.rank(), m) && allreduce_right(w, 300000);
        });
  }
  SUBCASE("one host: nothing to measure, the setting as given") {
    measured_world(
        {"a", "a"}, [](int) { return "measure,host=7us:"; },
        [](world& w, const cost_model& m) {
          return test::expect(w.rank(), m.host.latency == test::relative(7e-6),
                              "the given latency") &&
                 allreduce_right(w, 1000);
        });
  }
}

TEST_CASE("a world across hosts whose ranks outnumber their CPUs prices the sharing") {
  // The ranks run on one CPU (the launcher's, this process's, as
  // host_cpus() reads it): 2 ranks per host share it.
  cpu_set_t all, one;
  REQUIRE(::sched_getaffinity(0, sizeof(all), &all) == 0);
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &all)) {
      CPU_SET(c, &one);
      break;
    }
  REQUIRE(::sched_setaffinity(0, sizeof(one), &one) == 0);
  const auto sharing = [](double k) {
    return [k](world& w, const cost_model& m) {
      return test::expect(w.rank(), m.ranks_per_cpu == test::relative(k),
                          "ranks_per_cpu " + std::to_string(m.ranks_per_cpu)) &&
             allreduce_right(w, 1000);
    };
  };
  SUBCASE("found: 2 ranks per CPU, the other items as set") {
    measured_world(
        {"a", "a", "b", "b"}, [](int) { return "host=7us:"; },
        [&](world& w, const cost_model& m) {
          return sharing(2)(w, m) && test::expect(w.rank(), m.host.latency == test::relative(7e-6),
                                                  "the given latency");
        });
  }
  SUBCASE("measured: the sharing found beside it") {
    measured_world(
        {"a", "b", "a", "b"}, [](int) { return "measure"; }, sharing(2));
  }
  SUBCASE("the setting names it: as set") {
    measured_world(
        {"a", "a", "b", "b"}, [](int) { return "ranks_per_cpu=1.5"; }, sharing(1.5));
  }
  SUBCASE("one host: nothing crosses a link, nothing added") {
    measured_world(
        {"a", "a"}, [](int) { return ""; },
        [](world& w, const cost_model& m) {
          return test::expect(w.rank(), w.link_costs() == cost_model::of_process().to_text(),
                              "the process's model") &&
                 test::expect(w.rank(), m.ranks_per_cpu == 1, "one rank per CPU") &&
                 allreduce_right(w, 1000);
        });
  }
  ::sched_setaffinity(0, sizeof(all), &all);
}

TEST_CASE("a rank killed while its world measures the link: every survivor fails, naming it") {
  // Rank 3 ends its process 30-150 ms after it starts: in the measurement
  // or in the calls after it. Wherever it lands, no survivor hangs and each
  // names rank 3: at once where it is gone (at the start "world: rank R:
  // measuring the link between hosts at start ..."), after the world's
  // timeout where it never joined (a machine too loaded to start it).
  const std::vector<std::string> hosts{"a", "a", "b", "b"};
  for (int after_ms : {30, 90, 150}) {
    CAPTURE(after_ms);
    const auto path = test::temp_store_path();
    const auto codes = test::fork_ranks(4, [&](int r) {
      ::setenv("TROUPE_HOSTNAME", hosts[static_cast<std::size_t>(r)].c_str(), 1);
      ::setenv("TROUPE_LINK_COSTS", "measure", 1);
      if (r == 3)
        std::thread([after_ms] {
          std::this_thread::sleep_for(std::chrono::milliseconds(after_ms));
          ::_exit(0);
        }).detach();
      auto s = std::make_shared<file_store>(path, 10s);
      try {
        world w{test::child_world(s, r, 4, 10s)};
        const auto until = std::chrono::steady_clock::now() + 5s;  // rank 3 is gone by then
        while (std::chrono::steady_clock::now() < until) allreduce_right(w, 1000);
        return test::expect(r, false, "every call succeeded with rank 3 gone");
      } catch (const error& e) {
        const std::string what = e.what();
        return test::expect(r, what.find("rank 3") != std::string::npos, "not named: " + what);
      }
    });
    ::unlink(path.c_str());
    const auto seen = test::codes_text(codes);
    CAPTURE(seen);
    CHECK(std::vector<int>(codes.begin(), codes.begin() + 3) == std::vector<int>{0, 0, 0});
  }
}
