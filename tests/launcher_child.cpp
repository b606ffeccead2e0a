// launcher_child — what test_launcher starts under troupe-run. Modes:
//   env            prints RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR
//                  MASTER_PORT and the token's length, hex-ness and hash
//   fail K [stubborn]  rank K exits 3 after 200 ms; the others sleep 30 s
//                  (with "stubborn" they ignore SIGTERM)
//   kill K         rank K raises SIGUSR1 after 200 ms; the others sleep 30 s
//   outlive K kill|fail  rank K raises SIGUSR1 or exits 3 after 100 ms; the
//                  others print "done R" after 600 ms and exit 0 (--keep-going)
//   sleep          prints "ready R", waits for SIGTERM, prints "term R", exits 0
//   lines          prints lines to stdout and stderr, one written in two
//                  pieces, and a last line without newline
//   cpus           prints "CPUS=a,b,..": the CPUs it may run on

#include <sched.h>
#include <signal.h>
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
        "TOKEN_SET=%d TOKEN_LEN=%zu TOKEN_HEX=%d TOKEN_HASH=%016llx\n",
        env("RANK").c_str(), env("WORLD_SIZE").c_str(), env("LOCAL_RANK").c_str(),
        env("LOCAL_WORLD_SIZE").c_str(), env("MASTER_ADDR").c_str(), env("MASTER_PORT").c_str(),
        token != nullptr ? 1 : 0, t.size(), hex ? 1 : 0, static_cast<unsigned long long>(hash));
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
