// The congestion control of the data plane's connections
// (TROUPE_TCP_CONGESTION): within a host "auto" gives them reno, "system"
// leaves the kernel's default, a name sets that one, and a value the kernel
// refuses is an error naming it before the world joins anyone.

#include <doctest/doctest.h>
#include "check_error.hpp"
#include "scoped_env.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "../transport/tcp_stream.hpp"
#include "troupe/error.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using troupe::test::check_error;
using troupe::test::scoped_env;
using namespace std::chrono_literals;

namespace {

/// Both ends of a TCP connection on loopback.
struct loopback_pair {
  loopback_pair() {
    const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(ls, 1) == 0);
    REQUIRE(::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    server = ::accept(ls, nullptr, nullptr);
    REQUIRE(server >= 0);
    ::close(ls);
  }
  ~loopback_pair() {
    ::close(client);
    ::close(server);
  }
  int client = -1, server = -1;
};

std::string congestion_of(int fd) {
  char name[32] = {};
  socklen_t len = sizeof name;
  REQUIRE(::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) == 0);
  return name;
}

std::string system_default() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string cc;
  std::getline(in, cc);
  return cc;
}

}  // namespace

TEST_CASE("a connection within the host is told apart") {
  loopback_pair p;
  CHECK(detail::tcp_within_host(p.client));
  CHECK(detail::tcp_within_host(p.server));
  const int unconnected = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK_FALSE(detail::tcp_within_host(unconnected));
  ::close(unconnected);
}

TEST_CASE("auto gives a connection within the host reno; system leaves the default") {
  const auto initial = system_default();
  {
    loopback_pair p;
    detail::tcp_choose_congestion(p.client, "system");
    CHECK(congestion_of(p.client) == initial);
    detail::tcp_choose_congestion(p.client, "auto");
    CHECK(congestion_of(p.client) == "reno");
    CHECK(congestion_of(p.server) == initial);  // the other end is its own
  }
  {
    loopback_pair p;
    detail::tcp_choose_congestion(p.client, "reno");  // a name: set as is
    CHECK(congestion_of(p.client) == "reno");
  }
}

TEST_CASE("a congestion control the kernel refuses is an error naming it") {
  CHECK_NOTHROW(detail::tcp_check_congestion("auto"));
  CHECK_NOTHROW(detail::tcp_check_congestion("system"));
  CHECK_NOTHROW(detail::tcp_check_congestion("reno"));  // built in, allowed to everyone
  check_error([] { detail::tcp_check_congestion("no_such_cc"); }, errc::invalid_argument,
              {"TROUPE_TCP_CONGESTION", "'no_such_cc'", "refuses", "allowed:"});
  check_error([] { detail::tcp_check_congestion("bad name"); }, errc::invalid_argument,
              {"TROUPE_TCP_CONGESTION", "'bad name'", "not auto, system"});
  check_error([] { detail::tcp_check_congestion("a_name_too_long_"); }, errc::invalid_argument,
              {"'a_name_too_long_'", "at most 15"});
  check_error([] { detail::tcp_check_congestion(""); }, errc::invalid_argument,
              {"TROUPE_TCP_CONGESTION", "''"});
  loopback_pair p;
  check_error([&] { detail::tcp_choose_congestion(p.client, "no_such_cc"); },
              errc::invalid_argument, {"'no_such_cc'", "refuses"});
}

TEST_CASE("a world with a bad TROUPE_TCP_CONGESTION fails before it joins anyone") {
  // A store nobody else uses, a world of 2: a rank that joined would wait
  // for its peer; this one fails at once.
  auto s = std::make_shared<hash_store>(1s);
  world_options o;
  o.store = s;
  o.rank = 0;
  o.world_size = 2;
  o.timeout = 10s;
  {
    scoped_env c{"TROUPE_TCP_CONGESTION", "no_such_cc"};
    check_error([&] { world w{o}; }, errc::invalid_argument,
                {"world", "TROUPE_TCP_CONGESTION 'no_such_cc'", "refuses"});
  }
  {
    scoped_env c{"TROUPE_TCP_CONGESTION", "bad name"};
    check_error([&] { world w{o}; }, errc::invalid_argument,
                {"world", "TROUPE_TCP_CONGESTION 'bad name'"});
  }
  CHECK(s->num_keys() == 0);  // nothing was written: nobody joined
}
