// sealed_memfd (sealed_memfd.hpp).

#include "memory/sealed_memfd.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace troupe::detail {

int sealed_memfd(const std::string& name, std::size_t bytes) {
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

sealed_mapping map_sealed_memfd(const std::string& name, std::size_t bytes) {
  const int fd = sealed_memfd(name, bytes);
  if (fd < 0) return {};
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return {};
  }
  return {fd, p};
}

int open_sealed_memfd(int pid, int fd, std::size_t min_bytes, const std::string& name,
                      std::size_t* bytes, std::string* why) {
  if (pid <= 0 || fd < 0) {
    *why = "no descriptor " + std::to_string(fd) + " of process " + std::to_string(pid);
    return -1;
  }
  const auto path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  if (!name.empty()) {
    // The name tells this memfd from the process's other descriptors (a
    // stale or wrong number must not map some other buffer).
    char link[512];
    const auto n = ::readlink(path.c_str(), link, sizeof link - 1);
    const std::string want = "/memfd:" + name + " (deleted)";
    if (n < 0) {
      *why = "cannot open " + path + ": " + std::strerror(errno);
      return -1;
    }
    if (std::string(link, static_cast<std::size_t>(n)) != want) {
      *why = path + " is not the memfd '" + name + "'";
      return -1;
    }
  }
  const int out = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (out < 0) {
    *why = "cannot open " + path + ": " + std::strerror(errno);
    return -1;
  }
  // Only a memfd that can never shrink below the size seen is safe to map
  // (pages past a file's end fault).
  struct stat st {};
  const int seals = ::fcntl(out, F_GET_SEALS);
  if (::fstat(out, &st) != 0 || seals < 0 || (seals & F_SEAL_SHRINK) == 0 ||
      static_cast<std::size_t>(st.st_size) < min_bytes) {
    ::close(out);
    *why = path + " is not a sealed memfd of at least " + std::to_string(min_bytes) + " bytes";
    return -1;
  }
  *bytes = static_cast<std::size_t>(st.st_size);
  return out;
}

std::string memfd_locator(const std::string& name, int fd) {
  return name + "@" + std::to_string(::getpid()) + ":" + std::to_string(fd);
}

bool parse_memfd_locator(const std::string& text, std::string* name, int* pid, int* fd) {
  const auto at = text.rfind('@');
  const auto colon = text.rfind(':');
  if (at == std::string::npos || colon == std::string::npos || colon < at) return false;
  auto number = [](const std::string& digits, int* out) {
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      return false;
    *out = std::stoi(digits);
    return true;
  };
  *name = text.substr(0, at);
  return !name->empty() && number(text.substr(at + 1, colon - at - 1), pid) &&
         number(text.substr(colon + 1), fd);
}

}  // namespace troupe::detail
