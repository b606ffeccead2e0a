// Ranks on different addresses talk over TCP, a stand-in for separate hosts:
// two forked children whose data planes listen on 127.0.0.2 and 127.0.0.3,
// and (where network namespaces can be made: root and `ip netns`) two
// children in namespaces of their own, joined by a veth pair with
// 10.77.0.1/24 and 10.77.0.2/24. Each child runs an allreduce and an
// allgather, checks the results, and checks in /proc/self/net/tcp (its own
// namespace) that a connection was accepted on its address and one reaches
// the other child's address.
//
// Run under scripts/hosts.sh and troupe-run (the ctests test_hosts_<H>x<R>,
// label hosts), the case "across emulated hosts" runs instead: every rank
// checks that its host is one of its own (host name, /dev/shm shared only
// with the ranks of its host), runs the collectives at sizes on both sides of
// the thresholds, on the world and on groups that span hosts or stay inside
// one, checks every result exactly, and checks that its process reached
// every other host over TCP.

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/cost_model.hpp"
#include "children.hpp"
#include "troupe/troupe.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

struct host {
  std::string address;  ///< TROUPE_BIND_ADDR of the child
  std::string netns;    ///< network namespace to join ("" = the test's own)
};

/// /proc/net/tcp's spelling of an IPv4 address: the raw 32 bits in hex.
std::string proc_hex(const std::string& address) {
  in_addr a{};
  ::inet_pton(AF_INET, address.c_str(), &a);
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08X", a.s_addr);
  return buf;
}

/// Whether an established TCP connection of this namespace has local address
/// `local` (empty: any) and remote address `remote` (empty: any).
bool established(const std::string& local, const std::string& remote) {
  std::ifstream in("/proc/self/net/tcp");
  std::string line, sl, loc, rem, st;
  std::getline(in, line);  // header
  while (in >> sl >> loc >> rem >> st) {
    std::getline(in, line);
    const bool l = local.empty() || loc.rfind(proc_hex(local) + ":", 0) == 0;
    const bool r = remote.empty() || rem.rfind(proc_hex(remote) + ":", 0) == 0;
    if (st == "01" && l && r) return true;
  }
  return false;
}

/// The child's work as rank `me` of 2; false (with a message) on any mismatch.
bool allreduce_allgather_over_tcp(int me, const std::string& path, const host& mine,
                                  const host& peer) {
  auto s = std::make_shared<file_store>(path, 10s);
  world w{"actor", s, me, 2, 10s};
  auto& pg = w.default_group();
  bool ok = true;
  auto x = tensor::empty({100000}, dtype::float32);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = float(me + 1) * (i % 11);
  pg.allreduce(x).wait();
  for (std::int64_t i = 0; i < x.numel(); ++i) ok &= x.data_as<float>()[i] == 3.f * (i % 11);
  tensor_list outs{tensor::zeros({3}, dtype::int64), tensor::zeros({3}, dtype::int64)};
  pg.allgather(outs, tensor::from_vector<std::int64_t>({me, 10 * me, 100 * me})).wait();
  for (int r = 0; r < 2; ++r)
    ok &= outs[static_cast<std::size_t>(r)].to_vector<std::int64_t>() ==
          std::vector<std::int64_t>{r, 10 * r, 100 * r};
  if (!ok) std::fprintf(stderr, "rank %d: a collective result was wrong\n", me);
  // The bytes went over TCP between the two addresses.
  const bool accepted = established(mine.address, ""), reached = established("", peer.address);
  if (!accepted || !reached)
    std::fprintf(stderr, "rank %d: no TCP connection %s %s\n", me, accepted ? "to" : "accepted on",
                 (accepted ? peer : mine).address.c_str());
  pg.barrier().wait();  // keep this world until the other is done
  return ok && accepted && reached;
}

/// Forks one child per host (rank = index) over one file_store; returns their exit codes.
std::vector<int> run_hosts(const std::vector<host>& hosts) {
  const std::string path = troupe::test::temp_store_path();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(15);  // never outlive the test
      const host& mine = hosts[static_cast<std::size_t>(r)];
      if (!mine.netns.empty()) {
        const int fd = ::open(("/run/netns/" + mine.netns).c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
          std::perror("setns");
          ::_exit(3);
        }
        ::close(fd);
      }
      ::setenv("TROUPE_BIND_ADDR", mine.address.c_str(), 1);
      ::setenv("TROUPE_TRANSPORT", "tcp", 1);
      ::setenv("TROUPE_JOB_TOKEN", "fedcba9876543210", 1);
      int code = 1;
      try {
        code = allreduce_allgather_over_tcp(r, path, mine, hosts[static_cast<std::size_t>(1 - r)])
                   ? 0
                   : 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  auto codes = troupe::test::wait_for_children(pids);
  ::unlink(path.c_str());
  return codes;
}

int sh(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str());
}

/// Two namespaces joined by a veth pair, deleted again when it goes away.
struct netns_pair {
  std::string a, b, veth_a, veth_b;
  bool ok = false;
  netns_pair() {
    const auto id = std::to_string(::getpid());
    a = "troupe-test-" + id + "-a";
    b = "troupe-test-" + id + "-b";
    veth_a = "trp" + id + "a";
    veth_b = "trp" + id + "b";
    if (::geteuid() != 0 || sh("ip netns add " + a) != 0) return;
    ok = sh("ip netns add " + b) == 0 &&
         sh("ip link add " + veth_a + " type veth peer name " + veth_b) == 0 &&
         sh("ip link set " + veth_a + " netns " + a) == 0 &&
         sh("ip link set " + veth_b + " netns " + b) == 0 &&
         sh("ip -n " + a + " addr add 10.77.0.1/24 dev " + veth_a) == 0 &&
         sh("ip -n " + b + " addr add 10.77.0.2/24 dev " + veth_b) == 0 &&
         sh("ip -n " + a + " link set " + veth_a + " up") == 0 &&
         sh("ip -n " + b + " link set " + veth_b + " up") == 0 &&
         sh("ip -n " + a + " link set lo up") == 0 && sh("ip -n " + b + " link set lo up") == 0;
  }
  ~netns_pair() {
    sh("ip link del " + veth_a);  // only left over when it was never moved
    sh("ip netns del " + a);      // takes the veth pair with it
    sh("ip netns del " + b);
  }
};

}  // namespace

TEST_CASE("ranks on 127.0.0.2 and 127.0.0.3 talk over TCP") {
  auto codes = run_hosts({{"127.0.0.2", ""}, {"127.0.0.3", ""}});
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}

TEST_CASE("ranks in two network namespaces joined by a veth pair talk over TCP") {
  netns_pair ns;
  if (!ns.ok) {
    MESSAGE(
        "skipped: cannot create network namespaces and a veth pair here (needs root and `ip "
        "netns`)");
    return;
  }
  auto codes = run_hosts({{"10.77.0.1", ns.a}, {"10.77.0.2", ns.b}});
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}

namespace {

/// Where this process runs, from scripts/hosts.sh's and troupe-run's environment.
struct emulated_host {
  int index = 0;       ///< HOST_INDEX
  int count = 1;       ///< HOST_COUNT
  int local_size = 1;  ///< LOCAL_WORLD_SIZE: ranks (processes) on each host
  int world_size = 1;  ///< WORLD_SIZE
  std::string name;    ///< HOST_NAME
  std::string master;  ///< HOST_MASTER_ADDR: host 0's address
};

std::optional<emulated_host> emulated_host_of_env() {
  const char* keys[] = {"HOST_INDEX",       "HOST_COUNT",       "HOST_NAME",
                        "HOST_MASTER_ADDR", "LOCAL_WORLD_SIZE", "WORLD_SIZE"};
  for (const char* k : keys)
    if (!std::getenv(k)) return std::nullopt;
  emulated_host h;
  h.index = std::atoi(std::getenv("HOST_INDEX"));
  h.count = std::atoi(std::getenv("HOST_COUNT"));
  h.name = std::getenv("HOST_NAME");
  h.master = std::getenv("HOST_MASTER_ADDR");
  h.local_size = std::atoi(std::getenv("LOCAL_WORLD_SIZE"));
  h.world_size = std::atoi(std::getenv("WORLD_SIZE"));
  return h;
}

/// Host k's address: scripts/hosts.sh gives host k the address A.B.C.(k+1).
std::string host_address(const std::string& master, int k) {
  return master.substr(0, master.rfind('.') + 1) + std::to_string(k + 1);
}

tensor floats(std::int64_t n) {
  return tensor::empty({n}, dtype::float32);
}

/// Number of elements of `t` that differ from want(i).
template <class F>
std::int64_t wrong(const tensor& t, F want) {
  std::int64_t bad = 0;
  const float* p = t.data_as<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) bad += p[i] != want(i);
  return bad;
}

/// allreduce of `count` floats, then allgather, reduce_scatter, broadcast (from
/// the group's last rank: on the last host) and alltoall of about as many, on
/// `pg`, each checked exactly.
void collectives(process_group& pg, std::int64_t count) {
  const int me = pg.rank(), n = pg.size();
  CAPTURE(count);
  CAPTURE(n);
  auto x = floats(count);
  for (std::int64_t i = 0; i < count; ++i) x.data_as<float>()[i] = float((me + 1) * (i % 13));
  pg.allreduce(x).wait();
  CHECK(wrong(x, [&](std::int64_t i) { return float(n * (n + 1) / 2 * (i % 13)); }) == 0);

  const std::int64_t block = count / n + 1;
  auto in = floats(block), all = floats(block * n);
  for (std::int64_t i = 0; i < block; ++i) in.data_as<float>()[i] = float(me * 1000 + i % 7);
  pg.allgather_into_tensor(all, in).wait();
  CHECK(wrong(all, [&](std::int64_t i) { return float(i / block * 1000 + i % block % 7); }) == 0);

  for (std::int64_t i = 0; i < block * n; ++i) all.data_as<float>()[i] = float((me + 1) * (i % 7));
  pg.reduce_scatter_tensor(in, all).wait();
  CHECK(wrong(in, [&](std::int64_t i) {
          return float(n * (n + 1) / 2 * ((me * block + i) % 7));
        }) == 0);

  const int root = n - 1;
  for (std::int64_t i = 0; i < count; ++i) x.data_as<float>()[i] = me == root ? float(i % 11) : -1;
  pg.broadcast(x, root).wait();
  CHECK(wrong(x, [](std::int64_t i) { return float(i % 11); }) == 0);

  // Block r of my input goes to rank r; block s of my output came from rank s.
  auto out = floats(block * n);
  for (std::int64_t i = 0; i < block * n; ++i)
    all.data_as<float>()[i] = float(me * 1000 + i / block * 10 + i % block % 5);
  pg.alltoall_single(out, all).wait();
  CHECK(wrong(out, [&](std::int64_t i) {
          return float(i / block * 1000 + me * 10 + i % block % 5);
        }) == 0);
}

/// Whether this process has an established TCP connection to every other host.
bool reached_every_host(const emulated_host& h) {
  bool all = true;
  for (int k = 0; k < h.count; ++k)
    if (k != h.index && !established("", host_address(h.master, k)) &&
        !established(host_address(h.master, k), "")) {
      std::fprintf(stderr, "%s: no TCP connection with host%d (%s)\n", h.name.c_str(), k,
                   host_address(h.master, k).c_str());
      all = false;
    }
  return all;
}

}  // namespace

TEST_CASE("across emulated hosts: each host apart, collectives exact at every size") {
  const auto h = emulated_host_of_env();
  if (!h || !launched_by_launcher()) {
    MESSAGE(
        "skipped: runs under scripts/hosts.sh and troupe-run (ctests test_hosts_*, label hosts)");
    return;
  }
  testing::run_ranks(h->world_size, [&](world& w) {
    auto& pg = w.default_group();
    // The host is one of its own: its name, and a /dev/shm that only the
    // ranks of this host share.
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    CHECK(std::string(name) == h->name);
    const std::filesystem::path mark = "/dev/shm/troupe-test-hosts-" + std::to_string(w.rank());
    std::ofstream{mark} << w.rank();
    pg.barrier().wait();
    int marks = 0;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
      marks += e.path().filename().string().rfind("troupe-test-hosts-", 0) == 0;
    CHECK(marks == h->local_size);
    pg.barrier().wait();
    std::filesystem::remove(mark);

    // The world, at sizes below and above the small-message paths.
    for (std::int64_t count :
         {std::int64_t{1}, std::int64_t{1000}, std::int64_t{70001}, std::int64_t{(1 << 20) + 3}})
      collectives(pg, count);

    // One rank of every host (the local rank 0s), and each host's own ranks:
    // every rank creates every group, in the same order.
    std::vector<int> leaders;
    for (int k = 0; k < h->count; ++k) leaders.push_back(k * h->local_size);
    auto across = w.new_group(leaders);
    if (w.rank() % h->local_size == 0) collectives(*across, 70001);
    for (int k = 0; k < h->count; ++k) {
      std::vector<int> local;
      for (int i = 0; i < h->local_size; ++i) local.push_back(k * h->local_size + i);
      auto inside = w.new_group(local);
      if (k == h->index) collectives(*inside, 70001);
    }
    pg.barrier().wait();
    CHECK(reached_every_host(*h));
    pg.barrier().wait();  // keep this world until every rank checked
  });
}

TEST_CASE("across emulated hosts: the link measured at start is the link's shaped rate") {
  // Under scripts/hosts.sh --link RATE with TROUPE_LINK_COSTS=measure and
  // TROUPE_TEST_LINK_RATE the rate in bytes per second (ctest
  // test_hosts_measured_2x2_1gbit).
  const auto h = emulated_host_of_env();
  const char* rate = std::getenv("TROUPE_TEST_LINK_RATE");
  if (!h || !launched_by_launcher() || !rate) {
    MESSAGE(
        "skipped: runs under scripts/hosts.sh --link with TROUPE_TEST_LINK_RATE (ctest "
        "test_hosts_measured_2x2_1gbit)");
    return;
  }
  const double shaped = std::atof(rate);
  testing::run_ranks(h->world_size, [&](world& w) {
    const auto m = detail::cost_model::parse(w.link_costs());
    CAPTURE(w.link_costs());
    // tbf's rate counts the frames' headers too: the payload gets about 95%.
    CHECK(m.host.bandwidth >= 0.7 * shaped);
    CHECK(m.host.bandwidth <= 1.05 * shaped);
    CHECK(m.host.latency > 0);
    CHECK(m.host.latency < 5e-3);
    // Every rank chooses by the same model: the collectives run, exact.
    collectives(w.default_group(), 70001);
    w.default_group().barrier().wait();
  });
}
