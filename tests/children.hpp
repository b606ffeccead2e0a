#pragma once
// Helpers of the tests that fork ranks into child processes.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace troupe::test {

/// A fresh path under /tmp for a file_store (the file itself does not exist yet).
inline std::string temp_store_path() {
  char buf[] = "/tmp/troupe-store-XXXXXX";
  ::close(::mkstemp(buf));
  ::unlink(buf);
  return buf;
}

/// Waits for every child; its exit code, or 128 + signal when it was killed.
inline std::vector<int> wait_for_children(const std::vector<pid_t>& pids) {
  std::vector<int> codes;
  for (auto pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

/// The state letter of process `pid` (/proc/PID/stat: R, S, T for stopped,
/// Z for ended and not yet waited for...), or 0 when it cannot be read.
inline char process_state(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return 0;
  char line[512] = {};
  const bool read = std::fgets(line, sizeof(line), f) != nullptr;
  std::fclose(f);
  const char* close = read ? std::strrchr(line, ')') : nullptr;
  return close && close[1] == ' ' ? close[2] : 0;
}

/// "0 0 1 0": each child's code, for a failed check's message.
inline std::string codes_text(const std::vector<int>& codes) {
  std::string text;
  for (int c : codes) text += (text.empty() ? "" : " ") + std::to_string(c);
  return text;
}

}  // namespace troupe::test
