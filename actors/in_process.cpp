#include "actors/in_process.hpp"

#include <condition_variable>
#include <mutex>
#include <unordered_map>

namespace troupe::detail {
namespace {

struct directory_state {
  std::mutex mtx;
  std::condition_variable cv;
  std::unordered_map<std::string, group_actor> entries;
};

directory_state& state() {
  static directory_state s;
  return s;
}

}  // namespace

in_process_directory& in_process_directory::instance() {
  static in_process_directory d;
  return d;
}

void in_process_directory::put(const std::string& key, const group_actor& actor) {
  auto& s = state();
  {
    std::lock_guard<std::mutex> g{s.mtx};
    s.entries[key] = actor;
  }
  s.cv.notify_all();
}

void in_process_directory::erase(const std::string& key) {
  auto& s = state();
  std::lock_guard<std::mutex> g{s.mtx};
  s.entries.erase(key);
}

group_actor in_process_directory::find(const std::string& key, std::chrono::milliseconds timeout) {
  auto& s = state();
  std::unique_lock<std::mutex> g{s.mtx};
  group_actor found;
  s.cv.wait_for(g, timeout, [&] {
    auto i = s.entries.find(key);
    if (i == s.entries.end()) return false;
    found = i->second;
    return true;
  });
  return found;
}

void in_process_transport::send(int peer, envelope env) {
  caf::anon_send(peers_[static_cast<std::size_t>(peer)], data_atom::value, std::move(env));
}

void in_process_transport::send(int peer, p2p_envelope env) {
  caf::anon_send(peers_[static_cast<std::size_t>(peer)], msg_atom::value, std::move(env));
}

std::string in_process_transport::describe_peer(int peer) const {
  return "rank " + std::to_string(peer) + " (world rank " +
         std::to_string(global_ranks_[static_cast<std::size_t>(peer)]) + ")";
}

std::vector<caf::actor_addr> in_process_transport::watch_list() const {
  std::vector<caf::actor_addr> r;
  for (auto& p : peers_) r.push_back(p.address());
  return r;
}

}  // namespace troupe::detail
