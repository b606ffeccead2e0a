#include "run/output.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace troupe_run {

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n >= 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else if (errno != EINTR) {
      return;  // EPIPE and the like: the output is gone, the ranks go on
    }
  }
}

void line_writer::feed(const char* data, std::size_t size) {
  pending_.append(data, size);
  std::string out;
  std::size_t start = 0;
  while (true) {
    std::size_t nl = pending_.find('\n', start);
    if (nl == std::string::npos) {
      if (pending_.size() - start < max_line) break;
      nl = start + max_line;  // an overlong line: write a piece of it as a line
      out += prefix_;
      out.append(pending_, start, max_line);
      out += '\n';
      start = nl;
      continue;
    }
    out += prefix_;
    out.append(pending_, start, nl + 1 - start);
    start = nl + 1;
  }
  pending_.erase(0, start);
  if (!out.empty()) write_all(out_fd_, out);
}

void line_writer::finish() {
  if (pending_.empty()) return;
  std::string out = prefix_ + pending_ + '\n';
  pending_.clear();
  write_all(out_fd_, out);
}

}  // namespace troupe_run
