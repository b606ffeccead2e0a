// troupe-store: runs a job's TCP store on its own, for jobs started with
// TROUPE_STORE_EXTERNAL=1 (no rank hosts the store).
//
//   TROUPE_JOB_TOKEN=secret troupe-store --port P [--host ADDR]
//
// Serves on ADDR:PORT (loopback unless --host says otherwise; port 0 picks a
// free one) until SIGINT or SIGTERM. Requests without the job's token are
// refused and logged.
#include <signal.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "troupe/error.hpp"
#include "troupe/tcp_store.hpp"

namespace {

constexpr const char* usage =
    "usage: TROUPE_JOB_TOKEN=<secret> troupe-store --port PORT [--host ADDR]\n"
    "  --port PORT  TCP port to serve on (0 picks a free port)\n"
    "  --host ADDR  address to bind (default 127.0.0.1; 0.0.0.0 serves every interface)\n"
    "Runs until SIGINT or SIGTERM.\n";

int fail(const std::string& message) {
  std::fprintf(stderr, "troupe-store: %s\n%s", message.c_str(), usage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1";
  long port = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(usage, stdout);
      return 0;
    }
    if ((arg == "--port" || arg == "--host") && i + 1 >= argc) return fail(arg + " needs a value");
    if (arg == "--host") {
      host = argv[++i];
      if (host.empty()) return fail("--host must not be empty");
    } else if (arg == "--port") {
      const std::string text = argv[++i];
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
      if (text.empty() || ec != std::errc() || end != text.data() + text.size() || port < 0 ||
          port > 65535)
        return fail("--port '" + text + "' is not a port number (0..65535)");
    } else {
      return fail("unknown argument '" + arg + "'");
    }
  }
  if (port < 0) return fail("--port is required");
  const char* token = std::getenv("TROUPE_JOB_TOKEN");
  if (!token || !*token)
    return fail(
        "TROUPE_JOB_TOKEN is not set; set it to the job's secret (the same in every "
        "process of the job) so that only the job's processes can use the store");

  // Block the stop signals before any thread starts, then wait for one of them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  try {
    troupe::tcp_store_server server(host, static_cast<std::uint16_t>(port), token, "troupe-store");
    std::printf("troupe-store listening on %s:%u\n", host.c_str(), unsigned{server.port()});
    std::fflush(stdout);
    int sig = 0;
    sigwait(&stop, &sig);
    std::fprintf(stderr,
                 "troupe-store: %s received, %llu refused connection(s), %llu refused request(s); "
                 "stopping\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM",
                 static_cast<unsigned long long>(server.refused_connections()),
                 static_cast<unsigned long long>(server.refused_requests()));
  } catch (const troupe::error& e) {
    std::fprintf(stderr, "troupe-store: %s\n", e.what());
    return 1;
  }
  return 0;
}
