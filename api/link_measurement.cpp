// link_measurement (link_measurement.hpp): what a world across hosts
// measures at start, and the model every rank then chooses by.

#include "api/link_measurement.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "algorithms/cost_fit.hpp"
#include "transport/data_plane.hpp"
#include "transport/rendezvous.hpp"

namespace troupe::detail {
namespace {

using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point t) {
  return std::chrono::duration<double>(clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// The first two hosts' ranks (the host of world rank 0 first), each
/// ascending, and the world's hosts by rank.
struct two_hosts {
  std::vector<int> first, second;
  std::vector<std::string> host_of;
};

two_hosts first_two_hosts(const data_plane& plane, int n) {
  two_hosts h;
  for (int r = 0; r < n; ++r) h.host_of.push_back(plane.host_of(r));
  for (int r = 0; r < n; ++r) {
    if (h.host_of[static_cast<std::size_t>(r)] == h.host_of[0])
      h.first.push_back(r);
    else if (h.second.empty() || h.host_of[static_cast<std::size_t>(r)] ==
                                     h.host_of[static_cast<std::size_t>(h.second[0])])
      h.second.push_back(r);
  }
  return h;
}

/// TROUPE_LINK_COSTS as this world reads it at its start (a process forked
/// after its parent read the setting follows its own).
std::string setting() {
  const char* v = std::getenv("TROUPE_LINK_COSTS");
  return v ? v : "";
}

constexpr std::int64_t exchange_floats = 2 << 20;  // 8 MiB each way
constexpr std::int64_t cached_floats = 1 << 18;    // 1 MiB each way: in the cache
// Small calls run slower for a while after a pause on virtual machines
// (bench/bench_common.cpp's warm-up): a few hundred first, untimed.
constexpr int warm_pings = 300, pings = 100, exchanges = 5, warm_barriers = 100, barriers = 50,
              warm_exchanges = 50, cached_exchanges = 20;

/// On rank 0, `times` becomes each round's longest over every rank (each
/// sends its own); the others send theirs.
void longest_at_rank0(process_group& pg, tensor& times) {
  if (pg.rank() != 0) {
    pg.send(times, 0).wait();
    return;
  }
  auto theirs = tensor::zeros({times.numel()}, dtype::float64);
  for (int r = 1; r < pg.size(); ++r) {
    pg.recv(theirs, r).wait();
    for (std::int64_t j = 0; j < times.numel(); ++j)
      times.data_as<double>()[j] =
          std::max(times.data_as<double>()[j], theirs.data_as<double>()[j]);
  }
}

/// On rank 0, the median over `count` rounds of `round` (after `warm`
/// untimed) of the longest any rank took, each round started by a barrier
/// (as the benchmarks time a call); 0 on the others. Every rank runs it.
template <class Round>
double slowest_median(process_group& pg, int warm, int count, Round round) {
  for (int i = 0; i < warm; ++i) {
    pg.barrier().wait();
    round();
  }
  auto took = tensor::zeros({count}, dtype::float64);
  for (int i = 0; i < count; ++i) {
    pg.barrier().wait();
    const auto t = clock::now();
    round();
    took.data_as<double>()[i] = seconds_since(t);
  }
  longest_at_rank0(pg, took);
  return pg.rank() == 0
             ? median(std::vector<double>(took.data_as<double>(), took.data_as<double>() + count))
             : 0;
}

}  // namespace

bool measures_links(const data_plane& plane, int rank, int world_size, store& s,
                    const std::string& key, rendezvous& rdv) {
  bool hosts = false;
  for (int r = 1; r < world_size && !hosts; ++r) hosts = plane.host_of(r) != plane.host_of(0);
  if (!hosts) return false;
  if (rank == 0) s.set(key, cost_model::parse(setting()).measure ? "1" : "0");
  rdv.wait_for(
      {0}, [&](int) { return key; }, "say whether the world measures its link");
  return s.get_string(key) == "1";
}

std::string measure_link_costs(process_group& pg, const data_plane& plane, store& s,
                               const std::string& key, rendezvous& rdv, bool debug) {
  const int me = pg.rank(), n = pg.size();
  const auto hosts = first_two_hosts(plane, n);
  const int k = static_cast<int>(std::min(hosts.first.size(), hosts.second.size()));
  // My counterpart on the other of the two hosts (-1: none).
  int partner = -1, place = -1;
  for (int i = 0; i < k; ++i) {
    if (hosts.first[static_cast<std::size_t>(i)] == me)
      partner = hosts.second[static_cast<std::size_t>(i)], place = i;
    if (hosts.second[static_cast<std::size_t>(i)] == me)
      partner = hosts.first[static_cast<std::size_t>(i)], place = i;
  }
  const bool timer = me == 0;  // world rank 0: the first host's first rank
  auto small = tensor::zeros({1}, dtype::float32), small_in = tensor::zeros({1}, dtype::float32);
  auto big = tensor::zeros({exchange_floats}, dtype::float32),
       big_in = tensor::zeros({exchange_floats}, dtype::float32);
  // A round trip that the first host's rank starts.
  auto round_trip = [&] {
    if (timer) {
      pg.send(small, partner).wait();
      pg.recv(small_in, partner).wait();
    } else {
      pg.recv(small_in, partner).wait();
      pg.send(small, partner).wait();
    }
  };
  auto cached = tensor::zeros({cached_floats}, dtype::float32),
       cached_in = tensor::zeros({cached_floats}, dtype::float32);
  auto exchange_of = [&](tensor& out_buf, tensor& in_buf) {
    auto out = pg.send(out_buf, partner), in = pg.recv(in_buf, partner);
    out.wait();
    in.wait();
  };
  auto exchange = [&] { exchange_of(big, big_in); };
  link_sample sample;
  sample.bytes = static_cast<double>(exchange_floats) * 4;
  sample.pairs = k;
  sample.ranks_per_host = k;
  pg.barrier().wait();
  if (place == 0) {  // the first rank of each of the two hosts
    std::vector<double> trips;
    for (int i = 0; i < warm_pings + pings; ++i) {
      const auto t = clock::now();
      round_trip();
      if (i >= warm_pings) trips.push_back(seconds_since(t));
    }
    sample.one_way = median(trips) / 2;
    // Each exchange's median, as the benchmarks report a call's time.
    auto exchanges_of = [&](tensor& out_buf, tensor& in_buf, int count) {
      std::vector<double> pair;
      for (int i = 0; i < 1 + count; ++i) {  // the first warms the connection up
        round_trip();                        // starts the two together (within one way)
        const auto t = clock::now();
        exchange_of(out_buf, in_buf);
        if (i > 0) pair.push_back(seconds_since(t));
      }
      return median(pair);
    };
    sample.pair = exchanges_of(big, big_in, exchanges);
    sample.cached_bytes = static_cast<double>(cached_floats) * 4;
    sample.pair_cached = exchanges_of(cached, cached_in, cached_exchanges);
  }
  if (k > 1) {
    // The pairs at once: each round lasts until the last pair is done (a
    // pair alone finishes before the rest, the link then left to them).
    // One round first warms the other pairs up; the ranks of no pair wait.
    const double all = slowest_median(pg, 1, exchanges, [&] {
      if (partner >= 0) exchange();
    });
    if (timer) sample.all = all;
  }
  // Every rank runs the same steps whatever its own setting says (only
  // rank 0's counts): the barriers also where rank 0 will not use them.
  layout_sample layout;
  layout.barrier = slowest_median(pg, warm_barriers, barriers, [&] { pg.barrier().wait(); });
  // Every rank sending each other rank a float at once, as the pairwise
  // alltoall's step: the work of each further message.
  auto block = tensor::zeros({1}, dtype::float32);
  std::vector<tensor> from(static_cast<std::size_t>(n));
  for (auto& t : from) t = tensor::zeros({1}, dtype::float32);
  layout.block = 4;
  layout.alltoall = slowest_median(pg, warm_exchanges, barriers, [&] {
    std::vector<work> pending;
    for (int i = 1; i < n; ++i)
      pending.push_back(
          pg.recv(from[static_cast<std::size_t>((me + n - i) % n)], (me + n - i) % n));
    for (int i = 1; i < n; ++i) pending.push_back(pg.send(block, (me + i) % n));
    for (auto& w : pending) w.wait();
  });
  const auto given = setting();
  const auto configured = cost_model::parse(given).with_sharing(plane.job_sharing().ranks_per_cpu);
  if (timer) {
    auto fitted = fit_link(configured, sample);
    fitted = fit_sharing(fitted, *group_topology::of_hosts(hosts.host_of), layout);
    // The items given beside `measure` (rank 0's) win over what it measured.
    const auto text = cost_model::parse(given, fitted).to_text();
    if (debug)
      std::fprintf(
          stderr,
          "[troupe rank 0] link measured at start between hosts '%s' and '%s': one way "
          "%.1f us; %.0f bytes each way in %.3f ms by one pair (%.0f in %.3f), %.3f ms by %d "
          "at once; "
          "a barrier of the world %.1f us, a float from every rank to every other "
          "%.1f us; model: %s\n",
          hosts.host_of[0].c_str(),
          hosts.host_of[static_cast<std::size_t>(hosts.second[0])].c_str(), sample.one_way * 1e6,
          sample.bytes, sample.pair * 1e3, sample.cached_bytes, sample.pair_cached * 1e3,
          k > 1 ? sample.all * 1e3 : sample.pair * 1e3, k, layout.barrier * 1e6,
          layout.alltoall * 1e6, text.c_str());
    s.set(key, text);
  }
  rdv.wait_for(
      {0}, [&](int) { return key; }, "measure the link between hosts (TROUPE_LINK_COSTS=measure)");
  return s.get_string(key);
}

}  // namespace troupe::detail
