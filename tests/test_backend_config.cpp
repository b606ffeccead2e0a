// Backend strings ("gloo", "cpu:gloo,cuda:nccl"): how backend_config expands
// and checks them, as c10d's Backend config does.

#include <doctest/doctest.h>
#include "check_error.hpp"

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/backend.hpp"
#include "troupe/error.hpp"

using namespace troupe;
using troupe::test::check_error;

namespace {

void check_bad_config(const std::string& spec, std::string_view why) {
  CAPTURE(spec);
  check_error([&] { backend_config c{spec}; }, errc::invalid_argument, {"'" + spec + "'", why});
}

/// Registers `name` once for `devices` (the default: cpu and cuda); what
/// backend_config expands a name to depends on that alone (its creator is
/// never called here).
void register_dummy(const std::string& name,
                    std::vector<device_type> devices = {device_type::cpu, device_type::cuda}) {
  if (is_backend_available(name)) return;
  register_backend(
      name, [](const backend_context&) -> std::shared_ptr<backend> { return nullptr; },
      std::move(devices));
}

}  // namespace

// -- backend strings ------------------------------------------------------------------------

TEST_CASE("backend_config: a single name expands to every device it registered") {
  backend_config c{"actor"};
  CHECK(c.to_string() == "cpu:actor,cuda:actor");
  REQUIRE(c.entries().size() == 2);
  CHECK(c.backend_for(device_type::cpu) == "actor");
  CHECK(c.backend_for(device_type::cuda) == "actor");
}

TEST_CASE("backend_config: a per-device string is kept as given") {
  backend_config c{"cpu:actor,cuda:nccl"};
  CHECK(c.to_string() == "cpu:actor,cuda:nccl");
  CHECK(c.backend_for(device_type::cpu) == "actor");
  CHECK(c.backend_for(device_type::cuda) == "nccl");
  backend_config only_cpu{"cpu:actor"};
  CHECK(only_cpu.to_string() == "cpu:actor");
  CHECK(only_cpu.backend_for(device_type::cuda).empty());
}

TEST_CASE("backend_config: a single name registered for cpu only has no cuda entry") {
  register_dummy("dummy_cpu_only", {device_type::cpu});
  backend_config c{"dummy_cpu_only"};
  CHECK(c.to_string() == "cpu:dummy_cpu_only");
  CHECK(c.backend_for(device_type::cuda).empty());
}

TEST_CASE("backend_config: c10d's test_backend_config table") {
  // A backend registered without devices runs cpu and cuda; names ignore
  // letter case; device:backend pairs are kept as given.
  register_dummy("dummy");
  const std::pair<const char*, const char*> table[] = {
      {"dummy", "cpu:dummy,cuda:dummy"},
      {"DUMMY", "cpu:dummy,cuda:dummy"},
      {"Actor", "cpu:actor,cuda:actor"},
      {"cpu:dummy,cuda:dummy", "cpu:dummy,cuda:dummy"},
      {"cpu:dummy,cuda:nccl", "cpu:dummy,cuda:nccl"},
      {"cpu:gloo,cuda:dummy", "cpu:gloo,cuda:dummy"},
      {"cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl"},
      {"CPU:Gloo,CUDA:NCCL", "cpu:gloo,cuda:nccl"},
  };
  for (auto [spec, expected] : table) {
    CAPTURE(spec);
    CHECK(backend_config{spec}.to_string() == expected);
  }
  check_bad_config("cpu:gloo,cuda:nccl,", "trailing comma");
  check_bad_config("cpu:gloo,cuda:nccl,cpu:dummy", "'cpu' appears twice");
}

TEST_CASE("backend_config rejects a trailing comma") {
  check_bad_config("cpu:actor,", "trailing comma");
  check_bad_config("cpu:actor,cuda:actor,", "trailing comma");
}

TEST_CASE("backend_config rejects a repeated device") {
  check_bad_config("cpu:actor,cpu:actor", "'cpu' appears twice");
  check_bad_config("cuda:actor,cpu:actor,cuda:nccl", "'cuda' appears twice");
}

TEST_CASE("backend_config rejects an unknown device") {
  check_bad_config("tpu:actor", "unknown device 'tpu'");
  check_bad_config("cpu:actor,xla:actor", "unknown device 'xla'");
}

TEST_CASE("backend_config rejects an empty entry") {
  check_bad_config("cpu:actor,,cuda:actor", "empty entry");
  check_bad_config(",cpu:actor", "empty entry");
}

TEST_CASE("backend_config rejects the empty string") {
  check_error([] { backend_config c{""}; }, errc::invalid_argument,
              {"invalid backend string ''", "empty"});
}

TEST_CASE("backend_config rejects other malformed strings") {
  check_bad_config("cpu:", "names no backend");
  check_bad_config("cpu:actor,cuda", "no device prefix");
  check_bad_config("actor,gloo", "device prefixes");
  check_bad_config("no_such_backend", "not registered");
}
