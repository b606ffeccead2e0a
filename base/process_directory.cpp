#include "base/process_directory.hpp"

#include <condition_variable>
#include <mutex>
#include <unordered_map>

namespace troupe::detail {
namespace {

struct entries {
  std::mutex mtx;
  std::condition_variable cv;
  std::unordered_map<std::string, std::any> map;
};

entries& the_entries() {
  static entries e;
  return e;
}

}  // namespace

process_directory& process_directory::instance() {
  static process_directory d;
  return d;
}

void process_directory::put(const std::string& key, std::any value) {
  auto& e = the_entries();
  {
    std::lock_guard<std::mutex> g{e.mtx};
    e.map[key] = std::move(value);
  }
  e.cv.notify_all();
}

void process_directory::erase(const std::string& key,
                              const std::function<bool(const std::any&)>& only_if) {
  auto& e = the_entries();
  std::lock_guard<std::mutex> g{e.mtx};
  auto i = e.map.find(key);
  if (i != e.map.end() && (!only_if || only_if(i->second))) e.map.erase(i);
}

std::any process_directory::find(const std::string& key) {
  auto& e = the_entries();
  std::lock_guard<std::mutex> g{e.mtx};
  auto i = e.map.find(key);
  return i == e.map.end() ? std::any{} : i->second;
}

std::any process_directory::wait_for(const std::string& key, std::chrono::milliseconds timeout) {
  auto& e = the_entries();
  std::unique_lock<std::mutex> g{e.mtx};
  std::any found;
  e.cv.wait_for(g, timeout, [&] {
    auto i = e.map.find(key);
    if (i == e.map.end()) return false;
    found = i->second;
    return true;
  });
  return found;
}

}  // namespace troupe::detail
