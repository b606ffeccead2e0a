#include "run/job.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace troupe_run {

std::string make_token() {
  std::array<unsigned char, 16> bytes{};
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(std::string("cannot open /dev/urandom: ") + strerror(errno));
  std::size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      ::close(fd);
      throw std::runtime_error(std::string("cannot read /dev/urandom: ") + strerror(err));
    }
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  static constexpr char digits[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += digits[b >> 4];
    token += digits[b & 0xf];
  }
  return token;
}

int pick_free_port(const std::string& addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(addr.c_str(), "0", &hints, &found); rc != 0) {
    throw std::runtime_error("cannot resolve --master-addr '" + addr + "': " + gai_strerror(rc));
  }
  std::string why = "no address";
  int port = 0;
  for (addrinfo* a = found; a != nullptr && port == 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = strerror(errno);
      continue;
    }
    // Keep the port bound (SO_REUSEADDR, never listening) while the job runs:
    // rank 0 (TROUPE_STORE_EXTERNAL=0) can still bind and listen on it, but no
    // other bind(0) on this host — another troupe-run starting at the same
    // time — is handed it.
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
      if (bound.ss_family == AF_INET) {
        port = ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      } else if (bound.ss_family == AF_INET6) {
        port = ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
      }
    } else {
      why = strerror(errno);
    }
    if (port == 0) ::close(fd);  // else: held open until troupe-run exits
  }
  ::freeaddrinfo(found);
  if (port == 0) {
    throw std::runtime_error("cannot bind a free port on --master-addr '" + addr + "': " + why +
                             " (pass --master-port)");
  }
  return port;
}

std::optional<std::string> launched_by_scheduler() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}) {
    if (const char* value = std::getenv(name); value != nullptr) {
      return std::string(name) + "=" + value;
    }
  }
  return std::nullopt;
}

std::vector<std::string> rank_environment(const job& j, int local_rank) {
  const std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(global_rank(j, local_rank))},
      {"WORLD_SIZE", std::to_string(j.nproc * j.nnodes)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(j.nproc)},
      {"MASTER_ADDR", j.master_addr},
      {"MASTER_PORT", std::to_string(j.master_port)},
      {"TROUPE_JOB_TOKEN", j.token},
      {"TROUPE_STORE_EXTERNAL", j.store_external},
  };
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [ours_name, value] : ours) replaced = replaced || name == ours_name;
    if (!replaced) env.push_back(std::move(entry));
  }
  for (const auto& [name, value] : ours) env.push_back(name + "=" + value);
  return env;
}

std::vector<int> rank_cpus(const std::string& bind, int nproc) {
  std::vector<int> cpus(static_cast<std::size_t>(nproc), -1);
  if (bind == "none") return cpus;
  std::vector<int> usable;
#ifdef __linux__
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) usable.push_back(c);
#endif
  if (usable.empty()) return cpus;
  for (int i = 0; i < nproc; ++i)
    cpus[static_cast<std::size_t>(i)] = usable[static_cast<std::size_t>(i) % usable.size()];
  return cpus;
}

}  // namespace troupe_run
