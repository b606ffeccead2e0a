#pragma once
/// Prefixing a rank's output: bytes from one of its pipes come in arbitrary
/// pieces and go out as whole lines, each starting with "[RANK] ".

#include <cstddef>
#include <string>
#include <string_view>

namespace troupe_run {

/// Writes all of `data` to `fd`, retrying on EINTR and waiting while the fd
/// is full. Gives up silently when the reader is gone (EPIPE) or on errors.
void write_all(int fd, std::string_view data);

class line_writer {
 public:
  line_writer(std::string prefix, int out_fd) : prefix_(std::move(prefix)), out_fd_(out_fd) {}

  /// Writes every line that `data` completes, in one write; keeps the rest.
  /// A line longer than max_line is written in pieces of max_line.
  void feed(const char* data, std::size_t size);

  /// Writes a partial last line, ending it with a newline.
  void finish();

  static constexpr std::size_t max_line = 64 * 1024;

 private:
  std::string prefix_;
  int out_fd_;
  std::string pending_;
};

}  // namespace troupe_run
