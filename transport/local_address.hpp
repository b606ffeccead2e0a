#pragma once
// Which local address a rank's data plane listens on and publishes to its
// peers. Several hosts need an address the others can reach; one host needs
// nothing (loopback). The choice, first that applies:
//   TROUPE_BIND_ADDR       an address, as given;
//   TROUPE_SOCKET_IFNAME   the address of that interface (as GLOO_SOCKET_IFNAME
//                          and NCCL_SOCKET_IFNAME; a comma-separated list takes
//                          the first interface that exists and has one);
//   the configured address world_options::bind_address, when not empty;
//   the store's host       (MASTER_ADDR when the caller knows none) when it is
//                          not a loopback address: the local address the kernel
//                          routes to it from, so that the ranks of a job on many
//                          hosts find each other with only MASTER_ADDR set;
//   127.0.0.1              nothing is reachable from elsewhere.

#include <optional>
#include <string>

namespace troupe::detail {

/// The IPv4 address of interface `name` (its IPv6 address when it has no
/// IPv4 one). Throws errc::invalid_argument naming `what`, the interface and
/// the interfaces that exist when it has none.
std::string interface_address(const std::string& names, const std::string& what);

/// The local address a datagram to `host` would leave from (nothing is sent);
/// nullopt when `host` does not resolve or is not reachable.
std::optional<std::string> route_address(const std::string& host);

/// True for localhost and addresses of the loopback ranges.
bool is_loopback(const std::string& host);

/// The address to listen on, by the order above. `store_host` is where the
/// job's store is reached (empty: unknown). Errors name `what`.
std::string choose_bind_address(const std::string& configured, const std::string& store_host,
                                const std::string& what);

}  // namespace troupe::detail
