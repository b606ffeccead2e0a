// Serialization (the CAF inspect convention) and the object collectives:
// broadcast_object, all_gather_object, gather_object and scatter_object.

#include <doctest/doctest.h>
#include "check_error.hpp"

#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/object_collectives.hpp"
#include "troupe/serialize.hpp"
#include "troupe/testing.hpp"
#include "troupe/world.hpp"

using namespace troupe;
using troupe::test::check_error;

namespace {

enum class color : std::uint8_t { red, green, blue };

struct point {
  double x = 0;
  double y = 0;
  std::string label;
  friend bool operator==(const point&, const point&) = default;
};

template <class Inspector>
auto inspect(Inspector& f, point& p) {
  return f(p.x, p.y, p.label);
}

/// A user struct with nested members of every built-in kind.
struct sample {
  std::int32_t id = 0;
  std::string name;
  color hue = color::red;
  std::vector<std::vector<int>> grid;
  std::map<std::string, std::vector<double>> series;
  std::optional<std::string> note;
  std::optional<int> missing;
  std::pair<std::int64_t, bool> flag{0, false};
  std::array<float, 3> xyz{};
  std::vector<point> points;
  std::map<int, std::optional<point>> sparse;
  tensor weights;
};

template <class Inspector>
auto inspect(Inspector& f, sample& s) {
  return f(s.id, s.name, s.hue, s.grid, s.series, s.note, s.missing, s.flag, s.xyz, s.points,
           s.sparse, s.weights);
}

sample make_sample(int seed) {
  sample s;
  s.id = seed;
  s.name = "sample #" + std::to_string(seed);
  s.hue = seed % 2 ? color::blue : color::green;
  s.grid = {{seed}, {}, {1, 2, 3}};
  s.series = {{"loss", {0.5, 0.25 * seed}}, {"acc", {}}};
  s.note = "note " + std::to_string(seed);
  s.flag = {-7LL * seed, true};
  s.xyz = {1.5f, -2.0f, static_cast<float>(seed)};
  s.points = {{1.0, 2.0, "a"}, {3.0, 4.0, std::string(100, 'z')}};
  s.sparse = {{1, point{0.0, 1.0, "p"}}, {5, std::nullopt}};
  s.weights = tensor::from_vector<float>({static_cast<float>(seed), 0.5f, -1.0f});
  return s;
}

void check_same(const sample& a, const sample& b) {
  CHECK(a.id == b.id);
  CHECK(a.name == b.name);
  CHECK(a.hue == b.hue);
  CHECK(a.grid == b.grid);
  CHECK(a.series == b.series);
  CHECK(a.note == b.note);
  CHECK(a.missing == b.missing);
  CHECK(a.flag == b.flag);
  CHECK(a.xyz == b.xyz);
  CHECK(a.points == b.points);
  CHECK(a.sparse == b.sparse);
  REQUIRE(a.weights.defined() == b.weights.defined());
  if (a.weights.defined()) {
    CHECK(a.weights.scalar_type() == b.weights.scalar_type());
    CHECK(a.weights.shape() == b.weights.shape());
    CHECK(a.weights.to_vector<float>() == b.weights.to_vector<float>());
  }
}

const int rank_counts[] = {1, 2, 3, 4, 7};

}  // namespace

// -- serialize / deserialize ------------------------------------------------------------------

TEST_CASE("a user struct with an inspect overload round-trips") {
  auto s = make_sample(3);
  auto bytes = serialize(s);
  CHECK_FALSE(bytes.empty());
  auto back = deserialize<sample>(bytes);
  check_same(s, back);
  CHECK(back.weights.data() != s.weights.data());  // a copy, not a view
}

TEST_CASE("built-in types round-trip") {
  CHECK(deserialize<int>(serialize(-5)) == -5);
  CHECK(deserialize<double>(serialize(2.5)) == 2.5);
  CHECK(deserialize<bool>(serialize(true)));
  CHECK(deserialize<std::string>(serialize(std::string())).empty());
  CHECK(deserialize<std::vector<std::string>>(serialize(std::vector<std::string>{"a", "", "c"})) ==
        std::vector<std::string>{"a", "", "c"});
  auto t = tensor::from_vector<std::int64_t>({1, -2, 3, 4}).view({2, 2});
  auto u = deserialize<tensor>(serialize(t));
  CHECK(u.shape() == shape_t{2, 2});
  CHECK(u.to_vector<std::int64_t>() == std::vector<std::int64_t>{1, -2, 3, 4});
}

TEST_CASE("truncated bytes are rejected") {
  const auto bytes = serialize(make_sample(1));
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    CAPTURE(n);
    std::vector<std::uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    check_error([&] { (void)deserialize<sample>(prefix); }, errc::invalid_argument,
                {"deserialize"});
  }
  std::vector<std::uint8_t> short_by_one(bytes.begin(), bytes.end() - 1);
  check_error([&] { (void)deserialize<sample>(short_by_one); }, errc::invalid_argument,
              {"deserialize", "truncated input"});
}

TEST_CASE("trailing bytes are rejected") {
  auto bytes = serialize(std::string("abc"));
  bytes.push_back(0);
  check_error([&] { (void)deserialize<std::string>(bytes); }, errc::invalid_argument,
              {"deserialize", "more than one value"});
}

TEST_CASE("a length larger than the input is rejected before allocating") {
  auto bytes = serialize(std::vector<int>{1, 2});
  bytes[7] = 0x7f;  // the length's most significant byte (little endian)
  check_error([&] { (void)deserialize<std::vector<int>>(bytes); }, errc::invalid_argument,
              {"deserialize", "exceeds the remaining input"});
}

TEST_CASE("a malformed bool or dtype code is rejected") {
  std::vector<std::uint8_t> two{2};
  check_error([&] { (void)deserialize<bool>(two); }, errc::invalid_argument,
              {"deserialize", "bool"});
  auto bytes = serialize(tensor::from_vector<float>({1.0f}));
  bytes[0] = 200;  // the dtype code
  check_error([&] { (void)deserialize<tensor>(bytes); }, errc::invalid_argument,
              {"deserialize", "unknown dtype code 200"});
}

TEST_CASE("only defined contiguous cpu tensors can be serialized") {
  check_error([] { (void)serialize(tensor{}); }, errc::invalid_argument,
              {"serialize", "undefined tensor"});
  float data[4] = {1, 2, 3, 4};
  auto strided = tensor::from_blob(data, {2, 2}, {1, 2}, dtype::float32);
  check_error([&] { (void)serialize(strided); }, errc::invalid_argument, {"serialize"});
}

// A type with no inspect overload does not compile (a static_assert names the
// requirement), so it cannot be a runtime test:
//
//   struct opaque { int secret; };
//   serialize(opaque{});  // error: troupe: this type cannot be serialized: give it a
//                         // free function `template <class Inspector> auto inspect(...)`

// -- object collectives ------------------------------------------------------------------------

TEST_CASE("broadcast_object from a non-zero root") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& pg = w.default_group();
      const int root = n - 1;
      sample s;
      if (w.rank() == root) s = make_sample(40 + n);
      broadcast_object(pg, s, root);
      check_same(s, make_sample(40 + n));
    });
  }
}

TEST_CASE("all_gather_object returns every rank's object in rank order") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      // Different sizes per rank: the byte counts differ.
      const std::string mine(static_cast<std::size_t>(w.rank() * 3),
                             static_cast<char>('a' + w.rank()));
      auto all = all_gather_object(w.default_group(), mine);
      REQUIRE(all.size() == static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r)
        CHECK(all[static_cast<std::size_t>(r)] ==
              std::string(static_cast<std::size_t>(r * 3), static_cast<char>('a' + r)));
      auto samples = all_gather_object(w.default_group(), make_sample(w.rank()));
      REQUIRE(samples.size() == static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) check_same(samples[static_cast<std::size_t>(r)], make_sample(r));
    });
  }
}

TEST_CASE("gather_object: the root gets every object, the others nothing") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      const int root = n / 2;
      std::map<std::string, int> mine{{"rank", w.rank()}, {"square", w.rank() * w.rank()}};
      auto got = gather_object(w.default_group(), mine, root);
      if (w.rank() != root) {
        CHECK(got.empty());
        return;
      }
      REQUIRE(got.size() == static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) {
        CHECK(got[static_cast<std::size_t>(r)].at("rank") == r);
        CHECK(got[static_cast<std::size_t>(r)].at("square") == r * r);
      }
    });
  }
}

TEST_CASE("scatter_object gives rank r the root's object r") {
  for (int n : rank_counts) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      for (int root : {0, n - 1}) {
        std::vector<sample> objs;
        if (w.rank() == root)
          for (int r = 0; r < n; ++r) objs.push_back(make_sample(100 * root + r));
        auto mine = scatter_object(w.default_group(), objs, root);
        check_same(mine, make_sample(100 * root + w.rank()));
      }
    });
  }
}

TEST_CASE("object collectives work on a subgroup") {
  testing::run_ranks(4, [](world& w) {
    auto g = w.new_group({1, 3});
    if (!g->is_member()) return;
    auto all = all_gather_object(*g, w.rank());
    CHECK(all == std::vector<int>{1, 3});
    std::optional<std::string> v;
    if (g->rank() == 1) v = "from world rank 3";
    broadcast_object(*g, v, 1);
    CHECK(v == std::optional<std::string>("from world rank 3"));
  });
}

TEST_CASE("all_gather_object rejects an object of another type, naming both types") {
  testing::run_ranks(3, [](world& w) {
    auto& pg = w.default_group();
    const std::string int_type = "int";
    const std::string string_type = "std::string";
    if (w.rank() == 1) {
      check_error([&] { (void)all_gather_object(pg, 5); }, errc::mismatch,
                  {"all_gather_object", "rank 0 sent an object of type '" + string_type + "'",
                   "this rank expects '" + int_type + "'"});
    } else {
      check_error([&] { (void)all_gather_object(pg, std::string("text")); }, errc::mismatch,
                  {"all_gather_object", "rank 1 sent an object of type '" + int_type + "'",
                   "this rank expects '" + string_type + "'"});
    }
  });
}

TEST_CASE("type names in object errors read as written, without default arguments") {
  using detail::type_name;
  CHECK(type_name(typeid(std::string)) == "std::string");
  CHECK(type_name(typeid(std::vector<int>)) == "std::vector<int>");
  CHECK(type_name(typeid(std::vector<std::string>)) == "std::vector<std::string>");
  CHECK(type_name(typeid(std::map<std::string, std::vector<double>>)) ==
        "std::map<std::string, std::vector<double>>");
  CHECK(type_name(typeid(std::optional<std::string>)) == "std::optional<std::string>");
}

TEST_CASE("broadcast_object rejects an object of another type") {
  testing::run_ranks(2, [](world& w) {
    auto& pg = w.default_group();
    if (w.rank() == 0) {
      double d = 1.5;
      broadcast_object(pg, d, 0);  // the root's own object unpacks fine
      CHECK(d == 1.5);
    } else {
      float f = 0;
      check_error([&] { broadcast_object(pg, f, 0); }, errc::mismatch,
                  {"broadcast_object", "rank 0 sent an object of type 'double'",
                   "this rank expects 'float'"});
    }
  });
}

TEST_CASE("scatter_object rejects a wrong number of objects on the root") {
  testing::run_ranks(3, [](world& w) {
    if (w.rank() != 0) return;  // the root fails before any communication
    check_error(
        [&] {
          (void)scatter_object(w.default_group(), std::vector<int>{1, 2}, 0);
        },
        errc::invalid_argument,
        {"scatter_object", "the root passed 2 objects for a group of size 3"});
  });
  testing::run_ranks(1, [](world& w) {
    check_error([&] { (void)scatter_object(w.default_group(), std::vector<int>{}, 0); },
                errc::invalid_argument, {"the root passed 0 objects for a group of size 1"});
  });
}

TEST_CASE("a failing root takes the waiting ranks down through run_ranks") {
  // The non-roots wait in scatter_object; run_ranks aborts them and reports the root.
  try {
    testing::run_ranks(3, [](world& w) {
      std::vector<int> objs;
      if (w.rank() == 0) objs = {1};
      (void)scatter_object(w.default_group(), objs, 0);
    });
    FAIL_CHECK("run_ranks did not fail");
  } catch (const error& e) {
    const std::string what = e.what();
    CHECK(std::string(to_string(e.code())) == to_string(errc::invalid_argument));
    CHECK_MESSAGE(
        what.find("rank 0: scatter_object: the root passed 1 objects") != std::string::npos, what);
  }
}
