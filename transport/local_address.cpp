#include "transport/local_address.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>

#include "base/texts.hpp"

namespace troupe::detail {
namespace {

std::string text_of(const sockaddr* a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a->sa_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a)->sin_addr, buf, sizeof buf);
  else if (a->sa_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, buf, sizeof buf);
  return buf;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

std::string interface_address(const std::string& names, const std::string& what) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) throw_invalid(what.c_str(), "cannot list the interfaces");
  std::set<std::string> seen;
  std::string found;
  std::size_t begin = 0;
  while (found.empty() && begin <= names.size()) {
    auto end = names.find(',', begin);
    if (end == std::string::npos) end = names.size();
    const auto name = names.substr(begin, end - begin);
    begin = end + 1;
    std::string v6;
    for (auto* i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr) continue;
      seen.insert(i->ifa_name);
      if (name != i->ifa_name || !(i->ifa_flags & IFF_UP)) continue;
      if (i->ifa_addr->sa_family == AF_INET) {
        found = text_of(i->ifa_addr);
        break;
      }
      // A link-local IPv6 address needs a scope id the store cannot carry.
      if (i->ifa_addr->sa_family == AF_INET6 && v6.empty() &&
          !IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr))
        v6 = text_of(i->ifa_addr);
    }
    if (found.empty()) found = v6;
  }
  ::freeifaddrs(list);
  if (found.empty()) {
    std::string have;
    for (const auto& s : seen) have += (have.empty() ? "" : ", ") + s;
    throw_invalid(what.c_str(), "TROUPE_SOCKET_IFNAME='" + names +
                                    "' names no interface that is up with an address (this "
                                    "host has: " +
                                    have + ")");
  }
  return found;
}

bool is_loopback(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return ::inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

std::optional<std::string> route_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return std::nullopt;
  std::optional<std::string> out;
  for (auto* r = res; r && !out; r = r->ai_next) {
    const int fd = ::socket(r->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // connect() on a datagram socket only picks the route and the source.
    if (::connect(fd, r->ai_addr, r->ai_addrlen) == 0) {
      sockaddr_storage local{};
      socklen_t len = sizeof local;
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0)
        out = text_of(reinterpret_cast<sockaddr*>(&local));
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return out;
}

std::string choose_bind_address(const std::string& configured, const std::string& store_host,
                                const std::string& what) {
  if (auto a = env("TROUPE_BIND_ADDR"); !a.empty()) return a;
  if (auto n = env("TROUPE_SOCKET_IFNAME"); !n.empty()) return interface_address(n, what);
  if (!configured.empty()) return configured;
  const auto host = store_host.empty() ? env("MASTER_ADDR") : store_host;
  if (!host.empty() && !is_loopback(host)) {
    if (auto r = route_address(host); r && !is_loopback(*r)) return *r;
  }
  return "127.0.0.1";
}

}  // namespace troupe::detail
