// launcher_child — what test_launcher starts under troupe-run. Modes:
//   env            prints RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR
//                  MASTER_PORT STORE_EXTERNAL and the token's length, hex-ness
//                  and hash
//   store          presents the token to the store at MASTER_ADDR:MASTER_PORT
//                  and prints "STORE_EXTERNAL=.. ACK=.." (ACK: the store's
//                  answer, "refused" when nothing listens) and "served by WHO"
//   pause MS       sleeps MS milliseconds, prints "done R" and exits 0
//   fail K [stubborn]  rank K exits 3 after 200 ms; the others sleep 30 s
//                  (with "stubborn" they ignore SIGTERM)
//   kill K         rank K raises SIGUSR1 after 200 ms; the others sleep 30 s
//   outlive K kill|fail  rank K raises SIGUSR1 or exits 3 after 100 ms; the
//                  others print "done R" after 600 ms and exit 0 (--keep-going)
//   freeze K       rank K stops itself (SIGSTOP) after 100 ms; the others exit 3
//                  after 1 s
//   sleep          prints "ready R", waits for SIGTERM, prints "term R", exits 0
//   lines          prints lines to stdout and stderr, one written in two
//                  pieces, and a last line without newline
//   cpus           prints "CPUS=a,b,..": the CPUs it may run on

#include <netdb.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

using namespace std::chrono_literals;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "unset";
}

int rank() {
  const char* v = std::getenv("RANK");
  return v != nullptr ? std::atoi(v) : -1;
}

volatile sig_atomic_t terminated = 0;
void on_term(int) {
  terminated = 1;
}

void sleep_long() {
  for (int i = 0; i < 300; ++i) std::this_thread::sleep_for(100ms);
}

/// Reads exactly n bytes (SO_RCVTIMEO bounds the wait); false when it cannot.
bool read_exactly(int fd, void* data, std::size_t n) {
  auto* p = static_cast<char*>(data);
  for (std::size_t got = 0; got < n;) {
    const ssize_t k = ::recv(fd, p + got, n - got, 0);
    if (k <= 0) return false;
    got += static_cast<std::size_t>(k);
  }
  return true;
}

/// The store handshake (transport/handshake.hpp) by hand: "TROUPES2", the
/// token's length (big-endian u32), the token; then the answer and who serves.
int talk_to_store() {
  const std::string token = env("TROUPE_JOB_TOKEN");
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(env("MASTER_ADDR").c_str(), env("MASTER_PORT").c_str(), &hints, &found) != 0)
    return 1;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const bool connected = ::connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  ::freeaddrinfo(found);
  std::string ack = "refused", served_by;
  if (connected) {
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string preamble = "TROUPES2";
    const auto n = static_cast<std::uint32_t>(token.size());
    for (int shift : {24, 16, 8, 0}) preamble.push_back(static_cast<char>((n >> shift) & 0xff));
    preamble += token;
    unsigned char answer = 0, len = 0;
    ack = "none";
    if (::send(fd, preamble.data(), preamble.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(preamble.size()) &&
        read_exactly(fd, &answer, 1)) {
      ack = std::to_string(answer);
      if (answer == 1 && read_exactly(fd, &len, 1)) {
        served_by.resize(len);
        if (!read_exactly(fd, served_by.data(), len)) served_by.clear();
      }
    }
  }
  ::close(fd);
  std::printf("STORE_EXTERNAL=%s ACK=%s\nserved by %s\n", env("TROUPE_STORE_EXTERNAL").c_str(),
              ack.c_str(), served_by.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "env") {
    const char* token = std::getenv("TROUPE_JOB_TOKEN");
    std::string t = token != nullptr ? token : "";
    bool hex = !t.empty() && t.find_first_not_of("0123456789abcdef") == std::string::npos;
    std::uint64_t hash = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : t) hash = (hash ^ c) * 1099511628211ull;
    std::printf(
        "RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s MASTER_ADDR=%s MASTER_PORT=%s "
        "STORE_EXTERNAL=%s TOKEN_SET=%d TOKEN_LEN=%zu TOKEN_HEX=%d TOKEN_HASH=%016llx\n",
        env("RANK").c_str(), env("WORLD_SIZE").c_str(), env("LOCAL_RANK").c_str(),
        env("LOCAL_WORLD_SIZE").c_str(), env("MASTER_ADDR").c_str(), env("MASTER_PORT").c_str(),
        env("TROUPE_STORE_EXTERNAL").c_str(), token != nullptr ? 1 : 0, t.size(), hex ? 1 : 0,
        static_cast<unsigned long long>(hash));
    return 0;
  }
  if (mode == "store") return talk_to_store();
  if (mode == "pause" && argc > 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(argv[2])));
    std::printf("done %d\n", rank());
    return 0;
  }
  if ((mode == "fail" || mode == "kill") && argc > 2) {
    if (argc > 3 && std::strcmp(argv[3], "stubborn") == 0) ::signal(SIGTERM, SIG_IGN);
    std::printf("waiting %d\n", rank());
    std::fflush(stdout);
    if (rank() == std::atoi(argv[2])) {
      std::this_thread::sleep_for(200ms);
      std::fprintf(stderr, "failing %d\n", rank());
      if (mode == "kill") ::raise(SIGUSR1);
      return 3;
    }
    sleep_long();
    return 0;
  }
  if (mode == "freeze" && argc > 2) {
    // Rank K stops itself (SIGSTOP); the others fail after 1 s, as their
    // calls would, and exit 3. SIGTERM ends rank K once it is continued.
    if (rank() == std::atoi(argv[2])) {
      std::this_thread::sleep_for(100ms);
      ::raise(SIGSTOP);
      sleep_long();
      return 0;
    }
    std::this_thread::sleep_for(1s);
    return 3;
  }
  if (mode == "outlive" && argc > 3) {
    if (rank() == std::atoi(argv[2])) {
      std::this_thread::sleep_for(100ms);
      if (std::strcmp(argv[3], "kill") == 0) ::raise(SIGUSR1);
      return 3;
    }
    std::this_thread::sleep_for(600ms);
    std::printf("done %d\n", rank());
    return 0;
  }
  if (mode == "sleep") {
    struct sigaction sa {};
    sa.sa_handler = on_term;
    ::sigaction(SIGTERM, &sa, nullptr);
    std::printf("ready %d\n", rank());
    std::fflush(stdout);
    for (int i = 0; i < 3000 && terminated == 0; ++i) std::this_thread::sleep_for(10ms);
    if (terminated == 0) return 1;
    std::printf("term %d\n", rank());
    return 0;
  }
  if (mode == "lines") {
    std::printf("line one\nline two\n");
    std::fflush(stdout);
    std::fprintf(stderr, "err one\n");
    std::printf("ab");
    std::fflush(stdout);
    std::this_thread::sleep_for(50ms);
    std::printf("cd\npartial");
    std::fflush(stdout);
    return 0;
  }
  if (mode == "cpus") {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
    std::string list;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) list += (list.empty() ? "" : ",") + std::to_string(c);
    std::printf("CPUS=%s\n", list.c_str());
    return 0;
  }
  std::fprintf(stderr, "launcher_child: unknown mode '%s'\n", mode.c_str());
  return 64;
}
