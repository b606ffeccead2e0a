// A name for the calling thread (what top -H, ps -L, gdb and
// /proc/PID/task/TID/comm show): troupe's threads say what they do.
#pragma once

#include <pthread.h>
#include <sys/prctl.h>

#include <string>
#include <thread>

namespace troupe::detail {

/// Names the calling thread; Linux keeps the first 15 characters.
inline void name_this_thread(const std::string& name) {
  ::prctl(PR_SET_NAME, name.substr(0, 15).c_str(), 0, 0, 0);
}

/// Names `t` from the thread that started it: the name shows before `t`
/// first runs (a starved thread may not run for a while).
inline void name_thread(std::thread& t, const std::string& name) {
  ::pthread_setname_np(t.native_handle(), name.substr(0, 15).c_str());
}

}  // namespace troupe::detail
