#pragma once
// Helpers of the tests that fork ranks into child processes.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
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

/// "0 0 1 0": each child's code, for a failed check's message.
inline std::string codes_text(const std::vector<int>& codes) {
  std::string text;
  for (int c : codes) text += (text.empty() ? "" : " ") + std::to_string(c);
  return text;
}

}  // namespace troupe::test
