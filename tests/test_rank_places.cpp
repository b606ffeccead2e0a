// rank_places: the table every rank reads from the entries the ranks wrote
// to the store as they joined ("identity host pid route cpus").

#include <doctest/doctest.h>

#include "check_error.hpp"
#include "transport/data_plane.hpp"
#include "transport/rank_places.hpp"

using namespace troupe;
using namespace troupe::detail;

namespace {

std::vector<bytes> entries(const std::vector<std::string>& texts) {
  std::vector<bytes> out;
  for (const auto& t : texts) out.push_back(to_bytes(t));
  return out;
}

}  // namespace

TEST_CASE("rank places: processes, hosts, pids, routes and CPUs as written") {
  const auto t = read_rank_places(entries({"p1 host a 11 inline 4", "p2 b 12 inline 1",
                                           "p1 host a 11 inline 4", "p3 b 13 inline 1"}),
                                  "p2");
  REQUIRE(t.processes.size() == 3);
  CHECK(t.here == 1);
  CHECK(t.of(2).host == "host a");  // a name with a space
  CHECK(t.of(0).pid == 11);
  CHECK(t.of(0).ranks == 2);
  CHECK(t.of(0).cpus == 4);
  CHECK(t.of(1).route == "inline");
  CHECK(t.local(1));
  CHECK_FALSE(t.local(0));
  // Host "host a": 2 ranks on 4 CPUs; host b: 2 ranks (a process each) on 1.
  const auto s = data_plane::sharing_of(t);
  CHECK(s.hosts == 2);
  CHECK(s.ranks_per_cpu == 2);
}

TEST_CASE("rank places: CPUs not said or not a number count as unknown") {
  const auto t = read_rank_places(entries({"p1 a 11 inline x", "p2 b 12 inline -3"}), "p1");
  CHECK(t.of(0).cpus == 0);
  CHECK(t.of(1).cpus <= 0);
  CHECK(data_plane::sharing_of(t).ranks_per_cpu == 1);
}

TEST_CASE("rank places: a malformed entry is named") {
  test::check_error(
      [] {
        read_rank_places(entries({"p1 a 11 inline 2", "garbage"}), "p1");
      },
      errc::backend, {"rank 1", "malformed", "'garbage"});
  test::check_error([] { read_rank_places(entries({"p1 2"}), "p1"); }, errc::backend,
                    {"rank 0", "malformed"});
}
