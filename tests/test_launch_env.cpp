// Tests for launching: read_launch_env with every launcher convention and every
// error naming its variable, make_store for each init method and its errors,
// and init_world with one rank through env://, tcp:// and file://.
#include <doctest/doctest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "check_error.hpp"
#include "transport/local_address.hpp"
#include "troupe/error.hpp"
#include "troupe/launch.hpp"
#include "troupe/tcp_store.hpp"

using namespace std::chrono_literals;
using troupe::errc;
using troupe::test::check_error;

namespace {

/// Clears every variable launching reads, and restores them when it goes away.
class env_guard {
 public:
  env_guard() {
    for (const char* name : names) {
      if (const char* v = std::getenv(name)) saved_[name] = v;
      ::unsetenv(name);
    }
  }
  ~env_guard() {
    for (const char* name : names) ::unsetenv(name);
    for (auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }
  env_guard(const env_guard&) = delete;
  env_guard& operator=(const env_guard&) = delete;
  void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }

 private:
  static constexpr const char* names[] = {"RANK",
                                          "WORLD_SIZE",
                                          "LOCAL_RANK",
                                          "MASTER_ADDR",
                                          "MASTER_PORT",
                                          "OMPI_COMM_WORLD_RANK",
                                          "OMPI_COMM_WORLD_SIZE",
                                          "OMPI_COMM_WORLD_LOCAL_RANK",
                                          "SLURM_PROCID",
                                          "SLURM_NTASKS",
                                          "SLURM_LOCALID",
                                          "TROUPE_JOB_TOKEN",
                                          "TROUPE_STORE_EXTERNAL",
                                          "TROUPE_BIND_ADDR",
                                          "TROUPE_SOCKET_IFNAME",
                                          "TROUPE_TRANSPORT"};
  std::map<std::string, std::string> saved_;
};

/// A loopback port that was free a moment ago.
std::uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

void read_fails(std::initializer_list<std::string_view> words) {
  check_error([] { troupe::read_launch_env(); }, errc::invalid_argument, words);
}

troupe::launch_env env_of(int rank, int size, const std::string& token = "tok") {
  troupe::launch_env env;
  env.rank = rank;
  env.world_size = size;
  env.token = token;
  return env;
}

}  // namespace

TEST_CASE("read_launch_env: troupe-run / torchrun variables") {
  env_guard g;
  g.set("RANK", "1");
  g.set("WORLD_SIZE", "4");
  g.set("LOCAL_RANK", "1");
  g.set("MASTER_ADDR", "10.0.0.7");
  g.set("MASTER_PORT", "29500");
  g.set("TROUPE_JOB_TOKEN", "s3cret");
  auto env = troupe::read_launch_env();
  CHECK(env.rank == 1);
  CHECK(env.world_size == 4);
  CHECK(env.local_rank == 1);
  CHECK(env.master_addr == "10.0.0.7");
  CHECK(env.master_port == 29500);
  CHECK(env.token == "s3cret");
  CHECK(env.source == "troupe-run/torchrun");

  ::unsetenv("LOCAL_RANK");  // optional
  ::unsetenv("MASTER_ADDR");
  ::unsetenv("MASTER_PORT");
  ::unsetenv("TROUPE_JOB_TOKEN");
  env = troupe::read_launch_env();
  CHECK(env.local_rank == -1);
  CHECK(env.master_addr.empty());
  CHECK(env.master_port == 0);
  CHECK(env.token.empty());
}

TEST_CASE("read_launch_env: mpirun and srun variables; precedence") {
  env_guard g;
  g.set("OMPI_COMM_WORLD_RANK", "2");
  g.set("OMPI_COMM_WORLD_SIZE", "3");
  g.set("OMPI_COMM_WORLD_LOCAL_RANK", "0");
  auto env = troupe::read_launch_env();
  CHECK(env.rank == 2);
  CHECK(env.world_size == 3);
  CHECK(env.local_rank == 0);
  CHECK(env.source == "mpirun");

  // RANK and OMPI_* both describe this process: agreeing is fine, RANK's convention wins.
  g.set("RANK", "2");
  g.set("WORLD_SIZE", "3");
  CHECK(troupe::read_launch_env().source == "troupe-run/torchrun");
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");

  g.set("SLURM_PROCID", "5");
  g.set("SLURM_NTASKS", "8");
  g.set("SLURM_LOCALID", "1");
  env = troupe::read_launch_env();
  CHECK(env.rank == 5);
  CHECK(env.world_size == 8);
  CHECK(env.local_rank == 1);
  CHECK(env.source == "srun");

  // SLURM_* describe the allocation: a launcher inside it (torchrun under sbatch) wins.
  g.set("RANK", "0");
  g.set("WORLD_SIZE", "2");
  env = troupe::read_launch_env();
  CHECK(env.rank == 0);
  CHECK(env.world_size == 2);
  CHECK(env.source == "troupe-run/torchrun");
}

TEST_CASE("read_launch_env: missing and partial sets name the missing variable") {
  env_guard g;
  read_fails({"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"});
  g.set("RANK", "0");
  read_fails({"RANK is set but WORLD_SIZE is not"});
  ::unsetenv("RANK");
  g.set("WORLD_SIZE", "2");
  read_fails({"WORLD_SIZE is set but RANK is not"});
  ::unsetenv("WORLD_SIZE");
  g.set("LOCAL_RANK", "0");
  read_fails({"LOCAL_RANK is set but RANK is not"});
  ::unsetenv("LOCAL_RANK");
  g.set("OMPI_COMM_WORLD_RANK", "0");
  read_fails({"OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not"});
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  g.set("SLURM_NTASKS", "2");
  read_fails({"SLURM_NTASKS is set but SLURM_PROCID is not"});
}

TEST_CASE("read_launch_env: malformed and out-of-range values name variable and value") {
  env_guard g;
  g.set("WORLD_SIZE", "4");
  for (const char* bad : {"abc", "", " 1", "1 ", "1.5", "0x1", "99999999999999999999"}) {
    CAPTURE(bad);
    g.set("RANK", bad);
    read_fails({"RANK='" + std::string(bad) + "'", "not an integer"});
  }
  g.set("RANK", "-1");
  read_fails({"RANK=-1", "out of range"});
  g.set("RANK", "4");
  read_fails({"RANK=4", "WORLD_SIZE=4"});
  g.set("RANK", "0");
  g.set("WORLD_SIZE", "0");
  read_fails({"WORLD_SIZE=0", "out of range"});
  g.set("WORLD_SIZE", "4");
  g.set("LOCAL_RANK", "4");
  read_fails({"LOCAL_RANK=4", "WORLD_SIZE=4"});
  g.set("LOCAL_RANK", "x");
  read_fails({"LOCAL_RANK='x'"});
  ::unsetenv("LOCAL_RANK");
  for (const char* bad : {"0", "65536", "-5"}) {
    g.set("MASTER_PORT", bad);
    read_fails({"MASTER_PORT=" + std::string(bad), "1..65535"});
  }
  g.set("MASTER_PORT", "http");
  read_fails({"MASTER_PORT='http'"});
  g.set("MASTER_PORT", "65535");
  CHECK(troupe::read_launch_env().master_port == 65535);
}

TEST_CASE("read_launch_env: contradictory conventions name both variables") {
  env_guard g;
  g.set("RANK", "1");
  g.set("WORLD_SIZE", "4");
  g.set("OMPI_COMM_WORLD_RANK", "2");
  g.set("OMPI_COMM_WORLD_SIZE", "4");
  read_fails({"contradictory", "RANK=1", "OMPI_COMM_WORLD_RANK=2"});
  g.set("OMPI_COMM_WORLD_RANK", "1");
  g.set("OMPI_COMM_WORLD_SIZE", "8");
  read_fails({"WORLD_SIZE=4", "OMPI_COMM_WORLD_SIZE=8"});
  g.set("OMPI_COMM_WORLD_SIZE", "4");
  g.set("LOCAL_RANK", "1");
  g.set("OMPI_COMM_WORLD_LOCAL_RANK", "0");
  read_fails({"LOCAL_RANK=1", "OMPI_COMM_WORLD_LOCAL_RANK=0"});
  g.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  CHECK(troupe::read_launch_env().rank == 1);
}

TEST_CASE("make_store: malformed init methods and missing settings") {
  env_guard g;
  auto env = env_of(0, 1);
  auto fails = [&](const std::string& method, std::initializer_list<std::string_view> words,
                   const troupe::launch_env& e) {
    CAPTURE(method);
    check_error([&] { troupe::make_store(method, e, 1s); }, errc::invalid_argument, words);
  };
  fails("nfs://x", {"unknown init method 'nfs://x'"}, env);
  fails("", {"unknown init method ''"}, env);
  fails("env://", {"MASTER_ADDR and MASTER_PORT are not set"}, env);
  env.master_addr = "127.0.0.1";
  fails("env://", {"MASTER_PORT is not set"}, env);
  env.master_addr.clear();
  env.master_port = 29500;
  fails("env://", {"MASTER_ADDR is not set"}, env);
  for (const char* m :
       {"tcp://", "tcp://host", "tcp://:80", "tcp://h:0", "tcp://h:99999", "tcp://h:80x",
        "tcp://h:80/path", "tcp://h:+80", "tcp://[::1]", "tcp://a:b:80"})
    fails(m, {"init method '" + std::string(m) + "'"}, env);
  fails("file://relative/path", {"file://relative/path", "absolute"}, env);
  fails("file://", {"'file://'"}, env);
  fails("tcp://127.0.0.1:29500", {"tcp://127.0.0.1:29500", "TROUPE_JOB_TOKEN"}, env_of(1, 2, ""));
  env.master_addr = "127.0.0.1";
  auto no_token = env;
  no_token.token.clear();
  fails("env://", {"env://", "TROUPE_JOB_TOKEN"}, no_token);
  g.set("TROUPE_STORE_EXTERNAL", "yes");
  fails("env://", {"TROUPE_STORE_EXTERNAL='yes'"}, env);
}

TEST_CASE("make_store: env:// and tcp:// — rank 0 serves, the others connect") {
  env_guard g;
  const auto port = free_port();
  auto e0 = env_of(0, 2);
  e0.master_addr = "127.0.0.1";
  e0.master_port = port;
  auto e1 = e0;
  e1.rank = 1;
  auto s0 = troupe::make_store("env://", e0, 5s);
  auto s1 = troupe::make_store("env://", e1, 5s);
  CHECK(dynamic_cast<troupe::tcp_store*>(s0.get())->port() == port);
  s0->set("hello", "from rank 0");
  CHECK(s1->get_string("hello") == "from rank 0");
  CHECK(s1->timeout() == 5s);
  // Rank 1 learned who serves: rank 0's process (here, this one).
  const auto by = dynamic_cast<troupe::tcp_store*>(s1.get())->served_by();
  CHECK(by.rfind("rank 0 (pid " + std::to_string(::getpid()) + ") on host ", 0) == 0);
  CHECK(dynamic_cast<troupe::tcp_store*>(s0.get())->served_by() == by);

  const std::string method = "tcp://127.0.0.1:" + std::to_string(free_port());
  auto t0 = troupe::make_store(method, env_of(0, 2), 5s);
  auto t1 = troupe::make_store(method, env_of(1, 2), 5s);
  t1->set("k", "v");
  CHECK(t0->get_string("k") == "v");
}

TEST_CASE("make_store: TROUPE_STORE_EXTERNAL=1 — rank 0 connects to troupe-store too") {
  env_guard g;
  g.set("TROUPE_STORE_EXTERNAL", "1");
  {
    troupe::tcp_store_server server("127.0.0.1", 0, "tok", "troupe-store");
    const std::string method = "tcp://127.0.0.1:" + std::to_string(server.port());
    auto s0 = troupe::make_store(method, env_of(0, 1), 5s);
    s0->set("k", "v");
    CHECK(s0->get_string("k") == "v");
    CHECK(dynamic_cast<troupe::tcp_store*>(s0.get())->served_by() == server.served_by());
    CHECK(server.served_by().rfind("troupe-store (pid " + std::to_string(::getpid()) + ")", 0) ==
          0);
  }
  const auto port = std::to_string(free_port());
  check_error([&] { troupe::make_store("tcp://127.0.0.1:" + port, env_of(0, 1), 200ms); },
              errc::store, {"cannot reach store at 127.0.0.1:" + port});
}

TEST_CASE("make_store: file:// makes a file_store") {
  char name[] = "/tmp/troupe_test_launch_XXXXXX";
  int fd = ::mkstemp(name);
  REQUIRE(fd >= 0);
  ::close(fd);
  auto s = troupe::make_store(std::string("file://") + name, env_of(0, 1, ""), 2s);
  auto* fs = dynamic_cast<troupe::file_store*>(s.get());
  REQUIRE(fs != nullptr);
  CHECK(fs->path() == name);
  s->set("k", "v");
  CHECK(s->get_string("k") == "v");
  ::unlink(name);
}

TEST_CASE("init_world: one rank through env://, tcp:// and file://") {
  env_guard g;
  g.set("RANK", "0");
  g.set("WORLD_SIZE", "1");
  g.set("TROUPE_JOB_TOKEN", "world-token");
  g.set("MASTER_ADDR", "127.0.0.1");
  g.set("MASTER_PORT", std::to_string(free_port()));
  char name[] = "/tmp/troupe_test_launch_world_XXXXXX";
  int fd = ::mkstemp(name);
  REQUIRE(fd >= 0);
  ::close(fd);
  for (const std::string& method :
       {std::string("env://"), "tcp://127.0.0.1:" + std::to_string(free_port()),
        std::string("file://") + name}) {
    CAPTURE(method);
    troupe::init_options opts;
    opts.init_method = method;
    opts.timeout = 10s;
    auto w = troupe::init_world(opts);
    REQUIRE(w);
    CHECK(w->rank() == 0);
    CHECK(w->size() == 1);
    CHECK(w->timeout() == 10s);
    CHECK(w->backend_string() == "actor");
    REQUIRE(w->get_store());
    w->get_store()->set("init_world/probe", "1");
    CHECK(w->get_store()->check({"init_world/probe"}));
  }
  ::unlink(name);

  g.set("RANK", "1");
  g.set("WORLD_SIZE", "1");
  check_error([] { troupe::init_world(); }, errc::invalid_argument, {"RANK=1", "WORLD_SIZE=1"});
}

/// An IPv4 address of this host that is not loopback, if it has one.
std::optional<std::string> outward_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::string> out;
  for (auto* i = list; i && !out; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
        !(i->ifa_flags & IFF_LOOPBACK))
      out = troupe::detail::interface_address(i->ifa_name, "test");
  ::freeifaddrs(list);
  return out;
}

TEST_CASE("bind address: TROUPE_BIND_ADDR, TROUPE_SOCKET_IFNAME, configured, route to the store") {
  using troupe::detail::choose_bind_address;
  using troupe::detail::interface_address;
  env_guard g;
  CHECK(interface_address("lo", "t") == "127.0.0.1");
  CHECK(interface_address("no-such-if0,lo", "t") == "127.0.0.1");
  check_error([] { interface_address("no-such-if0", "world"); }, errc::invalid_argument,
              {"world: ", "TROUPE_SOCKET_IFNAME='no-such-if0'", "lo"});
  CHECK(troupe::detail::route_address("127.0.0.1") == std::optional<std::string>("127.0.0.1"));
  CHECK_FALSE(troupe::detail::route_address("no-such-host.invalid"));
  CHECK(troupe::detail::is_loopback("localhost"));
  CHECK(troupe::detail::is_loopback("127.0.1.1"));
  CHECK_FALSE(troupe::detail::is_loopback("10.0.0.1"));

  // Nothing set, or a store on this host's loopback: loopback.
  CHECK(choose_bind_address("", "", "t") == "127.0.0.1");
  CHECK(choose_bind_address("", "127.0.0.1", "t") == "127.0.0.1");
  g.set("MASTER_ADDR", "localhost");
  CHECK(choose_bind_address("", "", "t") == "127.0.0.1");
  // A store elsewhere: the address this host reaches it from.
  if (auto mine = outward_address()) {
    CAPTURE(*mine);
    CHECK(choose_bind_address("", *mine, "t") == *mine);
    g.set("MASTER_ADDR", *mine);
    CHECK(choose_bind_address("", "", "t") == *mine);
  }
  // What the code configures wins over the route; the environment over both.
  CHECK(choose_bind_address("10.1.2.3", "", "t") == "10.1.2.3");
  g.set("TROUPE_SOCKET_IFNAME", "lo");
  CHECK(choose_bind_address("10.1.2.3", "", "t") == "127.0.0.1");
  g.set("TROUPE_BIND_ADDR", "10.9.9.9");
  CHECK(choose_bind_address("10.1.2.3", "", "t") == "10.9.9.9");

  // A wrong interface stops init_world with the variable and its value.
  ::unsetenv("TROUPE_BIND_ADDR");
  g.set("TROUPE_SOCKET_IFNAME", "no-such-if0");
  g.set("RANK", "0");
  g.set("WORLD_SIZE", "1");
  g.set("TROUPE_JOB_TOKEN", "t");
  g.set("MASTER_ADDR", "127.0.0.1");
  g.set("MASTER_PORT", std::to_string(free_port()));
  check_error([] { troupe::init_world(); }, errc::invalid_argument,
              {"init_world: TROUPE_SOCKET_IFNAME='no-such-if0'"});
}

TEST_CASE("run_job: threads of this process, or the launched job's one world") {
  env_guard g;
  // Not launched: n ranks as threads, each told so.
  CHECK_FALSE(troupe::launched_by_launcher());
  std::atomic<int> ranks{0}, launched{0};
  troupe::run_job(3, [&](troupe::world& w, bool l) {
    ++ranks;
    launched += l;
    CHECK(w.size() == 3);
  });
  CHECK(ranks == 3);
  CHECK(launched == 0);
  // A failure on a rank comes back.
  check_error(
      [] {
        troupe::run_job(2, [](troupe::world& w, bool) {
          if (w.rank() == 1) throw troupe::error(errc::invalid_argument, "rank 1 gave up");
        });
      },
      errc::invalid_argument, {"rank 1 gave up"});
  // Launched (RANK set; any convention): this process's world only.
  for (const char* var : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    CAPTURE(var);
    env_guard one;
    one.set(var, "0");
    CHECK(troupe::launched_by_launcher());
  }
  g.set("RANK", "0");
  g.set("WORLD_SIZE", "1");
  char name[] = "/tmp/troupe_test_run_job_XXXXXX";
  int fd = ::mkstemp(name);
  REQUIRE(fd >= 0);
  ::close(fd);
  troupe::init_options opts;
  opts.init_method = std::string("file://") + name;
  opts.timeout = 10s;
  ranks = 0;
  troupe::run_job(
      5,
      [&](troupe::world& w, bool l) {
        ++ranks;
        launched += l;
        CHECK(w.size() == 1);
      },
      opts);
  CHECK(ranks == 1);
  CHECK(launched == 1);
  ::unlink(name);
}
