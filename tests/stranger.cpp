// stranger — a process without the job's token that attacks ports of a job,
// for test_strangers_start. It never sends a token.
//
//   stranger hold N PORT...   holds N idle connections to 127.0.0.1, spread
//                             over the ports, and reopens at once every one
//                             the server closes (retrying while nothing listens)
//   stranger nibble N PORT... the same, but each connection sends one byte at
//                             once (a handshake's first): the kernel hands it
//                             over to the server, which must then make room
//   stranger flood PORT...    opens connections as fast as 2 threads can,
//                             sends junk on every other one and resets it
//
// Prints "ready" once the attack is in force (hold: every connection opened;
// flood: 200 connections made), and on SIGTERM or SIGINT
// "stranger: C connections opened, D closed by the server" before it exits 0.

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

std::atomic<bool> stop{false};
std::atomic<long> opened{0}, dropped{0};

void on_stop(int) {
  stop = true;
}

/// A connection to 127.0.0.1:port, or -1 (nothing listens, or no room).
int open_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  ++opened;
  return fd;
}

void say_ready() {
  std::printf("ready\n");
  std::fflush(stdout);
}

/// N idle connections, each reopened as soon as the server closes it; with
/// `nibble` each sends one byte first.
void hold(int n, const std::vector<int>& ports, bool nibble) {
  std::vector<pollfd> conns(static_cast<std::size_t>(n), pollfd{-1, POLLIN, 0});
  bool ready = false;
  while (!stop) {
    int open = 0;
    for (std::size_t i = 0; i < conns.size() && !stop; ++i) {
      if (conns[i].fd < 0) {
        conns[i].fd = open_to(ports[i % ports.size()]);
        if (nibble && conns[i].fd >= 0) ::send(conns[i].fd, "T", 1, MSG_NOSIGNAL);
      }
      open += conns[i].fd >= 0;
    }
    if (!ready && open == n) {
      say_ready();
      ready = true;
    }
    if (open < n) std::this_thread::sleep_for(10ms);  // nothing listens yet, or no room
    if (::poll(conns.data(), conns.size(), 20) <= 0) continue;
    for (auto& c : conns) {
      if (c.fd < 0 || c.revents == 0) continue;
      char buf[256];
      if (::recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT) > 0) continue;  // the server answered
      ::close(c.fd);
      c.fd = -1;
      ++dropped;
    }
  }
  for (auto& c : conns)
    if (c.fd >= 0) ::close(c.fd);
}

/// Connections opened and reset as fast as two threads can.
void flood(const std::vector<int>& ports) {
  std::vector<std::thread> threads;
  std::atomic<bool> ready{false};
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      for (long i = 0; !stop; ++i) {
        const int fd = open_to(ports[static_cast<std::size_t>(i) % ports.size()]);
        if (fd < 0) {
          std::this_thread::sleep_for(1ms);
          continue;
        }
        if ((i + t) % 2) ::send(fd, "GET / HTTP/1.0\r\n\r\n", 18, MSG_NOSIGNAL);
        linger reset{1, 0};  // no TIME_WAIT: the ports are not used up
        ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
        ::close(fd);
        if (opened >= 200 && !ready.exchange(true)) say_ready();
      }
    });
  for (auto& t : threads) t.join();
}

int usage() {
  std::fprintf(stderr,
               "usage: stranger hold N PORT... | stranger nibble N PORT... | stranger flood "
               "PORT...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::string mode = argv[1];
  const bool holds = mode == "hold" || mode == "nibble";
  const int first_port = holds ? 3 : 2;
  if ((!holds && mode != "flood") || argc <= first_port) return usage();
  std::vector<int> ports;
  for (int i = first_port; i < argc; ++i) ports.push_back(std::atoi(argv[i]));
  // As many descriptors as this user may have: a stranger is not shy.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  if (holds)
    hold(std::atoi(argv[2]), ports, mode == "nibble");
  else
    flood(ports);
  std::printf("stranger: %ld connections opened, %ld closed by the server\n", opened.load(),
              dropped.load());
  return 0;
}
