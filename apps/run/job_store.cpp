#include "run/job_store.hpp"

#include <cstdlib>
#include <stdexcept>

#include "troupe/error.hpp"
#include "troupe/tcp_store.hpp"

namespace troupe_run {

store_host choose_store_host(int node_rank) {
  const char* v = std::getenv("TROUPE_STORE_EXTERNAL");
  const std::string value = v != nullptr ? v : "";
  if (value.empty()) return node_rank == 0 ? store_host::launcher : store_host::elsewhere;
  if (value == "1") return store_host::elsewhere;
  if (value == "0") return store_host::rank0;
  throw std::invalid_argument("TROUPE_STORE_EXTERNAL='" + value +
                              "' must be unset (troupe-run serves the job's store), 1 (a store "
                              "you run serves it at --master-addr:--master-port) or 0 (rank 0 "
                              "hosts it)");
}

job_store::job_store(const std::string& bind_address, int port, const std::string& token) {
  try {
    server_ = std::make_unique<troupe::tcp_store_server>(
        bind_address, static_cast<std::uint16_t>(port), token, "troupe-run");
  } catch (const troupe::error& e) {
    throw std::runtime_error(std::string("cannot serve the job's store: ") + e.what());
  }
}

job_store::~job_store() = default;

int job_store::port() const {
  return server_->port();
}

std::size_t job_store::clients() const {
  return server_->clients();
}

}  // namespace troupe_run
