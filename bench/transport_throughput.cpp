// transport_throughput — how fast bytes move between two processes through
// troupe (send/recv of a 64 MiB float32 tensor over shared memory and over
// forced TCP) next to what the machine allows: a single-threaded memcpy and a
// raw TCP stream over loopback, all measured in the same run.
//
//   transport_throughput [--mib 64] [--reps 8]

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "troupe/troupe.hpp"

using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double memcpy_gbps(std::size_t bytes, int reps) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::vector<double> t;
  for (int i = 0; i < reps + 1; ++i) {
    auto s = clock_type::now();
    std::memcpy(b.data(), a.data(), bytes);
    if (i) t.push_back(seconds_since(s));
  }
  return bytes / median(t) / 1e9;
}

/// Parent writes reps × bytes to a child over loopback TCP; the child reads and
/// acknowledges with one byte at the end.
double raw_tcp_gbps(std::size_t bytes, int reps) {
  int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::listen(ls, 1);
  socklen_t len = sizeof(a);
  ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len);
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    std::vector<char> buf(bytes);
    std::size_t want = bytes * static_cast<std::size_t>(reps);
    while (want > 0) {
      auto r = ::recv(fd, buf.data(), std::min(want, buf.size()), 0);
      if (r <= 0) ::_exit(1);
      want -= static_cast<std::size_t>(r);
    }
    char ack = 1;
    ::send(fd, &ack, 1, 0);
    ::_exit(0);
  }
  int fd = ::accept(ls, nullptr, nullptr);
  std::vector<char> buf(bytes, 7);
  auto s = clock_type::now();
  for (int i = 0; i < reps; ++i) {
    std::size_t off = 0;
    while (off < bytes) {
      auto w = ::send(fd, buf.data() + off, bytes - off, 0);
      if (w <= 0) break;
      off += static_cast<std::size_t>(w);
    }
  }
  char ack = 0;
  ::recv(fd, &ack, 1, 0);
  double t = seconds_since(s);
  ::close(fd);
  ::close(ls);
  ::waitpid(pid, nullptr, 0);
  return bytes * static_cast<double>(reps) / t / 1e9;
}

/// Two processes, one rank each: rank 0 sends reps tensors of `bytes` to rank
/// 1, which answers with a one-element tensor once it received them all.
double troupe_gbps(const char* transport, std::size_t bytes, int reps) {
  char path[] = "/tmp/troupe-bench-XXXXXX";
  ::close(::mkstemp(path));
  ::unlink(path);
  int fds[2];
  if (::pipe(fds) != 0) return 0;
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("TROUPE_TRANSPORT", transport, 1);
      ::setenv("TROUPE_JOB_TOKEN", "bench-token-0123456789", 1);
      troupe::world_options o;
      o.store = std::make_shared<troupe::file_store>(path, std::chrono::seconds(30));
      o.rank = rank;
      o.world_size = 2;
      o.timeout = std::chrono::seconds(60);
      troupe::world w{o};
      auto& pg = w.default_group();
      auto t =
          troupe::tensor::zeros({static_cast<std::int64_t>(bytes / 4)}, troupe::dtype::float32);
      auto ack = troupe::tensor::zeros({1}, troupe::dtype::int32);
      pg.barrier().wait();
      if (rank == 0) {
        auto s = clock_type::now();
        for (int i = 0; i < reps; ++i) pg.send(t, 1).wait();
        pg.recv(ack, 1).wait();
        double gbps = bytes * static_cast<double>(reps) / seconds_since(s) / 1e9;
        (void)!::write(fds[1], &gbps, sizeof(gbps));
      } else {
        for (int i = 0; i < reps; ++i) pg.recv(t, 0).wait();
        pg.send(ack, 0).wait();
      }
      pg.barrier().wait();
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  double gbps = 0;
  (void)!::read(fds[0], &gbps, sizeof(gbps));
  for (auto p : pids) ::waitpid(p, nullptr, 0);
  ::unlink(path);
  return gbps;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 64;
  int reps = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--mib")
      mib = std::strtoul(argv[i + 1], nullptr, 10);
    else if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
  }
  const std::size_t bytes = mib << 20;
  const double mem = memcpy_gbps(bytes, reps);
  const double tcp = raw_tcp_gbps(bytes, reps);
  const double shm_path = troupe_gbps("shm", bytes, reps);
  const double tcp_path = troupe_gbps("tcp", bytes, reps);
  std::printf("%-36s %10s %14s\n", "path (2 processes, one host)", "GB/s", "ratio");
  std::printf("%-36s %10.2f %14s\n", "memcpy, one thread", mem, "1.00 x memcpy");
  std::printf("%-36s %10.2f %14s\n", "raw TCP stream, loopback", tcp, "1.00 x raw TCP");
  std::printf("%-36s %10.2f %9.2f x memcpy\n", "troupe send/recv, shared memory", shm_path,
              shm_path / mem);
  std::printf("%-36s %10.2f %9.2f x raw TCP\n", "troupe send/recv, forced TCP", tcp_path,
              tcp_path / tcp);
  std::printf("(%zu MiB messages, %d per measurement)\n", mib, reps);
  return 0;
}
