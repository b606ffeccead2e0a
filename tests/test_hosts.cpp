// Ranks on different addresses talk over TCP, a stand-in for separate hosts:
// two forked children whose data planes listen on 127.0.0.2 and 127.0.0.3,
// and (where network namespaces can be made: root and `ip netns`) two
// children in namespaces of their own, joined by a veth pair with
// 10.77.0.1/24 and 10.77.0.2/24. Each child runs an allreduce and an
// allgather, checks the results, and checks in /proc/self/net/tcp (its own
// namespace) that a connection was accepted on its address and one reaches
// the other child's address.

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

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
