// Environment settings: TROUPE_DEBUG (get_debug_level) and LOCAL_RANK
// (node_local_rank), as c10d's TORCH_DISTRIBUTED_DEBUG and local rank.

#include <doctest/doctest.h>
#include "check_error.hpp"

#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "troupe/debug.hpp"
#include "troupe/error.hpp"

using namespace troupe;
using troupe::test::check_error;

namespace {

/// Sets (or unsets) an environment variable for one scope, then restores it.
class scoped_env {
 public:
  scoped_env(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    set(value);
  }
  ~scoped_env() { set(old_); }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  void set(const std::optional<std::string>& v) {
    if (v)
      ::setenv(name_, v->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

// -- TROUPE_DEBUG ----------------------------------------------------------------------------

TEST_CASE("TROUPE_DEBUG unset means OFF") {
  scoped_env env{"TROUPE_DEBUG", std::nullopt};
  CHECK(get_debug_level() == debug_level::off);
}

TEST_CASE("TROUPE_DEBUG empty means OFF") {
  scoped_env env{"TROUPE_DEBUG", ""};
  CHECK(get_debug_level() == debug_level::off);
}

TEST_CASE("TROUPE_DEBUG=off") {
  scoped_env env{"TROUPE_DEBUG", "off"};
  CHECK(get_debug_level() == debug_level::off);
}

TEST_CASE("TROUPE_DEBUG=Info, in any letter case") {
  for (const char* v : {"Info", "INFO", "info"}) {
    CAPTURE(v);
    scoped_env env{"TROUPE_DEBUG", v};
    CHECK(get_debug_level() == debug_level::info);
  }
}

TEST_CASE("TROUPE_DEBUG=DETAIL") {
  for (const char* v : {"DETAIL", "detail", "Detail"}) {
    CAPTURE(v);
    scoped_env env{"TROUPE_DEBUG", v};
    CHECK(get_debug_level() == debug_level::detail);
  }
}

TEST_CASE("an invalid TROUPE_DEBUG names the variable, its value and the accepted values") {
  for (const char* v : {"verbose", "2", " info", "INFO "}) {
    CAPTURE(v);
    scoped_env env{"TROUPE_DEBUG", v};
    check_error([] { (void)get_debug_level(); }, errc::invalid_argument,
                {"TROUPE_DEBUG", "'" + std::string(v) + "'", "OFF, INFO and DETAIL"});
  }
}

TEST_CASE("debug levels print as c10d spells them") {
  CHECK(std::string(to_string(debug_level::off)) == "OFF");
  CHECK(std::string(to_string(debug_level::info)) == "INFO");
  CHECK(std::string(to_string(debug_level::detail)) == "DETAIL");
}

// -- LOCAL_RANK --------------------------------------------------------------------------------

TEST_CASE("node_local_rank reads LOCAL_RANK") {
  scoped_env env{"LOCAL_RANK", "3"};
  CHECK(node_local_rank() == 3);
  CHECK(node_local_rank(7) == 3);  // the variable wins over the fallback
}

TEST_CASE("node_local_rank accepts zero") {
  scoped_env env{"LOCAL_RANK", "0"};
  CHECK(node_local_rank() == 0);
}

TEST_CASE("node_local_rank uses the fallback when LOCAL_RANK is unset") {
  scoped_env env{"LOCAL_RANK", std::nullopt};
  CHECK(node_local_rank(5) == 5);
  CHECK(node_local_rank(0) == 0);
}

TEST_CASE("node_local_rank without LOCAL_RANK or fallback names LOCAL_RANK") {
  scoped_env env{"LOCAL_RANK", std::nullopt};
  check_error([] { (void)node_local_rank(); }, errc::invalid_argument,
              {"node_local_rank", "LOCAL_RANK", "not set"});
}

TEST_CASE("node_local_rank rejects a LOCAL_RANK that is not a non-negative integer") {
  for (const char* v : {"abc", "-1", "2x", "", "1.5", "99999999999999999999"}) {
    CAPTURE(v);
    scoped_env env{"LOCAL_RANK", v};
    check_error([] { (void)node_local_rank(4); }, errc::invalid_argument,
                {"LOCAL_RANK='" + std::string(v) + "'", "non-negative integer"});
  }
}

TEST_CASE("scoped_env restores the previous value") {
  scoped_env outer{"LOCAL_RANK", "9"};
  {
    scoped_env inner{"LOCAL_RANK", "1"};
    CHECK(node_local_rank() == 1);
  }
  CHECK(node_local_rank() == 9);
}
