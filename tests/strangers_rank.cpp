// strangers_rank — a rank of the jobs test_strangers_start starts under
// troupe-run, timing its start while a stranger attacks a port of the job.
//
// Each rank builds its world as init_world does, runs 100 calls
// (allreduces and store round trips, alternating), and prints
//   "world R: built in X ms; 100 calls in Y ms"
// Without STRANGERS_PORT_FILE (the store attacked), every rank waits until
// the file STRANGERS_GO exists (the attack is in force), then builds its
// world; X counts from there. With it (rank 0's data plane attacked), rank
// 1 stops in its world's construction right after reading rank 0's
// data-plane address from the store, writes that port to the file, and
// goes on at STRANGERS_GO, about to connect there; X counts from the go.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "pausing_store.hpp"
#include "troupe/launch.hpp"
#include "troupe/troupe.hpp"

namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

/// Waits (up to 30 s) until `path` exists.
void wait_for_file(const std::string& path) {
  for (auto until = steady::now() + 30s; steady::now() < until;) {
    if (::access(path.c_str(), F_OK) == 0) return;
    std::this_thread::sleep_for(2ms);
  }
  throw std::runtime_error("no go (" + path + ") within 30 s");
}

long ms_since(steady::time_point t) {
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - t).count());
}

}  // namespace

int main() {
  try {
    const auto launch = troupe::read_launch_env();
    const auto port_file = env("STRANGERS_PORT_FILE");
    const auto go = env("STRANGERS_GO");
    auto start = steady::now();
    if (port_file.empty()) {
      wait_for_file(go);
      start = steady::now();
    }
    // As init_world builds it, the store paused on rank 1 when the data plane is attacked.
    troupe::world_options o;
    o.store = troupe::make_store("env://", launch, 60s);
    if (!port_file.empty() && launch.rank == 1)
      o.store = std::make_shared<troupe::test::pausing_store>(
          o.store,
          [](const std::string& key) { return troupe::test::pausing_store::is_address_of(key, 0); },
          [&](const troupe::bytes& address) {
            std::ofstream(port_file + ".tmp")
                << troupe::test::pausing_store::port_of(address) << "\n";
            std::rename((port_file + ".tmp").c_str(), port_file.c_str());
            wait_for_file(go);
            start = steady::now();
          });
    o.rank = launch.rank;
    o.world_size = launch.world_size;
    o.timeout = 60s;
    o.transport = env("TROUPE_TRANSPORT").empty() ? "auto" : env("TROUPE_TRANSPORT");
    o.token = launch.token;
    troupe::world w{o};
    const long built_ms = ms_since(start);
    auto& pg = w.default_group();
    auto& store = *w.get_store();
    pg.barrier().wait();
    start = steady::now();
    for (int i = 0; i < 50; ++i) {
      auto t = troupe::tensor::from_vector<int>({1});
      pg.allreduce(t).wait();
      if (t.to_vector<int>()[0] != w.size()) throw std::runtime_error("allreduce summed wrong");
      const auto key = "strangers/" + std::to_string(w.rank()) + "/" + std::to_string(i);
      store.set(key, std::to_string(i));
      if (store.get_string(key) != std::to_string(i)) throw std::runtime_error("store lost a key");
    }
    const long calls_ms = ms_since(start);
    std::printf("world %d: built in %ld ms; 100 calls in %ld ms\n", w.rank(), built_ms, calls_ms);
    std::fflush(stdout);
    pg.barrier().wait();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strangers_rank: %s\n", e.what());
    return 1;
  }
}
