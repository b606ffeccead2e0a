#pragma once
// scoped_env — sets (or unsets, with nullptr) an environment variable for
// one scope and gives it back its old value (or none) after.

#include <cstdlib>
#include <optional>
#include <string>

#include "../base/engine_setting.hpp"

namespace troupe::test {

class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~scoped_env() {
    if (saved_)
      ::setenv(name_.c_str(), saved_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  std::string name_;
  std::optional<std::string> saved_;
};

/// For a scope about the inline engines (testing::simulate, the inline
/// engine itself): where the environment sends collectives to the group
/// actors (TROUPE_ENGINE=actors, TROUPE_FABRIC=off), the scope runs on the
/// inline engine instead; any other route stays as the environment says.
class inline_engine_env {
 public:
  inline_engine_env() {
    try {
      if (detail::read_engine_setting() == detail::engine_setting::actors)
        set_.emplace("TROUPE_ENGINE", "inline");
    } catch (...) {  // a malformed setting: the cases report its error
    }
  }

 private:
  std::optional<scoped_env> set_;
};

}  // namespace troupe::test
