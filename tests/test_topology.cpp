// Collectives that know where the ranks live: the cost model's choices
// (algorithms/cost_model.hpp, select.cpp) and the algorithms across hosts —
// hierarchical allreduce (striped and leaders), hierarchical broadcast,
// recursive doubling, Rabenseifner's allreduce, the scatter-allgather
// broadcast, Bruck's allgather and the rings ordered by host — run in forked
// processes that name different hosts (TROUPE_HOSTNAME), over TCP between
// them and shared memory within each, checked against values computed here.

#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/cost_steps.hpp"
#include "approx.hpp"
#include "base/engine_setting.hpp"
#include "base/wait_policy.hpp"
#include "check_error.hpp"
#include "collective_test.hpp"
#include "forked_ranks.hpp"
#include "inline/engine.hpp"
#include "scoped_env.hpp"
#include "troupe/troupe.hpp"

using namespace troupe;
using namespace troupe::detail;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<const group_topology> layout(int hosts, int per_host) {
  std::vector<std::string> names;
  for (int h = 0; h < hosts; ++h)
    for (int i = 0; i < per_host; ++i) names.push_back("host" + std::to_string(h));
  return group_topology::of_hosts(names);
}

algorithm_kind chosen(op_code code, std::uint64_t bytes, int hosts, int per_host) {
  return choose(code, bytes, *layout(hosts, per_host), cost_model{}).kind;
}

}  // namespace

TEST_CASE("the cost model chooses by size, rank count and hosts") {
  // One host: one step while latency decides, the ring for large buffers.
  CHECK(chosen(op_code::allreduce, 4, 1, 4) == algorithm_kind::allreduce_direct);
  CHECK(chosen(op_code::allreduce, 64 << 20, 1, 4) == algorithm_kind::allreduce_ring);
  // Two ranks: the pair, then halves.
  CHECK(chosen(op_code::allreduce, 4, 2, 1) == algorithm_kind::allreduce_pair);
  CHECK(chosen(op_code::allreduce, 64 << 20, 2, 1) == algorithm_kind::allreduce_halves);
  // Across hosts with several ranks each: the hierarchical algorithms.
  CHECK(chosen(op_code::allreduce, 64 << 20, 2, 2) == algorithm_kind::allreduce_hier_striped);
  // Small buffers at 4 x 8: log n rounds, each rank's message its own
  // work side by side with its host's others' (recursive doubling's two
  // rounds across hosts, where the leaders add two stages within them).
  CHECK(chosen(op_code::allreduce, 4, 4, 8) == algorithm_kind::allreduce_recursive_doubling);
  CHECK(chosen(op_code::allreduce, 4, 4, 8) != algorithm_kind::allreduce_direct);
  // A broadcast's tree across the hosts, then within each (one latency
  // between hosts per level of hosts, not per level of ranks) ...
  CHECK(chosen(op_code::broadcast, 64 << 10, 4, 4) == algorithm_kind::broadcast_hier);
  // ... where its buffer is large, the pipelined chain through the hosts:
  // each host's link carries the buffer once each way, not log2(hosts)
  // times out of the root's (the tree) or 1.6 times (scatter and allgather;
  // measured on 4 emulated hosts x 2 ranks at 1 Gbit/s, 1 MiB: the chain
  // 9.9 ms, scatter-allgather 17.1).
  CHECK(chosen(op_code::broadcast, 1 << 20, 4, 4) == algorithm_kind::broadcast_chain);
  CHECK(chosen(op_code::broadcast, 64 << 20, 4, 4) == algorithm_kind::broadcast_chain);
  // (Through every rank or through the hosts' leaders: at 4 x 2 the two
  // measured alike, 64 MiB 620 and 590 ms, 16 MiB 159 and 173.)
  const auto slow_chain =
      choose(op_code::broadcast, 64 << 20, *layout(4, 2), cost_model::parse("host=12us:1Gbit/s"), 3)
          .kind;
  CHECK((slow_chain == algorithm_kind::broadcast_chain ||
         slow_chain == algorithm_kind::broadcast_chain_leaders));
  // At thousands of ranks, through the leaders: a hop per host and per rank
  // of one host, not one per rank.
  CHECK(chosen(op_code::broadcast, 64 << 20, 512, 8) == algorithm_kind::broadcast_chain_leaders);
  CHECK(chosen(op_code::broadcast, 64 << 20, 2048, 8) == algorithm_kind::broadcast_chain_leaders);
  // reduce: the binomial tree for small buffers; to rank 0 it crosses a link
  // once per host where each host's ranks are in a row; where they
  // alternate over a slow link, the hierarchy costs less (the tree's first
  // level sends half the ranks' buffers across at once).
  CHECK(chosen(op_code::reduce, 64 << 10, 4, 4) == algorithm_kind::reduce_binomial);
  std::vector<std::string> alternating;
  for (int r = 0; r < 16; ++r) alternating.push_back(r % 2 ? "b" : "a");
  const auto slow = cost_model::parse("host=60us:1Gbit/s");
  const auto two_hosts = group_topology::of_hosts(alternating);
  CHECK(predict(algorithm_kind::reduce_hier, 1 << 20, *two_hosts, slow) <
        predict(algorithm_kind::reduce_binomial, 1 << 20, *two_hosts, slow));
  // ... and, over a slow link, where the root's position makes the tree
  // cross three times (root 5 of 2 x 8: at masks 1, 4 and 8).
  CHECK(predict(algorithm_kind::reduce_binomial, 1 << 20, *layout(2, 8), slow, 0) <
        predict(algorithm_kind::reduce_hier, 1 << 20, *layout(2, 8), slow, 0));
  CHECK(predict(algorithm_kind::reduce_hier, 1 << 20, *layout(2, 8), slow, 5) <
        predict(algorithm_kind::reduce_binomial, 1 << 20, *layout(2, 8), slow, 5));
  // ... and a large buffer, the pipelined chain toward the root: each
  // host's link carries it once each way, where the tree's root host
  // receives it once per level of hosts. (Measured on 4 emulated hosts x 2
  // ranks at 1 Gbit/s: 1 MiB 9.5 ms, the tree 18.8; 64 MiB 590 ms, the tree
  // 1244, the hierarchy 1332; on 2 x 2, 1 MiB 8.7 ms, the tree 8.6; 64 MiB
  // 563, the tree 610.)
  CHECK(chosen(op_code::reduce, 1 << 20, 4, 4) == algorithm_kind::reduce_chain);
  CHECK(chosen(op_code::reduce, 1 << 20, 4, 1) == algorithm_kind::reduce_chain);
  CHECK(chosen(op_code::reduce, 64 << 20, 4, 4) == algorithm_kind::reduce_chain);
  // Within one host, never a chain: its hops through the rings copy each
  // byte twice on shared CPUs (4 ranks on 2 CPUs: a 1 MiB broadcast 585 us,
  // the tree 343; a 64 MiB reduce 78 ms, the tree 67).
  for (std::uint64_t bytes : {std::uint64_t{1} << 20, std::uint64_t{64} << 20}) {
    CHECK(chosen(op_code::broadcast, bytes, 1, 4) != algorithm_kind::broadcast_chain);
    CHECK(chosen(op_code::reduce, bytes, 1, 4) != algorithm_kind::reduce_chain);
    CHECK(choose(op_code::reduce, bytes, *group_topology::flat(4), cost_model{}).kind !=
          algorithm_kind::reduce_chain);
    CHECK(chosen(op_code::reduce, bytes, 1, 4) != algorithm_kind::reduce_chain_leaders);
  }
  // (Through every rank or through the hosts' leaders, as the broadcast's.)
  auto a_chain = [](algorithm_kind k) {
    return k == algorithm_kind::reduce_chain || k == algorithm_kind::reduce_chain_leaders;
  };
  CHECK(a_chain(choose(op_code::reduce, 1 << 20, *two_hosts, slow).kind));
  CHECK(a_chain(choose(op_code::reduce, 64 << 20, *layout(4, 2), slow, 3).kind));
  // At thousands of ranks, through the leaders.
  CHECK(chosen(op_code::reduce, 64 << 20, 512, 8) == algorithm_kind::reduce_chain_leaders);
  CHECK(choose(op_code::reduce, 4, *layout(4, 2), slow, 3).kind != algorithm_kind::reduce_chain);
  // Broadcast at many ranks: the tree for small buffers, scatter and
  // allgather (2N bytes per rank, not log n times N at the root) for large.
  CHECK(chosen(op_code::broadcast, 4, 1, 4096) == algorithm_kind::broadcast_binomial);
  CHECK(chosen(op_code::broadcast, 64 << 20, 1, 4096) ==
        algorithm_kind::broadcast_scatter_allgather);
  // Many ranks: nothing of n² messages; log n steps for small buffers.
  CHECK(chosen(op_code::allreduce, 4, 1, 4096) == algorithm_kind::allreduce_recursive_doubling);
  // ... and for middle sizes log n steps that each move less (Rabenseifner).
  CHECK(chosen(op_code::allreduce, 1 << 20, 1, 4096) == algorithm_kind::allreduce_rabenseifner);
  CHECK(chosen(op_code::allreduce, 1 << 20, 64, 1) == algorithm_kind::allreduce_rabenseifner);
  CHECK(chosen(op_code::allgatherv, 4096 * 4, 1, 4096) == algorithm_kind::allgather_bruck);
  CHECK(chosen(op_code::allgatherv, std::uint64_t{64} << 20, 1, 16) ==
        algorithm_kind::allgather_ring);
  // Small blocks on 2 hosts of 4 ranks: the striped columns' exchanges
  // side by side, then one step within each host (Bruck's steps and the
  // ring cross at every step; the leaders add a step within each host).
  CHECK(chosen(op_code::allgatherv, 8 * 16, 2, 4) == algorithm_kind::allgather_hier_striped);
  // alltoall (even splits): Bruck's log n steps for small blocks at many
  // ranks, the pairwise exchange (each byte sent once) for large blocks or few ranks.
  CHECK(chosen(op_code::alltoallv, 4096 * 4, 1, 4096) == algorithm_kind::alltoall_bruck);
  CHECK(chosen(op_code::alltoallv, 64 * 4, 8, 8) == algorithm_kind::alltoall_bruck);
  CHECK(chosen(op_code::alltoallv, std::uint64_t{64} << 20, 1, 4096) ==
        algorithm_kind::alltoall_pairwise);
  CHECK(chosen(op_code::alltoallv, 4 * 4, 1, 4) == algorithm_kind::alltoall_pairwise);
  // reduce_scatter: recursive halving's log n steps at many ranks; across
  // hosts of as many ranks each, each host's ranks reduce their columns'
  // blocks, then each column reduce-scatters across the hosts (each host's
  // link carries (H-1)/H of the input; the ring, host by host, (n-1)/n).
  CHECK(chosen(op_code::reduce_scatterv, 4096 * 4, 1, 4096) ==
        algorithm_kind::reduce_scatter_halving);
  CHECK(choose(op_code::reduce_scatterv, std::uint64_t{64} << 20, *layout(2, 2),
               cost_model::parse("host=:1Gbit/s"))
            .kind == algorithm_kind::reduce_scatter_hier_striped);
  // A large allgather across hosts: each column of ranks gathers across
  // the hosts, then shares within each (the ring crosses each host's link
  // with (n-1)/n of the output, the hierarchy with (H-1)/H).
  CHECK(chosen(op_code::allgatherv, std::uint64_t{64} << 20, 2, 2) ==
        algorithm_kind::allgather_hier_striped);
  CHECK(chosen(op_code::allgatherv, std::uint64_t{64} << 20, 4, 8) ==
        algorithm_kind::allgather_hier_striped);
  // Hosts of different sizes cannot stripe.
  const auto uneven = group_topology::of_hosts({"a", "a", "a", "b", "b"});
  CHECK(choose(op_code::allreduce, 64 << 20, *uneven, cost_model{}).kind !=
        algorithm_kind::allreduce_hier_striped);
}

TEST_CASE("Bruck's count of the slots that move at step k is the count by slots") {
  for (int n = 1; n <= 300; ++n)
    for (int k = 1; k < n; k <<= 1) {
      int by_slots = 0;
      for (int i = 0; i < n; ++i) by_slots += (i & k) != 0;
      CHECK(slots_with_bit(n, k) == by_slots);
    }
}

TEST_CASE("a choice is remembered for the same call on the same group, and follows the setting") {
  const auto t = group_topology::of_hosts({"a", "b", "c", "d", "e"});
  const auto& m = cost_model::of_process();
  const auto first = chosen_algorithm(op_code::allreduce, 4, *t, m);
  CHECK(first != algorithm_kind::allreduce_ring);
  CHECK(chosen_algorithm(op_code::allreduce, 4, *t, m) == first);
  {
    troupe::test::scoped_env forced{"TROUPE_ALGORITHMS", "allreduce=ring"};
    CHECK(chosen_algorithm(op_code::allreduce, 4, *t, m) == algorithm_kind::allreduce_ring);
  }
  CHECK(chosen_algorithm(op_code::allreduce, 4, *t, m) == first);
  // Other bytes, another group of the same size (3 + 2): their own choices.
  CHECK(chosen_algorithm(op_code::allreduce, 64 << 20, *t, m) ==
        choose(op_code::allreduce, 64 << 20, *t, m).kind);
  const auto other = group_topology::of_hosts({"a", "a", "a", "b", "b"});
  CHECK(chosen_algorithm(op_code::allreduce, 4, *other, m) ==
        algorithm_kind::allreduce_hier_leaders);
  CHECK(chosen_algorithm(op_code::allreduce, 4, *t, m) == first);
}

TEST_CASE("the hierarchical allreduce crosses a host's link once: its prediction is the bound") {
  // 2 hosts x 2 ranks, 64 MiB, 1 Gbit/s between the hosts: each host must
  // send 64 MiB (2·(H-1)/H·N) across its link.
  cost_model m;
  m.host = {50e-6, 125e6};
  const double bound = 64.0 * (1 << 20) / 125e6;
  const auto t = layout(2, 2);
  const double striped = predict(algorithm_kind::allreduce_hier_striped, 64 << 20, *t, m);
  const double ring = predict(algorithm_kind::allreduce_ring, 64 << 20, *t, m);
  CHECK(striped >= bound);
  CHECK(striped < 1.1 * bound);
  CHECK(ring > 1.4 * bound);  // a flat ring sends 1.5 times the bytes over the link
}

TEST_CASE("the hierarchical allgather crosses a host's link once: its prediction is the bound") {
  // 2 hosts x 2 ranks, 64 MiB of output, 1 Gbit/s between the hosts: each
  // host must send its half, (H-1)/H·N, across its link.
  cost_model m;
  m.host = {50e-6, 125e6};
  const double bound = 32.0 * (1 << 20) / 125e6;
  for (int hosts : {2, 4}) {
    CAPTURE(hosts);
    const auto t = layout(hosts, 2);
    const double b = bound * 2 * (hosts - 1) / hosts;
    const double hier = predict(algorithm_kind::allgather_hier_striped, 64 << 20, *t, m);
    const double ring = predict(algorithm_kind::allgather_ring, 64 << 20, *t, m);
    CHECK(hier >= b);
    CHECK(hier < 1.1 * b);
    // The ring sends (n-1)/n of the output over each host's link.
    CHECK(ring > 0.97 * b * (2 * hosts - 1) / (2 * hosts) * hosts / (hosts - 1));
  }
}

TEST_CASE("a link shaped by a token bucket: bursts pass, the rate still bounds the call") {
  // 2 hosts x 2 ranks at 1 Gbit/s with tbf's 1 ms bucket: a 64 KiB
  // allgather's bytes fit the bucket, refilled while the call waits for
  // latencies and copies; its time is the longer of the link's bytes at the
  // rate and the rest, no longer their sum.
  const auto serial = cost_model::parse("host=20us:125MB/s,hop_wait=30us,shared_wait=0");
  const auto bucket =
      cost_model::parse("host=20us:125MB/s,hop_wait=30us,shared_wait=0,burst=125KB");
  CHECK(serial.burst == 0);
  CHECK(bucket.burst == 125e3);
  CHECK(cost_model::parse(bucket.to_text()).burst == 125e3);
  CHECK(serial.to_text().find("burst") == std::string::npos);
  for (const char* bad : {"burst=", "burst=-1KB", "burst=64", "burst=1us"})
    test::check_error([&] { cost_model::parse(bad); }, errc::invalid_argument,
                      {"TROUPE_LINK_COSTS", std::string(bad).substr(6)});
  const auto t = layout(2, 2);
  for (auto kind : {algorithm_kind::allgather_hier_striped, algorithm_kind::allreduce_hier_striped,
                    algorithm_kind::allreduce_hier_leaders, algorithm_kind::broadcast_hier}) {
    CAPTURE(to_string(kind));
    const double whole = predict(kind, 64 << 10, *t, serial);
    const double burst = predict(kind, 64 << 10, *t, bucket);
    const double wire = predict(kind, 64 << 10, *t, serial.link_alone());
    const double rest = predict(kind, 64 << 10, *t, serial.link_unbounded());
    CHECK(wire > 0);
    CHECK(rest < whole);
    CHECK(burst == test::relative(std::max(wire, rest)));
    CHECK(burst < whole);
    // 64 MiB: the bucket is a small part of the call; the rate bounds it.
    const double big = predict(kind, 64 << 20, *t, bucket);
    CHECK(big == test::relative(predict(kind, 64 << 20, *t, serial) - 1e-3));
    CHECK(big >= predict(kind, 64 << 20, *t, serial.link_alone()));
  }
  // Within one host the bucket changes nothing.
  const auto one = layout(1, 4);
  CHECK(predict(algorithm_kind::allreduce_ring, 64 << 10, *one, bucket) ==
        test::relative(predict(algorithm_kind::allreduce_ring, 64 << 10, *one, serial)));
}

TEST_CASE("TROUPE_LINK_COSTS parses units and refuses what it cannot read") {
  const auto m = cost_model::parse("host=50us:10Gbit/s,local=2us:8GB/s");
  CHECK(m.host.latency == test::relative(50e-6));
  CHECK(m.host.bandwidth == test::relative(1.25e9));
  CHECK(m.local.bandwidth == test::relative(8e9));
  test::check_error([] { cost_model::parse("wan=1ms:1GB/s"); }, errc::invalid_argument,
                    {"TROUPE_LINK_COSTS", "'wan' is not a link class"});
  test::check_error([] { cost_model::parse("host=fast:1GB/s"); }, errc::invalid_argument,
                    {"'fast'"});
  // An empty latency or rate keeps the default's; ranks_per_cpu is a number.
  const auto k = cost_model::parse("host=:1Gbit/s,local=2us:,ranks_per_cpu=2.5");
  CHECK(k.host.latency == test::relative(cost_model{}.host.latency));
  CHECK(k.host.bandwidth == test::relative(125e6));
  CHECK(k.local.latency == test::relative(2e-6));
  CHECK(k.local.bandwidth == test::relative(cost_model{}.local.bandwidth));
  CHECK(k.ranks_per_cpu == test::relative(2.5));
  for (const char* bad :
       {"ranks_per_cpu=0.5", "ranks_per_cpu=many", "ranks_per_cpu=", "ranks_per_cpu=2x"})
    test::check_error([&] { cost_model::parse(bad); }, errc::invalid_argument,
                      {"TROUPE_LINK_COSTS", "ranks_per_cpu"});
  // cpu: the TCP bytes a rank's CPU moves per second.
  CHECK(cost_model::parse("cpu=2.5GB/s").cpu_rate == test::relative(2.5e9));
  CHECK(cost_model::parse("host=:1Gbit/s").cpu_rate == test::relative(cost_model{}.cpu_rate));
  for (const char* bad : {"cpu=", "cpu=fast", "cpu=2us", "cpu=-1GB/s"})
    test::check_error([&] { cost_model::parse(bad); }, errc::invalid_argument,
                      {"TROUPE_LINK_COSTS", "'"});
  // shared_wait: the exponent of the wait of ranks sharing CPUs.
  CHECK(cost_model{}.shared_wait == test::relative(2.3));
  CHECK(cost_model::parse("shared_wait=1.2").shared_wait == test::relative(1.2));
  CHECK(cost_model::parse("shared_wait=0").shared_wait == 0);
  for (const char* bad : {"shared_wait=", "shared_wait=-1", "shared_wait=11", "shared_wait=1us"})
    test::check_error([&] { cost_model::parse(bad); }, errc::invalid_argument,
                      {"TROUPE_LINK_COSTS", "shared_wait", std::string(bad).substr(12)});
  // hop_wait: a time, 0 or more; unset (negative) by default.
  CHECK(cost_model{}.hop_wait < 0);
  CHECK(cost_model::parse("hop_wait=40us").hop_wait == test::relative(40e-6));
  CHECK(cost_model::parse("hop_wait=0us").hop_wait == 0);
  for (const char* bad : {"hop_wait=", "hop_wait=-1us", "hop_wait=40", "hop_wait=fast"})
    test::check_error([&] { cost_model::parse(bad); }, errc::invalid_argument,
                      {"TROUPE_LINK_COSTS", std::string(bad).substr(9)});
  // cpu_cached and cache: what a rank's CPU moves per second for a call
  // its cache holds (unset: cpu_rate for every call).
  CHECK(cost_model{}.cpu_cached_rate == 0);
  CHECK(cost_model{}.cache == 4 << 20);
  const auto cached = cost_model::parse("cpu=2GB/s,cpu_cached=6GB/s,cache=1MiB");
  CHECK(cached.cpu_cached_rate == test::relative(6e9));
  CHECK(cached.cache == 1 << 20);
  CHECK(cached.of_call(1 << 20).cpu_rate == test::relative(6e9));
  CHECK(cached.of_call((1 << 20) + 1).cpu_rate == test::relative(2e9));
  CHECK(cost_model::parse("cpu=2GB/s").of_call(4).cpu_rate == test::relative(2e9));
  CHECK(cost_model::parse("cache=64KiB").cache == 65536);
  CHECK(cost_model::parse("cache=2MB").cache == 2e6);
  for (const char* bad :
       {"cache=", "cache=4", "cache=-1MiB", "cache=4Mb", "cpu_cached=fast", "cpu_cached=1us"})
    test::check_error([&] { cost_model::parse(bad); }, errc::invalid_argument,
                      {"TROUPE_LINK_COSTS", "'"});
  const auto back = cost_model::parse(cached.to_text());
  CHECK(back.cpu_cached_rate == test::relative(6e9));
  CHECK(back.cache == 1 << 20);
  // The model prices a call the cache holds at that rate: an unshaped
  // exchange between two hosts of 1 MiB each way sooner, one of 16 MiB as
  // before.
  const auto uncached = cost_model::parse("cpu=2GB/s,cache=1MiB");
  const auto pair = layout(2, 1);
  CHECK(predict(algorithm_kind::allreduce_pair, 1 << 20, *pair, cached) <
        0.5 * predict(algorithm_kind::allreduce_pair, 1 << 20, *pair, uncached));
  CHECK(predict(algorithm_kind::allreduce_pair, 16 << 20, *pair, cached) ==
        test::relative(predict(algorithm_kind::allreduce_pair, 16 << 20, *pair, uncached)));
  // local_cached: the local link's bandwidth for a call the cache holds.
  CHECK(cost_model{}.local_cached_rate == 0);
  const auto local = cost_model::parse("local=5us:8GB/s,local_cached=16GB/s,cache=1MiB");
  CHECK(local.of_call(1 << 20).local.bandwidth == test::relative(16e9));
  CHECK(local.of_call((1 << 20) + 1).local.bandwidth == test::relative(8e9));
  CHECK(local.of_call(1 << 20).cpu_rate == test::relative(cost_model{}.cpu_rate));
  CHECK(cost_model::parse("local=5us:8GB/s").of_call(4).local.bandwidth == test::relative(8e9));
  for (const char* bad : {"local_cached=", "local_cached=fast", "local_cached=1us"})
    test::check_error([&] { cost_model::parse(bad); }, errc::invalid_argument,
                      {"TROUPE_LINK_COSTS", "'"});
  const auto local_back = cost_model::parse(local.to_text());
  CHECK(local_back.local_cached_rate == test::relative(16e9));
  CHECK(local_back.cache == 1 << 20);
  CHECK(local_back.cpu_cached_rate == 0);
  // Two ranks of one host: a call the cache holds costs less.
  const auto one_host = layout(1, 2);
  CHECK(predict(algorithm_kind::allreduce_pair, 1 << 20, *one_host, local) <
        0.75 * predict(algorithm_kind::allreduce_pair, 1 << 20, *one_host,
                       cost_model::parse("local=5us:8GB/s,cache=1MiB")));
  // cpu_send (cpu_send_cached for a call the cache holds): the sender's
  // share of a transfer's CPU work between hosts, 0.5 by default.
  CHECK(cost_model{}.send_share == 0.5);
  CHECK(cost_model{}.send_share_cached < 0);
  const auto sends = cost_model::parse("cpu=2GB/s,cpu_send=0.75,cpu_send_cached=0.9,cache=1MiB");
  CHECK(sends.send_share == test::relative(0.75));
  CHECK(sends.of_call(1 << 20).send_share == test::relative(0.9));
  CHECK(sends.of_call((1 << 20) + 1).send_share == test::relative(0.75));
  CHECK(cost_model::parse("cpu_send=0.75").of_call(4).send_share == test::relative(0.75));
  for (const char* bad : {"cpu_send=", "cpu_send=1.5", "cpu_send=-0.1", "cpu_send=half",
                          "cpu_send_cached=2", "cpu_send=0.5us"})
    test::check_error(
        [&] { cost_model::parse(bad); }, errc::invalid_argument,
        {"TROUPE_LINK_COSTS", "cpu_send", std::string(bad).substr(std::string(bad).find('=') + 1)});
  const auto sends_back = cost_model::parse(sends.to_text());
  CHECK(sends_back.send_share == test::relative(0.75));
  CHECK(sends_back.send_share_cached == test::relative(0.9));
  CHECK(cost_model{}.to_text().find("cpu_send") == std::string::npos);
  // A one-way transfer between hosts takes the busier side's share of the
  // work, an exchange the whole of it on either side, whatever the share.
  const auto even = cost_model::parse("host=10us:100GB/s,cpu=2GB/s");
  const auto sender = cost_model::parse("host=10us:100GB/s,cpu=2GB/s,cpu_send=0.75");
  CHECK(predict(algorithm_kind::broadcast_binomial, 16 << 20, *pair, sender) - 10e-6 ==
        test::relative(
            1.5 * (predict(algorithm_kind::broadcast_binomial, 16 << 20, *pair, even) - 10e-6)));
  CHECK(predict(algorithm_kind::allreduce_pair, 16 << 20, *pair, sender) ==
        test::relative(predict(algorithm_kind::allreduce_pair, 16 << 20, *pair, even)));
  // to_text() writes it where it is set, and parse() reads it back.
  CHECK(cost_model{}.to_text().find("hop_wait") == std::string::npos);
  CHECK(cost_model{}.to_text().find("cache") == std::string::npos);
  CHECK(cost_model::parse(cost_model::parse("hop_wait=40us").to_text()).hop_wait ==
        test::relative(40e-6));
}

TEST_CASE("a call's time includes its agreement where the result does not wait for every rank") {
  // Broadcast, reduce, gather and scatter: the ranks that receive nothing
  // from some rank still hear its call, through rounds of dissemination
  // beside the algorithm (base/agreement.hpp); the call ends when both did.
  const cost_model m = cost_model::parse("host=100us:10GB/s,cpu=10GB/s");
  const auto t = layout(4, 1);
  const double rounds = predict_fixed(op_code::barrier, 0, *t, m).seconds;
  CHECK(rounds == test::relative(2 * 100e-6));
  for (auto code : {op_code::broadcast, op_code::reduce, op_code::gatherv, op_code::scatterv}) {
    CAPTURE(static_cast<int>(code));
    CHECK(agreement_time(code, *t, m) == test::relative(rounds));
    CHECK(predict_call(code, 4, *t, m).seconds >= rounds);
  }
  // A binomial broadcast of 4 B on 4 hosts is 2 rounds as well: the call is
  // the longer of the two, not their sum.
  CHECK(predict_call(op_code::broadcast, 4, *t, m).seconds ==
        test::relative(
            std::max(rounds, predict(chosen_algorithm(op_code::broadcast, 4, *t, m), 4, *t, m))));
  // Where ranks share CPUs the two contend for them: the shorter adds half
  // its time to the longer.
  const auto shared =
      cost_model::parse("host=100us:10GB/s,cpu=10GB/s,ranks_per_cpu=2,hop_wait=0us");
  const double data = predict(chosen_algorithm(op_code::broadcast, 4, *t, shared), 4, *t, shared);
  const double beside = agreement_time(op_code::broadcast, *t, shared);
  CHECK(predict_call(op_code::broadcast, 4, *t, shared).seconds ==
        test::relative(std::max(data, beside) + 0.5 * std::min(data, beside)));
  // Every rank's result waits for every rank's data: nothing beside it.
  for (auto code : {op_code::allreduce, op_code::allgatherv, op_code::reduce_scatterv}) {
    CHECK(agreement_time(code, *t, m) == 0);
    CHECK(predict_call(code, 1 << 20, *t, m).seconds ==
          test::relative(predict(chosen_algorithm(code, 1 << 20, *t, m), 1 << 20, *t, m)));
  }
  // Two ranks on one host tell each other at once, one message each.
  const auto pair = layout(1, 2);
  CHECK(agreement_time(op_code::broadcast, *pair, m) == test::relative(m.local.latency));
  // testing::predict prices the barrier too.
  CHECK(testing::predict("barrier", 0, {4, 1}, "host=100us:10GB/s,cpu=10GB/s").seconds ==
        test::relative(rounds));
}

TEST_CASE("a waiting rank's take of a shared CPU (wait_share) and a send's price") {
  // wait_share: what a rank that waits takes of its CPU, as a share of a
  // working rank's; 0.5 by default, 0 to 1.
  CHECK(cost_model{}.wait_share == 0.5);
  CHECK(cost_model::parse("wait_share=0.2").wait_share == test::relative(0.2));
  CHECK(cost_model::parse("wait_share=0").wait_share == 0);
  for (const char* bad :
       {"wait_share=", "wait_share=1.5", "wait_share=-0.1", "wait_share=some", "wait_share=1us"})
    test::check_error([&] { cost_model::parse(bad); }, errc::invalid_argument,
                      {"TROUPE_LINK_COSTS", "wait_share",
                       std::string(bad).substr(std::string(bad).find('=') + 1)});
  CHECK(cost_model{}.to_text().find("wait_share") == std::string::npos);
  CHECK(cost_model::parse(cost_model::parse("wait_share=0.25").to_text()).wait_share ==
        test::relative(0.25));
  // A send between two hosts of 2 ranks sharing a CPU each, the others
  // waiting: at wait_share 0 the sender and receiver have their CPUs as a
  // rank of its own would; at 1 they share them evenly with the waiters.
  const std::string base = "host=10us:100GB/s,cpu=2GB/s,hop_wait=0us,shared_wait=0";
  const auto alone = cost_model::parse(base);
  const auto idle = cost_model::parse(base + ",ranks_per_cpu=2,wait_share=0");
  const auto busy = cost_model::parse(base + ",ranks_per_cpu=2,wait_share=1");
  const auto four = layout(2, 2), two = layout(2, 1);
  const std::uint64_t bytes = 16 << 20;
  const double own = send_time(bytes, *two, alone, 0, 1);
  CHECK(own == test::relative(10e-6 + 2 * 0.5 * double(bytes) / 2e9));
  CHECK(send_time(bytes, *four, idle, 0, 2) == test::relative(own));
  CHECK(send_time(bytes, *four, busy, 0, 2) - 10e-6 == test::relative(2 * (own - 10e-6)));
  // Within a host: the local link's price.
  CHECK(send_time(bytes, *four, alone, 0, 1) ==
        test::relative(alone.local.latency + double(bytes) / alone.local.bandwidth));
  // testing::predict's "send": from rank 0 to rank n / 2.
  CHECK(testing::predict("send", bytes, {2, 2, 1}, base + ",wait_share=1").seconds ==
        test::relative(send_time(bytes, *four, busy, 0, 2)));
  CHECK(testing::predict("send", bytes, {2, 1}, base).seconds == test::relative(own));
  CHECK(testing::predict("send", bytes, {1, 1}, base).seconds == 0);
  test::check_error(
      [] {
        testing::predict("sends", 4, {2, 1});
      },
      errc::invalid_argument, {"predict", "'sends'", "send"});
}

TEST_CASE("predict_chosen_with: the algorithm ranks told one model choose, priced with another") {
  // A calibration's costs and those of a later launch, whose hops waited
  // longer (unshaped 2 x 2 on 2 CPUs): told the first, the ranks run the
  // hierarchy for a 64 KiB allreduce; the second alone would choose
  // recursive doubling.
  const std::string told =
      "host=9.91us:,cpu=2829968197B/s,cpu_cached=4157130935B/s,cpu_send=0.698,cpu_send_cached="
      "0.797,local=:4356117427B/s,local_cached=10342312131B/s,hop_wait=26.44us,shared_wait=0,"
      "wait_share=0,overhead=22.97us";
  const std::string later =
      "host=9.91us:,cpu=2829968197B/s,cpu_cached=4157130935B/s,cpu_send=0.698,cpu_send_cached="
      "0.797,local=:4356117427B/s,local_cached=10342312131B/s,hop_wait=37.35us,shared_wait=0,"
      "wait_share=0,overhead=17.51us";
  const testing::host_layout two{2, 2, 1};
  const auto ran = testing::predict("allreduce", 64 << 10, two, told);
  const auto alone = testing::predict("allreduce", 64 << 10, two, later);
  REQUIRE(ran.algorithm != alone.algorithm);
  const auto priced = testing::predict_chosen_with("allreduce", 64 << 10, two, later, told);
  CHECK(priced.algorithm == ran.algorithm);
  {
    // The same as forcing what ran and pricing it with the later costs.
    test::scoped_env forced{"TROUPE_ALGORITHMS", "allreduce=hier_leaders"};
    REQUIRE(ran.algorithm == "allreduce_hier (leaders)");
    CHECK(priced.seconds ==
          test::relative(testing::predict("allreduce", 64 << 10, two, later).seconds));
  }
  // Told the same costs, the same as predict().
  const auto same = testing::predict_chosen_with("broadcast", 1 << 20, {4, 2, 1}, later, later);
  CHECK(same.algorithm == testing::predict("broadcast", 1 << 20, {4, 2, 1}, later).algorithm);
  CHECK(same.seconds == testing::predict("broadcast", 1 << 20, {4, 2, 1}, later).seconds);
  test::check_error(
      [&] { testing::predict_chosen_with("allreduce", 4, two, later, "hop_wait=fast"); },
      errc::invalid_argument, {"hop_wait"});
}

TEST_CASE("ranks that share CPUs: waits grow, CPU-bound transfers share the CPU") {
  cost_model m;
  const auto t = layout(2, 2);
  // One rank per CPU: unchanged, and so is a model already shared.
  CHECK(m.on_shared_cpus().host.latency == m.host.latency);
  m.ranks_per_cpu = 2;
  const auto s = m.on_shared_cpus();
  // Between hosts w = 2^2.3 times as long; within a host the same wait
  // for the CPU, (w - 1) host latencies.
  CHECK(s.host.latency == test::relative(m.host.latency * std::pow(2.0, 2.3)));
  CHECK(s.local.latency ==
        test::relative(m.local.latency + (std::pow(2.0, 2.3) - 1) * m.host.latency));
  CHECK(s.on_shared_cpus().host.latency == test::relative(s.host.latency));
  m.shared_wait = 1.2;  // a machine whose scheduler hands the CPU over sooner
  CHECK(m.on_shared_cpus().host.latency == test::relative(m.host.latency * std::pow(2.0, 1.2)));
  // A message's work runs on a CPU the k ranks share: k times as long.
  CHECK(m.on_shared_cpus().host.overhead == test::relative(m.host.overhead * 2));
  CHECK(m.on_shared_cpus().local.overhead == test::relative(m.local.overhead * 2));
  m.shared_wait = 2.3;
  // hop_wait, where measured, is each hop's wait for its receiver's CPU,
  // between hosts and within one; a further receiver's turn stays (w - 1)
  // host latencies.
  cost_model hop = m;
  hop.hop_wait = 30e-6;
  const auto h = hop.on_shared_cpus();
  CHECK(h.host.latency == test::relative(m.host.latency + 30e-6));
  CHECK(h.local.latency == test::relative(m.local.latency + 30e-6));
  CHECK(h.cpu_turn == test::relative(s.cpu_turn));
  hop.hop_wait = 0;
  CHECK(hop.on_shared_cpus().host.latency == test::relative(m.host.latency));
  hop.ranks_per_cpu = 1;  // a CPU for each rank: no wait
  hop.hop_wait = 30e-6;
  CHECK(hop.on_shared_cpus().host.latency == test::relative(m.host.latency));
  cost_model own;
  for (auto kind : {algorithm_kind::allreduce_hier_leaders, algorithm_kind::allreduce_hier_striped,
                    algorithm_kind::allreduce_ring, algorithm_kind::broadcast_binomial})
    for (std::uint64_t bytes : {std::uint64_t{4}, std::uint64_t{16} << 20}) {
      CAPTURE(to_string(kind));
      CAPTURE(bytes);
      CHECK(predict(kind, bytes, *t, m) > predict(kind, bytes, *t, own));
    }
  // Both ranks of a host receiving in one step take turns on its CPU: a
  // ring's step takes a turn more than one in which only a rank of each
  // host receives (at one rank per CPU, the same).
  auto ring = [&](const cost_model& x) {
    return cost::step_time(
        *t, x, [](int r) { return (r + 1) % 4; }, [](int) { return 4.0; });
  };
  auto across = [&](const cost_model& x) {
    return cost::step_time(
        *t, x, [](int r) { return r == 1   ? 2
                                  : r == 3 ? 0
                                           : -1; }, [](int) { return 4.0; });
  };
  CHECK(s.cpu_turn == test::relative((std::pow(2.0, 2.3) - 1) * m.host.latency));
  CHECK(ring(s) == test::relative(across(s) + s.cpu_turn).epsilon(1e-3));
  CHECK(own.on_shared_cpus().cpu_turn == 0);
  CHECK(ring(own.on_shared_cpus()) == test::relative(across(own.on_shared_cpus())).epsilon(1e-3));
  // Unshaped links are CPU-bound: an exchange moves each rank's bytes both
  // ways on its CPU, a broadcast's step one way.
  const auto two = layout(2, 1);
  const double big = 64.0 * (1 << 20);
  CHECK(predict(algorithm_kind::allreduce_pair, 64 << 20, *two, own) ==
        test::relative(own.host.latency + 2 * big / own.cpu_rate));
  CHECK(predict(algorithm_kind::broadcast_binomial, 64 << 20, *two, own) ==
        test::relative(own.host.latency + big / own.cpu_rate));
  // A slow link (1 Gbit/s) is the bound, whatever the CPUs.
  const auto gbit = cost_model::parse("host=:1Gbit/s");
  CHECK(gbit.host.latency == own.host.latency);
  CHECK(predict(algorithm_kind::broadcast_binomial, 64 << 20, *two, gbit) ==
        test::relative(own.host.latency + big / 125e6));
}

TEST_CASE("testing::predict: the choice and time of a layout of hosts, at any scale") {
  using testing::predict;
  const std::string gbit = "host=60us:125MB/s";
  // 2 hosts x 2 ranks over 1 Gbit/s: the striped hierarchy, at the link's bound.
  const auto big = predict("allreduce", 64 << 20, {2, 2}, gbit);
  CHECK(big.algorithm == "allreduce_hier (striped)");
  CHECK(big.seconds > 64.0 * (1 << 20) / 125e6);
  CHECK(big.seconds < 1.1 * 64.0 * (1 << 20) / 125e6);
  // The same as the model the ranks consult.
  CHECK(big.seconds == test::relative(predict(algorithm_kind::allreduce_hier_striped, 64 << 20,
                                              *layout(2, 2), cost_model::parse(gbit))));
  // 4096 and 16384 ranks: no n² algorithm; more bytes never take less time.
  for (int hosts : {512, 2048}) {
    double before = 0;
    for (std::uint64_t bytes :
         {std::uint64_t{4}, std::uint64_t{1} << 20, std::uint64_t{64} << 20}) {
      for (const char* op : {"allreduce", "broadcast", "reduce_scatter", "alltoall"}) {
        const auto p = predict(op, bytes, {hosts, 8});
        CHECK_MESSAGE(p.algorithm.find("direct") == std::string::npos, p.algorithm);
        CHECK(p.seconds > 0);
        CHECK(std::isfinite(p.seconds));
      }
      const auto a = predict("allreduce", bytes, {hosts, 8});
      CHECK(a.seconds >= before);
      before = a.seconds;
    }
  }
  CHECK(predict("allreduce", 4, {1, 1}).seconds == 0);
  // Bad arguments name the call and the value.
  test::check_error(
      [] {
        predict("scan", 4, {2, 2});
      },
      errc::invalid_argument, {"predict", "'scan'"});
  test::check_error(
      [] {
        predict("allreduce", 4, {0, 2});
      },
      errc::invalid_argument, {"predict", "hosts 0"});
  test::check_error(
      [] {
        predict("allreduce", 4, {2, -1});
      },
      errc::invalid_argument, {"predict", "ranks_per_host -1"});
  test::check_error(
      [] {
        predict("allreduce", 4, {1 << 20, 2});
      },
      errc::invalid_argument, {"predict", "2097152 ranks"});
  test::check_error(
      [] {
        predict("allreduce", 4, {2, 2}, "wan=1ms:1GB/s");
      },
      errc::invalid_argument, {"TROUPE_LINK_COSTS", "'wan'"});
}

namespace {

/// Forks one process per entry of `hosts` (its host's name), each rank
/// running `body`; every process is told `algorithms` (TROUPE_ALGORITHMS)
/// first where given.
void across_hosts(const std::vector<std::string>& hosts, const char* algorithms,
                  const std::function<bool(world&)>& body) {
  const auto codes = test::fork_hosts(
      hosts,
      [&](int) {
        if (algorithms) ::setenv("TROUPE_ALGORITHMS", algorithms, 1);
      },
      body);
  const auto seen = test::codes_text(codes);
  CAPTURE(seen);
  CHECK(codes == std::vector<int>(hosts.size(), 0));
}

bool allreduces_right(world& w) {
  auto& pg = w.default_group();
  const int n = w.size(), r = w.rank();
  bool ok = true;
  for (std::int64_t len : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{300001}}) {
    auto t = tensor::empty({len}, dtype::float32);
    for (std::int64_t i = 0; i < len; ++i) t.data_as<float>()[i] = float((r + 1) * (i % 13));
    pg.allreduce(t).wait();
    const float ranks = float(n * (n + 1) / 2);
    for (std::int64_t i = 0; i < len; i += 997)
      ok &= test::expect(r, t.data_as<float>()[i] == ranks * float(i % 13),
                         "allreduce SUM of " + std::to_string(len) + " at " + std::to_string(i));
    auto m = tensor::from_vector<std::int64_t>({r, -r});
    pg.allreduce(m, reduce_op::MAX).wait();
    ok &= test::expect(r, m.to_vector<std::int64_t>() == std::vector<std::int64_t>{n - 1, 0},
                       "allreduce MAX");
    auto a = tensor::from_vector<double>({double(r), 1.0});
    pg.allreduce(a, reduce_op::AVG).wait();
    ok &= test::expect(r, std::abs(a.to_vector<double>()[0] - (n - 1) / 2.0) < 1e-12, "AVG");
  }
  return ok;
}

/// Every op of representative dtypes, on lengths with fewer elements than
/// ranks, around the block sizes and large, against the serial reference.
bool allreduces_every_op_right(world& w) {
  auto& pg = w.default_group();
  const int n = w.size(), r = w.rank();
  bool ok = true;
  for (auto t : {dtype::float32, dtype::int64, dtype::bfloat16, dtype::uint8})
    for (const auto& op : ct::ops_for(t))
      for (std::int64_t len : {std::int64_t{1}, std::int64_t{n + 1}, std::int64_t{4099}}) {
        const auto e = ct::expected_for(t, op, n, len, 29);
        auto x = ref::make(t, e->input(r));
        pg.allreduce(x, op).wait();
        ok &= test::expect(r, ref::close(x, e->result),
                           ct::name("allreduce", t, len) + " " + op.to_string());
      }
  // Large: blocks of many segments' worth.
  const auto e = ct::expected_for(dtype::float32, reduce_op::SUM, n, 300001, 31);
  auto x = ref::make(dtype::float32, e->input(r));
  pg.allreduce(x).wait();
  ok &= test::expect(r, ref::close(x, e->result), "allreduce SUM of 300001");
  return ok;
}

/// reduce to every root: every op of two dtypes, small and large, against
/// the serial reference (the root's output; the others' input untouched).
bool reduces_right(world& w) {
  auto& pg = w.default_group();
  const int n = w.size(), r = w.rank();
  bool ok = true;
  for (int root = 0; root < n; ++root)
    for (auto t : {dtype::float32, dtype::int64})
      for (const auto& op : ct::ops_for(t))
        for (std::int64_t len : {std::int64_t{1}, std::int64_t{1000}}) {
          const auto e = ct::expected_for(t, op, n, len, 37);
          auto x = ref::make(t, e->input(r));
          pg.reduce(x, {.op = op, .root_rank = root}).wait();
          ok &= test::expect(
              r, ref::close(x, r == root ? e->result : e->input(r)),
              ct::name("reduce", t, len) + " " + op.to_string() + " to " + std::to_string(root));
        }
  const auto e = ct::expected_for(dtype::float32, reduce_op::AVG, n, 300001, 41);
  auto x = ref::make(dtype::float32, e->input(r));
  pg.reduce(x, {.op = reduce_op::AVG, .root_rank = n - 1}).wait();
  ok &= test::expect(r, ref::close(x, r == n - 1 ? e->result : e->input(r)), "reduce AVG 300001");
  return ok;
}

bool broadcasts_and_gathers_right(world& w) {
  auto& pg = w.default_group();
  const int n = w.size(), r = w.rank();
  bool ok = true;
  for (int root = 0; root < n; ++root) {
    auto t = tensor::from_vector<int>({r == root ? 7 * root + 1 : -1, r == root ? 3 : -1});
    pg.broadcast(t, root).wait();
    ok &= test::expect(r, t.to_vector<int>() == std::vector<int>{7 * root + 1, 3},
                       "broadcast from " + std::to_string(root));
  }
  // Large, from the last rank: every block of a split buffer arrives.
  const std::int64_t len = 100003;
  auto big = tensor::empty({len}, dtype::float32);
  for (std::int64_t i = 0; i < len; ++i)
    big.data_as<float>()[i] = r == n - 1 ? float(i % 1009) : -1.f;
  pg.broadcast(big, n - 1).wait();
  bool same = true;
  for (std::int64_t i = 0; i < len; ++i) same &= big.data_as<float>()[i] == float(i % 1009);
  ok &= test::expect(r, same, "broadcast of " + std::to_string(len) + " from the last rank");
  auto out = tensor::empty({2 * n}, dtype::int32);
  pg.allgather_into_tensor(out, tensor::from_vector<int>({r, 10 * r})).wait();
  for (int q = 0; q < n; ++q)
    ok &= test::expect(r,
                       out.to_vector<int>()[static_cast<std::size_t>(2 * q)] == q &&
                           out.to_vector<int>()[static_cast<std::size_t>(2 * q + 1)] == 10 * q,
                       "allgather block " + std::to_string(q));
  // Blocks of 300,007 bytes (several segments of the ring), then the same
  // output again: a rank whose call returned may reuse its buffers at once.
  const std::int64_t per = 300007;
  auto mine = tensor::empty({per}, dtype::uint8);
  auto all = tensor::empty({per * n}, dtype::uint8);
  for (int round = 0; round < 2; ++round) {
    for (std::int64_t i = 0; i < per; ++i)
      mine.data_as<std::uint8_t>()[i] = static_cast<std::uint8_t>((i + 31 * r + round) % 251);
    pg.allgather_into_tensor(all, mine).wait();
    bool whole = true;
    for (int q = 0; q < n; ++q)
      for (std::int64_t i = 0; i < per; ++i)
        whole &= all.data_as<std::uint8_t>()[q * per + i] ==
                 static_cast<std::uint8_t>((i + 31 * q + round) % 251);
    ok &= test::expect(
        r, whole,
        "allgather of " + std::to_string(per) + " bytes a rank, round " + std::to_string(round));
  }
  auto rs_in = tensor::empty({n}, dtype::int64);
  for (int q = 0; q < n; ++q) rs_in.data_as<std::int64_t>()[q] = r + 100 * q;
  auto rs_out = tensor::empty({1}, dtype::int64);
  pg.reduce_scatter_tensor(rs_out, rs_in).wait();
  ok &= test::expect(r, rs_out.to_vector<std::int64_t>()[0] == n * (n - 1) / 2 + 100 * r * n,
                     "reduce_scatter block");
  return ok;
}

}  // namespace

namespace {

/// alltoall_single without split sizes (Bruck's steps where chosen or
/// forced) of several dtypes and block sizes, in place too, and one with
/// split sizes (always pairwise): rank r's block for rank q holds r·1000+q.
bool alltoalls_right(world& w) {
  auto& pg = w.default_group();
  const int n = w.size(), r = w.rank();
  bool ok = true;
  for (std::int64_t each : {std::int64_t{1}, std::int64_t{7}, std::int64_t{3001}}) {
    for (auto t : {dtype::float32, dtype::int64}) {
      auto in = tensor::empty({each * n}, t), out = tensor::empty({each * n}, t);
      for (std::int64_t i = 0; i < each * n; ++i) {
        const double v = r * 1000 + i / each + (i % each) * 1e-3 * (t == dtype::float32);
        if (t == dtype::float32)
          in.data_as<float>()[i] = float(v);
        else
          in.data_as<std::int64_t>()[i] = static_cast<std::int64_t>(v) + (i % each) * 100000;
      }
      pg.alltoall_single(out, in).wait();
      bool right = true;
      for (std::int64_t i = 0; i < each * n; ++i) {
        const auto q = i / each, j = i % each;  // from rank q, its j-th element
        if (t == dtype::float32)
          right &= out.data_as<float>()[i] == float(q * 1000 + r + j * 1e-3);
        else
          right &= out.data_as<std::int64_t>()[i] == q * 1000 + r + j * 100000;
      }
      ok &= test::expect(r, right,
                         "alltoall_single of " + std::to_string(each) + " " +
                             std::string(to_string(t)) + " elements to each rank");
    }
    // In place: the output is the input.
    auto io = tensor::empty({each * n}, dtype::int32);
    for (std::int64_t i = 0; i < each * n; ++i)
      io.data_as<int>()[i] = static_cast<int>(r * 1000 + i / each);
    pg.alltoall_single(io, io).wait();
    bool right = true;
    for (std::int64_t i = 0; i < each * n; ++i)
      right &= io.data_as<int>()[i] == static_cast<int>((i / each) * 1000 + r);
    ok &= test::expect(r, right, "alltoall_single in place of " + std::to_string(each));
  }
  // Split sizes (uneven: rank r sends q+1 elements to rank q).
  std::vector<std::int64_t> sends(static_cast<std::size_t>(n)), receives(sends.size(), r + 1);
  std::int64_t total = 0;
  for (int q = 0; q < n; ++q) total += sends[static_cast<std::size_t>(q)] = q + 1;
  auto in = tensor::empty({total}, dtype::int32), out = tensor::empty({n * (r + 1)}, dtype::int32);
  for (std::int64_t i = 0, q = 0; q < n; ++q)
    for (std::int64_t j = 0; j <= q; ++j) in.data_as<int>()[i++] = static_cast<int>(r * 1000 + q);
  pg.alltoall_single(out, in, receives, sends).wait();
  bool right = true;
  for (std::int64_t i = 0; i < n * (r + 1); ++i)
    right &= out.data_as<int>()[i] == static_cast<int>((i / (r + 1)) * 1000 + r);
  ok &= test::expect(r, right, "alltoall_single with split sizes");
  return ok;
}

}  // namespace

namespace {

/// reduce_scatter of every op of two dtypes, blocks of one size (1 and 1000
/// elements) and uneven ones with empty blocks, against the serial reference.
bool reduce_scatters_right(world& w) {
  auto& pg = w.default_group();
  const int n = w.size(), r = w.rank();
  bool ok = true;
  for (auto t : {dtype::float32, dtype::int64})
    for (const auto& op : ct::ops_for(t))
      for (std::int64_t each : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{-1}}) {
        const auto counts = each < 0 ? ct::uneven_counts(n)
                                     : std::vector<std::int64_t>(static_cast<std::size_t>(n), each);
        std::int64_t total = 0, offset = 0;
        for (int q = 0; q < n; ++q) {
          if (q == r) offset = total;
          total += counts[static_cast<std::size_t>(q)];
        }
        const auto e = ct::expected_for(t, op, n, total, 43);
        auto in = ref::make(t, e->input(r));
        auto out = tensor::empty({counts[static_cast<std::size_t>(r)]}, t);
        pg.reduce_scatterv(out, in, counts, {.op = op}).wait();
        ok &= test::expect(
            r, ref::close(out, ref::slice(e->result, offset, counts[static_cast<std::size_t>(r)])),
            ct::name("reduce_scatter", t, each) + " " + op.to_string());
      }
  return ok;
}

}  // namespace

namespace {

/// Hosts of as many ranks each (the striped hierarchies' layouts), in a
/// row, interleaved and in threes; and hosts of different sizes, where they
/// cannot stripe.
std::vector<std::vector<std::string>> striped_layouts() {
  return {{"a", "a", "b", "b"},
          {"b", "a", "a", "b"},
          {"a", "b", "c", "a", "b", "c"},
          {"a", "a", "a", "b", "b", "b"},
          {"a", "a", "a", "b", "b"}};
}

/// `check` across 4 ranks on 2 hosts, 5 on 5 and 7 on 3, with each of `algorithms` forced and
/// with the cost model's choice.
void on_three_layouts(std::initializer_list<const char*> algorithms,
                      const std::function<bool(world&)>& check) {
  for (const char* algorithm : algorithms)
    for (const auto& hosts :
         std::vector<std::vector<std::string>>{{"a", "a", "b", "b"},
                                               {"a", "b", "c", "d", "e"},
                                               {"a", "a", "a", "b", "b", "c", "c"}}) {
      CAPTURE(std::string(algorithm ? algorithm : "chosen"));
      CAPTURE(hosts.size());
      across_hosts(hosts, algorithm, check);
    }
}

}  // namespace

TEST_CASE("reduce_scatter across emulated hosts: recursive halving and the ring") {
  on_three_layouts({"reduce_scatter=halving", "reduce_scatter=ring", nullptr},
                   reduce_scatters_right);
}

TEST_CASE("reduce_scatter across emulated hosts: the hierarchy, every op, large blocks") {
  // Hosts of as many ranks each, in a row, interleaved and in threes; on
  // hosts of different sizes the hierarchy cannot stripe (the model's
  // choice runs).
  for (const char* algorithm : std::initializer_list<const char*>{
           "reduce_scatter=hier_striped", "reduce_scatter=hier_leaders", nullptr})
    for (const auto& hosts : striped_layouts()) {
      CAPTURE(std::string(algorithm ? algorithm : "chosen"));
      CAPTURE(hosts.size());
      across_hosts(hosts, algorithm, [](world& w) {
        bool ok = reduce_scatters_right(w);
        // Blocks of several segments, summed and averaged.
        auto& pg = w.default_group();
        const int n = w.size(), r = w.rank();
        const std::int64_t each = 100003;
        for (const auto& op : {reduce_op{reduce_op::SUM}, reduce_op{reduce_op::AVG}}) {
          const auto e = ct::expected_for(dtype::float32, op, n, each * n, 47);
          auto in = ref::make(dtype::float32, e->input(r));
          auto out = tensor::empty({each}, dtype::float32);
          pg.reduce_scatter_tensor(out, in, {.op = op}).wait();
          ok &= test::expect(r, ref::close(out, ref::slice(e->result, r * each, each)),
                             "reduce_scatter of " + std::to_string(each) + " " + op.to_string());
        }
        return ok;
      });
    }
}

TEST_CASE("alltoall across emulated hosts: Bruck's steps and the pairwise exchange") {
  on_three_layouts({"alltoall=bruck", "alltoall=pairwise", nullptr}, alltoalls_right);
}

TEST_CASE("ranks that choose different algorithms fail on every rank, naming it") {
  // One rank told other link costs or another TROUPE_ALGORITHMS than the
  // rest would run other steps: their messages would meet the wrong step.
  // The choice rides the call's fingerprint: every rank fails with a
  // mismatch that names both algorithms, before any data is combined.
  for (const char* odd : {"allreduce=ring", "allreduce=recursive_doubling"}) {
    CAPTURE(std::string(odd));
    const std::vector<std::string> hosts{"a", "a", "b", "b"};
    const int n = 4;
    const auto path = test::temp_store_path();
    auto codes = test::fork_ranks(n, [&](int r) {
      ::setenv("TROUPE_HOSTNAME", hosts[static_cast<std::size_t>(r)].c_str(), 1);
      ::setenv("TROUPE_ALGORITHMS", r == 2 ? odd : "allreduce=hier_leaders", 1);
      auto s = std::make_shared<file_store>(path, 30s);
      world w{test::child_world(s, r, n, 30s)};
      auto t = tensor::from_vector<float>(std::vector<float>(1000, 1.0f));
      bool ok = false;
      try {
        w.default_group().allreduce(t).wait();
        std::fprintf(stderr, "rank %d: the allreduce did not fail\n", r);
      } catch (const error& e) {
        const std::string what = e.what();
        ok = e.code() == errc::mismatch &&
             what.find("the algorithm each chose") != std::string::npos;
        if (!ok) std::fprintf(stderr, "rank %d: %s\n", r, what.c_str());
      }
      // The group still works once every rank is told the same.
      ::setenv("TROUPE_ALGORITHMS", "allreduce=ring", 1);
      auto u = tensor::from_vector<float>(std::vector<float>(10, 1.0f));
      w.default_group().allreduce(u).wait();
      ok = ok && u.data_as<float>()[0] == 4.0f;
      return ok;
    });
    ::unlink(path.c_str());
    const auto seen = test::codes_text(codes);
    CAPTURE(seen);
    CHECK(codes == std::vector<int>(static_cast<std::size_t>(n), 0));
  }
}

TEST_CASE("allreduce across emulated hosts, every algorithm") {
  const std::vector<std::vector<std::string>> layouts = {
      {"a", "a", "b", "b"}, {"a", "a", "a", "b", "b"}, {"a", "b", "c"}, {"a", "b", "a", "b"}};
  for (const char* algorithm : std::initializer_list<const char*>{
           "allreduce=hier_striped", "allreduce=hier_leaders", "allreduce=recursive_doubling",
           "allreduce=rabenseifner", "allreduce=ring", nullptr}) {
    for (const auto& hosts : layouts) {
      CAPTURE(std::string(algorithm ? algorithm : "chosen"));
      CAPTURE(hosts.size());
      across_hosts(hosts, algorithm, allreduces_right);
    }
  }
}

TEST_CASE("two ranks on two hosts pace their allreduce: small segments, every op, right") {
  // One rank per host, each with a CPU: allreduce_pair cuts up to 1 MiB
  // into 128 KiB segments, 2 ahead of what came back (op_context::paced).
  const bool counts = detail::read_engine_setting() != detail::engine_setting::actors;
  across_hosts({"a", "b"}, nullptr, [&](world& w) {
    auto& pg = w.default_group();
    const int r = w.rank();
    const auto before = detail::inline_stats().paced.load();
    bool ok = true;
    for (auto t : {dtype::float32, dtype::int64, dtype::bfloat16})
      for (const auto& op : ct::ops_for(t))
        // 1, 2 and 8 segments (the last one short), and one under a segment.
        for (std::int64_t len : {std::int64_t{4099}, std::int64_t{40000}, std::int64_t{262143}}) {
          const auto bytes = len * static_cast<std::int64_t>(element_size(t));
          if (bytes > (std::int64_t{1} << 20)) continue;  // allreduce_halves' sizes
          const auto e = ct::expected_for(t, op, 2, len, 29);
          auto x = ref::make(t, e->input(r));
          pg.allreduce(x, op).wait();
          ok &= test::expect(r, ref::close(x, e->result),
                             ct::name("allreduce", t, len) + " " + op.to_string());
        }
    // Off the inline engines (TROUPE_ENGINE=actors) the group actors run
    // the pair unpaced: only the results count.
    if (counts)
      ok &= test::expect(r, detail::inline_stats().paced.load() > before,
                         "allreduce_pair was told to pace its peer on another host");
    return ok;
  });
}

TEST_CASE("large calls: the waiting thread reads its host peers' rings, reader threads sockets") {
  // On the message engine, a call over 1 MiB leaves sockets to the data
  // plane's reader threads (they consume segments as they arrive while the
  // waiting thread sends), but reads a host peer's shared-memory ring
  // itself: that ring's reader thread runs at the lowest priority.
  if (detail::read_engine_setting() == detail::engine_setting::actors) return;
  const auto run = [](const std::vector<std::string>& hosts) {
    across_hosts(hosts, "allgather=ring", [&](world& w) {
      auto& pg = w.default_group();
      const int n = w.size(), r = w.rank();
      const std::int64_t len = std::int64_t{3} << 18;  // 3 MiB of float32 a rank
      auto in = tensor::empty({len}, dtype::float32);
      auto out = tensor::empty({len * n}, dtype::float32);
      const auto before = detail::inline_stats().consumed.load();
      bool ok = true;
      for (int i = 0; i < 4; ++i) {
        for (std::int64_t k = 0; k < len; ++k) in.data_as<float>()[k] = float(r * 7 + i + k % 5);
        pg.allgather_into_tensor(out, in).wait();
        for (int q = 0; q < n; ++q)
          for (std::int64_t k = 0; k < len; k += 4099)
            ok &= test::expect(r, out.data_as<float>()[q * len + k] == float(q * 7 + i + k % 5),
                               "allgather of 3 MiB, from rank " + std::to_string(q));
      }
      // Whether any rank's reader threads consumed one (a segment that
      // arrived before its call asked is taken from the inbox instead).
      auto consumed = tensor::from_vector<std::int64_t>(
          {std::int64_t(detail::inline_stats().consumed.load() - before)});
      pg.allreduce(consumed, reduce_op::MAX).wait();
      const bool any = consumed.to_vector<std::int64_t>()[0] > 0;
      // Reader threads receive from sockets (other hosts, or TROUPE_TRANSPORT
      // tcp), and from rings too where the host's ranks outnumber its CPUs
      // (a waiting thread reading them would hold the CPU their writer needs).
      const char* transport = std::getenv("TROUPE_TRANSPORT");
      const bool readers = hosts.front() != hosts.back() ||
                           (transport && std::string(transport) == "tcp") ||
                           static_cast<long>(hosts.size()) > detail::host_cpus();
      return test::expect(r, any == readers,
                          readers ? "a reader thread consumed a segment"
                                  : "no reader thread consumed a segment") &&
             ok;
    });
  };
  test::scoped_env engine{"TROUPE_ENGINE", "messages"};
  SUBCASE("two ranks of one host: the waiting threads read the rings") {
    run({"a", "a"});
  }
  SUBCASE("two hosts: reader threads consume what the sockets bring") {
    run({"a", "b"});
  }
  SUBCASE("more ranks than CPUs on one host: reader threads read the rings") {
    run(std::vector<std::string>(static_cast<std::size_t>(detail::host_cpus()) + 1, "a"));
  }
}

TEST_CASE("Rabenseifner's allreduce: every op, 3 to 8 ranks, folds and empty blocks") {
  const std::vector<std::vector<std::string>> layouts = {{"a", "b", "c"},
                                                         {"a", "a", "b", "b"},
                                                         {"a", "b", "c", "d", "e"},
                                                         {"a", "a", "b", "b", "c", "c", "c"},
                                                         {"a", "a", "b", "b", "c", "c", "d", "d"}};
  for (const auto& hosts : layouts) {
    CAPTURE(hosts.size());
    across_hosts(hosts, "allreduce=rabenseifner", allreduces_every_op_right);
  }
}

TEST_CASE("the striped hierarchy in slices: every op, folds and empty slices") {
  // 4 KiB slices: 4099 elements run in 4 to 8 slices, the large buffer in 16.
  ::setenv("TROUPE_HIER_SEGMENT", "4096", 1);
  for (const auto& hosts : std::vector<std::vector<std::string>>{
           {"a", "a", "b", "b"}, {"a", "a", "a", "b", "b", "b"}, {"a", "a", "b", "b", "c", "c"}}) {
    CAPTURE(hosts.size());
    across_hosts(hosts, "allreduce=hier_striped", allreduces_every_op_right);
  }
  ::unsetenv("TROUPE_HIER_SEGMENT");
}

TEST_CASE("reduce across emulated hosts, each algorithm, to every root") {
  for (const char* algorithm : std::initializer_list<const char*>{
           "reduce=hier", "reduce=binomial", "reduce=chain", "reduce=chain_leaders", nullptr})
    for (const auto& hosts :
         std::vector<std::vector<std::string>>{{"a", "a", "b", "b"},
                                               {"a", "b", "a", "b", "c"},
                                               {"a", "a", "a", "b", "b", "c", "c"}}) {
      CAPTURE(std::string(algorithm ? algorithm : "chosen"));
      CAPTURE(hosts.size());
      across_hosts(hosts, algorithm, reduces_right);
    }
}

TEST_CASE("the chain's order: the root, its host's other ranks, then host after host") {
  const auto t = group_topology::of_hosts({"a", "b", "a", "c", "b"});  // hosts 0 1 0 2 1
  CHECK(chain_order(*t, 5, 2) == std::vector<int>{2, 0, 1, 4, 3});
  CHECK(chain_order(*t, 5, 4) == std::vector<int>{4, 1, 3, 0, 2});
  CHECK(chain_order(*t, 5, 3) == std::vector<int>{3, 0, 2, 1, 4});
  // No hosts known: rank order from the root, around.
  CHECK(chain_order(group_topology{}, 4, 2) == std::vector<int>{2, 3, 0, 1});
  CHECK(chain_order(group_topology{}, 1, 0) == std::vector<int>{0});
  // Its links: through every rank, or through each host's first rank, each
  // starting a chain of its host's others (children across hosts first).
  const auto plain = chain_links(*t, 5, 2, false);
  CHECK(plain.parent == std::vector<int>{2, 0, -1, 4, 1});
  CHECK(plain.depth == 5);
  CHECK(plain.deepest == 3);
  const auto hosts = group_topology::of_hosts({"a", "a", "a", "b", "b", "c", "c", "c"});
  const auto leaders = chain_links(*hosts, 8, 1, true);  // order 1 0 2 3 4 5 6 7
  CHECK(leaders.parent == std::vector<int>{1, -1, 0, 1, 3, 3, 5, 6});
  CHECK(leaders.children[1] == std::vector<int>{3, 0});
  CHECK(leaders.children[3] == std::vector<int>{5, 4});
  CHECK(leaders.depth == 5);  // 1 3 5 6 7
  CHECK(leaders.deepest == 7);
  // No hosts known: the plain chain.
  CHECK(chain_links(group_topology{}, 4, 1, true).parent == std::vector<int>{3, -1, 1, 2});
  // Segments: a quarter of one per hop of fill, 64 KiB to 1 MiB each.
  CHECK(chain_segments(0, 4) == 1);
  CHECK(chain_segments(4, 4) == 1);
  CHECK(chain_segments((64 << 10) + 1, 2) == 2);
  CHECK(chain_segments(std::uint64_t{64} << 20, 8) == 64);
  CHECK(chain_segments(std::uint64_t{1} << 20, 8) == 16);
}

namespace {

/// `forced` (a chain) on 1, 2, 3, 4 and 7 ranks in one process: `call(w,
/// len, root)` for 0 and 1 element and 300,001 (1.2 MB: 5 to 19 segments),
/// to or from every root, then `after(w)`.
template <class Call, class After>
void chain_cases(const char* forced, Call call, After after) {
  test::scoped_env engine{"TROUPE_ENGINE", "messages"};
  test::scoped_env algorithms{"TROUPE_ALGORITHMS", forced};
  for (int n : {1, 2, 3, 4, 7}) {
    CAPTURE(n);
    testing::run_ranks(n, [&](world& w) {
      for (std::int64_t len : {std::int64_t{0}, std::int64_t{1}, std::int64_t{300001}})
        for (int root = 0; root < n; ++root) {
          CAPTURE(len);
          CAPTURE(root);
          call(w, len, root);
        }
      after(w);
    });
  }
}

}  // namespace

TEST_CASE("the chain's broadcast in one process: 1 to 7 ranks, every root, several segments") {
  {
    test::scoped_env forced{"TROUPE_ALGORITHMS", "broadcast=chain"};
    CHECK(chosen_algorithm(op_code::broadcast, 64, *layout(1, 3), cost_model{}) ==
          algorithm_kind::broadcast_chain);
  }
  chain_cases(
      "broadcast=chain",
      [](world& w, std::int64_t len, int root) {
        const int r = w.rank();
        auto t = tensor::empty({len}, dtype::int64);
        for (std::int64_t i = 0; i < len; ++i)
          t.data_as<std::int64_t>()[i] = r == root ? 1000 * root + 3 * i : -1;
        w.default_group().broadcast(t, root).wait();
        bool same = true;
        for (std::int64_t i = 0; i < len; ++i)
          same &= t.data_as<std::int64_t>()[i] == 1000 * root + 3 * i;
        CHECK(same);
        // The root may write its buffer as soon as its call returned.
        if (r == root)
          for (std::int64_t i = 0; i < len; ++i) t.data_as<std::int64_t>()[i] = -7;
      },
      [](world&) {});
}

TEST_CASE("the chain's reduce in one process: 1 to 7 ranks, every root, several segments") {
  {
    test::scoped_env forced{"TROUPE_ALGORITHMS", "reduce=chain"};
    CHECK(chosen_algorithm(op_code::reduce, 64, *layout(1, 3), cost_model{}) ==
          algorithm_kind::reduce_chain);
  }
  chain_cases(
      "reduce=chain",
      [](world& w, std::int64_t len, int root) {
        const int r = w.rank();
        const std::int64_t n = w.size();
        auto t = tensor::empty({len}, dtype::int64);
        for (std::int64_t i = 0; i < len; ++i)
          t.data_as<std::int64_t>()[i] = 1000 * (r + 1) + 3 * i;
        w.default_group().reduce(t, {.op = reduce_op::SUM, .root_rank = root}).wait();
        bool right = true;
        for (std::int64_t i = 0; i < len; ++i)
          right &= t.data_as<std::int64_t>()[i] ==
                   (r == root ? 1000 * (n * (n + 1) / 2) + 3 * i * n : 1000 * (r + 1) + 3 * i);
        CHECK(right);
        // Every rank may write its buffer as soon as its call returned.
        for (std::int64_t i = 0; i < len; ++i) t.data_as<std::int64_t>()[i] = -7;
      },
      [](world& w) {
        // AVG and PREMUL_SUM: scaled once, divided once, at the root.
        const int r = w.rank(), n = w.size();
        auto a = tensor::from_vector<double>({double(r), 2.0 * r});
        w.default_group().reduce(a, {.op = reduce_op::AVG, .root_rank = n - 1}).wait();
        if (r == n - 1)
          CHECK(a.to_vector<double>() == std::vector<double>{(n - 1) / 2.0, double(n - 1)});
        else
          CHECK(a.to_vector<double>() == std::vector<double>{double(r), 2.0 * r});
        auto p = tensor::from_vector<double>({1.0, double(r)});
        w.default_group().reduce(p, {.op = reduce_op::premul_sum(0.5), .root_rank = 0}).wait();
        if (r == 0)
          CHECK(p.to_vector<double>() == std::vector<double>{0.5 * n, 0.25 * n * (n - 1)});
      });
}

TEST_CASE("recursive doubling's allgather in one process: 4 and 8 ranks, buffers reused at once") {
  test::scoped_env engine{"TROUPE_ENGINE", "messages"};
  test::scoped_env forced{"TROUPE_ALGORITHMS", "allgather=recursive_doubling"};
  // Forced where it runs (a power of two of ranks, more than 2), else chosen.
  CHECK(chosen_algorithm(op_code::allgatherv, 64, *layout(1, 4), cost_model{}) ==
        algorithm_kind::allgather_recursive_doubling);
  CHECK(chosen_algorithm(op_code::allgatherv, 64, *layout(2, 4), cost_model{}) ==
        algorithm_kind::allgather_recursive_doubling);
  CHECK(chosen_algorithm(op_code::allgatherv, 64, *layout(1, 6), cost_model{}) !=
        algorithm_kind::allgather_recursive_doubling);
  for (int n : {4, 6, 8})
    for (std::int64_t len : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{100003}}) {
      CAPTURE(n);
      CAPTURE(len);
      testing::run_ranks(n, [&](world& w) {
        auto& pg = w.default_group();
        const int r = w.rank();
        auto mine = tensor::empty({len}, dtype::int64);
        auto all = tensor::empty({len * n}, dtype::int64);
        for (int round = 0; round < 3; ++round) {
          // The next round writes this rank's buffers as soon as its call
          // returned, while slower ranks may still read what it sent.
          for (std::int64_t i = 0; i < len; ++i)
            mine.data_as<std::int64_t>()[i] = 1000 * r + 7 * i + round;
          pg.allgather_into_tensor(all, mine).wait();
          bool whole = true;
          for (int q = 0; q < n; ++q)
            for (std::int64_t i = 0; i < len; ++i)
              whole &= all.data_as<std::int64_t>()[q * len + i] == 1000 * q + 7 * i + round;
          CHECK(whole);
        }
      });
    }
}

TEST_CASE("broadcast, allgather and reduce_scatter across emulated hosts") {
  for (const char* algorithm : std::initializer_list<const char*>{
           "broadcast=hier,allgather=bruck", "broadcast=scatter_allgather,allgather=ring",
           "broadcast=chain,allgather=ring", "broadcast=chain_leaders,allgather=bruck",
           "broadcast=binomial,allgather=recursive_doubling", nullptr})
    for (const auto& hosts : std::vector<std::vector<std::string>>{{"a", "a", "b", "b"},
                                                                   {"b", "a", "a", "b"},
                                                                   {"a", "b", "b", "c", "c", "c"},
                                                                   {"a", "b", "c", "d", "e"}}) {
      CAPTURE(std::string(algorithm ? algorithm : "chosen"));
      across_hosts(hosts, algorithm, broadcasts_and_gathers_right);
    }
}

namespace {

/// Element i of `t` (float32, int64 or uint8) as an integer, and written.
std::int64_t element(const tensor& t, std::int64_t i) {
  switch (t.scalar_type()) {
    case dtype::float32:
      return static_cast<std::int64_t>(t.data_as<float>()[i]);
    case dtype::int64:
      return t.data_as<std::int64_t>()[i];
    default:
      return t.data_as<std::uint8_t>()[i];
  }
}
void set_element(tensor& t, std::int64_t i, std::int64_t v) {
  switch (t.scalar_type()) {
    case dtype::float32:
      t.data_as<float>()[i] = static_cast<float>(v);
      break;
    case dtype::int64:
      t.data_as<std::int64_t>()[i] = v;
      break;
    default:
      t.data_as<std::uint8_t>()[i] = static_cast<std::uint8_t>(v);
  }
}

/// allgather and allgatherv of several dtypes: blocks of one size (one
/// element, around a segment, several segments), in place (the input is
/// this rank's block of the output), the same buffers again at once, and
/// blocks of different sizes with empty ones.
bool allgathers_right(world& w) {
  auto& pg = w.default_group();
  const int n = w.size(), r = w.rank();
  bool ok = true;
  for (std::int64_t each : {std::int64_t{1}, std::int64_t{4099}, std::int64_t{300007}})
    for (auto t : {dtype::float32, dtype::int64, dtype::uint8}) {
      auto mine = tensor::empty({each}, t), all = tensor::empty({each * n}, t);
      const auto value = [](int q, std::int64_t i, int round) -> std::int64_t {
        return (q * 131 + i * 7 + round) % 251;
      };
      for (int round = 0; round < 2; ++round) {
        for (std::int64_t i = 0; i < each; ++i) set_element(mine, i, value(r, i, round));
        pg.allgather_into_tensor(all, mine).wait();
        bool whole = true;
        for (int q = 0; q < n; ++q)
          for (std::int64_t i = 0; i < each; ++i)
            whole &= element(all, q * each + i) == value(q, i, round);
        ok &= test::expect(r, whole,
                           ct::name("allgather", t, each) + " round " + std::to_string(round));
      }
      // In place: this rank's block of the output is its input.
      for (std::int64_t i = 0; i < each * n; ++i) set_element(all, i, 255);
      auto own = all.flat_slice(r * each, each);
      for (std::int64_t i = 0; i < each; ++i) set_element(own, i, value(r, i, 2));
      pg.allgather_into_tensor(all, own).wait();
      bool whole = true;
      for (int q = 0; q < n; ++q)
        for (std::int64_t i = 0; i < each; ++i)
          whole &= element(all, q * each + i) == value(q, i, 2);
      ok &= test::expect(r, whole, ct::name("allgather in place", t, each));
    }
  // Blocks of different sizes, some empty (allgatherv).
  for (std::int64_t scale : {std::int64_t{1}, std::int64_t{100001}}) {
    auto counts = ct::uneven_counts(n);
    std::int64_t total = 0;
    for (auto& c : counts) total += c *= scale;
    const auto offsets = offsets_of(counts);
    auto mine = tensor::empty({counts[static_cast<std::size_t>(r)]}, dtype::int32);
    for (std::int64_t i = 0; i < mine.numel(); ++i)
      mine.data_as<int>()[i] = r * 1000 + int(i % 997);
    auto all = tensor::empty({total}, dtype::int32);
    pg.allgatherv(all, mine, counts).wait();
    bool whole = true;
    for (int q = 0; q < n; ++q)
      for (std::int64_t i = 0; i < counts[static_cast<std::size_t>(q)]; ++i)
        whole &=
            all.data_as<int>()[offsets[static_cast<std::size_t>(q)] + i] == q * 1000 + int(i % 997);
    ok &= test::expect(r, whole, "allgatherv of uneven blocks x" + std::to_string(scale));
  }
  return ok;
}

}  // namespace

TEST_CASE("allgather across emulated hosts: the hierarchies, the ring, the model's choice") {
  // Hosts of as many ranks each, in a row, interleaved and in threes, and
  // of different sizes (the leaders run there, the striped columns cannot:
  // forced, the model's choice runs).
  for (const char* algorithm : std::initializer_list<const char*>{
           "allgather=hier_striped", "allgather=hier_leaders", "allgather=ring", nullptr})
    for (const auto& hosts : striped_layouts()) {
      CAPTURE(std::string(algorithm ? algorithm : "chosen"));
      CAPTURE(hosts.size());
      across_hosts(hosts, algorithm, allgathers_right);
    }
}

TEST_CASE("allgather and reduce_scatter hierarchies in slices: uneven and empty slices") {
  // 4 KiB slices: blocks of 4099 float32 or int64 elements run in 4 to 16
  // slices, of fewer elements than slices too; uneven blocks, empty ones.
  test::scoped_env segment{"TROUPE_HIER_SEGMENT", "4096"};
  for (const auto& hosts : std::vector<std::vector<std::string>>{{"a", "a", "b", "b"},
                                                                 {"a", "b", "c", "a", "b", "c"}}) {
    CAPTURE(hosts.size());
    across_hosts(hosts, "allgather=hier_striped,reduce_scatter=hier_striped",
                 [](world& w) { return allgathers_right(w) && reduce_scatters_right(w); });
  }
}
