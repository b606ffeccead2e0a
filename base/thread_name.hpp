// A name for the calling thread (what top -H, ps -L, gdb and
// /proc/PID/task/TID/comm show): troupe's threads say what they do.
#pragma once

#include <sys/prctl.h>

#include <string>

namespace troupe::detail {

/// Names the calling thread; Linux keeps the first 15 characters.
inline void name_this_thread(const std::string& name) {
  ::prctl(PR_SET_NAME, name.substr(0, 15).c_str(), 0, 0, 0);
}

}  // namespace troupe::detail
