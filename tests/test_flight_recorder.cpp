// The flight recorder: what each rank's record holds, the dump after a
// timeout (which rank had which sequence number in flight), and the Chrome
// trace JSON (parsed back here).

#include <doctest/doctest.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../base/flight_ring.hpp"
#include "check_error.hpp"
#include "make_worlds.hpp"
#include "troupe/testing.hpp"
#include "troupe/troupe.hpp"

using namespace troupe;
using troupe::test::check_error;
using namespace std::chrono_literals;

namespace {

using troupe::test::make_worlds;

// A small JSON reader: enough to check that the trace is well-formed and to
// pull out its events (objects of strings, numbers, nested objects, arrays).
struct json {
  enum kind { null, number, string, array, object } k = null;
  double num = 0;
  std::string str;
  std::vector<json> items;
  std::vector<std::pair<std::string, json>> fields;
  const json* get(const std::string& key) const {
    for (auto& [k2, v] : fields)
      if (k2 == key) return &v;
    return nullptr;
  }
};

struct json_parser {
  const std::string& s;
  std::size_t i = 0;
  void ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  void expect(char c) {
    ws();
    if (i >= s.size() || s[i] != c)
      throw std::runtime_error("JSON: expected '" + std::string(1, c) + "' at " +
                               std::to_string(i));
    ++i;
  }
  std::string string_value() {
    expect('"');
    std::string out;
    while (i < s.size() && s[i] != '"') {
      if (s[i] == '\\') {
        ++i;
        if (i >= s.size()) break;
        if (s[i] == 'u') {
          out += '?';
          i += 4;
        } else {
          out += s[i];
        }
      } else {
        if (static_cast<unsigned char>(s[i]) < 0x20) throw std::runtime_error("JSON: control char");
        out += s[i];
      }
      ++i;
    }
    expect('"');
    return out;
  }
  json value() {
    ws();
    json v;
    if (i >= s.size()) throw std::runtime_error("JSON: unexpected end");
    if (s[i] == '{') {
      v.k = json::object;
      ++i;
      ws();
      if (s[i] == '}') return ++i, v;
      for (;;) {
        auto key = string_value();
        expect(':');
        v.fields.emplace_back(key, value());
        ws();
        if (s[i] == ',') {
          ++i;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (s[i] == '[') {
      v.k = json::array;
      ++i;
      ws();
      if (s[i] == ']') return ++i, v;
      for (;;) {
        v.items.push_back(value());
        ws();
        if (s[i] == ',') {
          ++i;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (s[i] == '"') {
      v.k = json::string;
      v.str = string_value();
      return v;
    }
    std::size_t used = 0;
    v.num = std::stod(s.substr(i, 32), &used);
    if (used == 0) throw std::runtime_error("JSON: bad value at " + std::to_string(i));
    v.k = json::number;
    i += used;
    return v;
  }
  json parse() {
    auto v = value();
    ws();
    if (i != s.size()) throw std::runtime_error("JSON: trailing text at " + std::to_string(i));
    return v;
  }
};

}  // namespace

TEST_CASE("each rank records its calls: op, sequence number, sizes, peer, state") {
  for (int n : {1, 2, 3, 4, 7}) {
    CAPTURE(n);
    testing::run_ranks(n, [n](world& w) {
      auto& g = w.default_group();
      auto x = tensor::from_vector<float>({1, 2, 3, 4});
      g.allreduce(x).wait();
      g.broadcast(x, {.root_rank = 0}).wait();
      if (n > 1) {
        auto y = tensor::from_vector<std::int64_t>({7});
        if (w.rank() == 0) g.send(y, 1, {}).wait();
        if (w.rank() == 1) g.recv(y, 0, {}).wait();
      }
      g.barrier().wait();
      const auto rec = w.flight_record();
      const std::size_t expect = n > 1 && w.rank() < 2 ? 4 : 3;
      REQUIRE(rec.size() == expect);
      CHECK(rec[0].op == "allreduce");
      CHECK(rec[0].seq == 1);
      CHECK(rec[0].numel == 4);
      CHECK(rec[0].bytes == 16);
      CHECK(rec[0].dtype == "float32");
      CHECK(rec[0].group == "default");
      CHECK(rec[0].rank == w.rank());
      CHECK(rec[0].group_size == n);
      CHECK(rec[1].op == "broadcast");
      CHECK(rec[1].seq == 2);
      if (expect == 4) {
        CHECK(rec[2].op == (w.rank() == 0 ? "send" : "recv"));
        CHECK(rec[2].peer == 1 - w.rank());
        CHECK(rec[2].dtype == "int64");
      }
      CHECK(rec.back().op == "barrier");
      for (auto& e : rec) {
        CHECK(e.state == "completed");
        CHECK(e.ended_us >= e.issued_us);
        CHECK(e.error.empty());
      }
      // In issue order, and the table names every call.
      for (std::size_t i = 1; i < rec.size(); ++i) CHECK(rec[i].issued_us >= rec[i - 1].issued_us);
      const auto table = format_flight_record(rec);
      CHECK(table.find("seq 1 allreduce 4 x float32 (16 B)") != std::string::npos);
      CHECK(table.find("completed") != std::string::npos);
    });
  }
}

TEST_CASE("a batch is recorded as one call: its ops' tensors in all, the first one's dtype") {
  testing::run_ranks(2, [](world& w) {
    auto& g = w.default_group();
    auto mine = tensor::from_vector<std::int32_t>({1, 2, 3});
    auto theirs = tensor::zeros({4}, dtype::int32);
    const int other = 1 - w.rank();
    std::vector<p2p_op> ops{{p2p_op::isend, mine, other, 5},
                            {p2p_op::irecv, theirs.flat_slice(0, 3), other, 5}};
    g.batch_isend_irecv(ops).wait();
    const auto rec = w.flight_record();
    REQUIRE(rec.size() == 1);
    CHECK(rec[0].op == "batch_isend_irecv");
    CHECK(rec[0].numel == 6);
    CHECK(rec[0].bytes == 24);
    CHECK(rec[0].dtype == "int32");
    CHECK(rec[0].tensors == 2);
    CHECK(rec[0].peer == -1);
    CHECK(rec[0].state == "completed");
  });
}

TEST_CASE("a timeout dumps the record: which rank had which sequence number in flight") {
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() / ("troupe-flight-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ::setenv("TROUPE_FLIGHT_RECORDER_DUMP", dir.c_str(), 1);
  {
    auto ws = make_worlds(3);
    // Every rank finishes seq 1; ranks 0 and 1 issue seq 2, rank 2 never does.
    std::vector<std::thread> ts;
    for (int r = 0; r < 3; ++r)
      ts.emplace_back([&, r] {
        auto x = tensor::from_vector<float>({1.0f});
        ws[static_cast<std::size_t>(r)]->default_group().allreduce(x).wait();
      });
    for (auto& t : ts) t.join();
    ts.clear();
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        auto x = tensor::from_vector<float>({1.0f});
        check_error(
            [&] {
              ws[static_cast<std::size_t>(r)]
                  ->default_group()
                  .allreduce(tensor_list{x}, {.timeout = 300ms})
                  .wait();
            },
            errc::timeout, {"allreduce", "Timed out after 300 ms", "rank 2"});
      });
    for (auto& t : ts) t.join();
    // The records say it too, rank by rank.
    for (int r = 0; r < 3; ++r) {
      const auto rec = ws[static_cast<std::size_t>(r)]->flight_record();
      REQUIRE(rec.size() == (r < 2 ? 2u : 1u));
      CHECK(rec[0].state == "completed");
      if (r < 2) {
        CHECK(rec[1].seq == 2);
        CHECK(rec[1].state == "failed");
        CHECK(rec[1].error.find("Timed out after 300 ms") != std::string::npos);
      }
    }
  }
  ::unsetenv("TROUPE_FLIGHT_RECORDER_DUMP");
  for (int r = 0; r < 2; ++r) {
    std::ifstream f(dir / ("default-rank" + std::to_string(r) + ".txt"));
    REQUIRE(f.good());
    std::stringstream text;
    text << f.rdbuf();
    const auto s = text.str();
    CHECK(s.find("flight record of group 'default' rank " + std::to_string(r)) !=
          std::string::npos);
    CHECK(s.find("seq 1 allreduce") != std::string::npos);
    CHECK(s.find("seq 2 allreduce") != std::string::npos);
    CHECK(s.find("failed (") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(dir / "default-rank2.txt"));  // rank 2 had nothing fail
  fs::remove_all(dir);
}

TEST_CASE("the Chrome trace of 4 ranks parses, one track per rank, one slice per call") {
  // Worlds of this process (also when a launcher started it: the trace needs
  // every rank's record here).
  std::vector<std::vector<flight_entry>> per_rank(4);
  auto ws = make_worlds(4);
  std::vector<std::thread> ts;
  for (int r = 0; r < 4; ++r)
    ts.emplace_back([&, r] {
      auto& w = *ws[static_cast<std::size_t>(r)];
      auto& g = w.default_group();
      for (int i = 0; i < 3; ++i) {
        auto x = tensor::from_vector<float>({float(i)});
        g.allreduce(x).wait();
      }
      auto sub = w.new_group({0, 1});
      if (sub && sub->is_member()) {
        auto y = tensor::from_vector<double>({1.0, 2.0});
        sub->allreduce(y).wait();
      }
      g.barrier().wait();
      per_rank[static_cast<std::size_t>(r)] = w.flight_record();
    });
  for (auto& t : ts) t.join();
  // A group name with a quote and a backslash stays valid JSON.
  per_rank[0].push_back(per_rank[0].back());
  per_rank[0].back().group = "odd \"name\" \\ here";
  per_rank[0].back().ended_us = 0;  // in flight: runs to the trace's end
  const auto text = chrome_trace_json(per_rank);
  json doc;
  REQUIRE_NOTHROW(doc = json_parser{text}.parse());
  REQUIRE(doc.k == json::object);
  const auto* events = doc.get("traceEvents");
  REQUIRE(events);
  REQUIRE(events->k == json::array);
  int slices[4] = {0, 0, 0, 0}, names = 0;
  for (auto& e : events->items) {
    REQUIRE(e.k == json::object);
    const auto* ph = e.get("ph");
    const auto* pid = e.get("pid");
    REQUIRE(ph);
    REQUIRE(pid);
    const int r = static_cast<int>(pid->num);
    REQUIRE(r >= 0);
    REQUIRE(r < 4);
    if (ph->str == "M") {
      ++names;
      continue;
    }
    CHECK(ph->str == "X");
    ++slices[r];
    CHECK(e.get("ts")->num >= 0);
    CHECK(e.get("dur")->num >= 0);
    const auto* args = e.get("args");
    REQUIRE(args);
    CHECK(args->get("seq")->num >= 1);
    CHECK(!args->get("state")->str.empty());
  }
  CHECK(names == 4);
  CHECK(slices[0] == 3 + 1 + 1 + 1);  // 3 allreduces, the subgroup's, the barrier, the copy
  CHECK(slices[1] == 5);
  CHECK(slices[2] == 4);
  CHECK(slices[3] == 4);
  // And to a file.
  const auto path = std::filesystem::temp_directory_path() /
                    ("troupe-trace-" + std::to_string(::getpid()) + ".json");
  write_chrome_trace(path.string(), per_rank);
  std::ifstream f(path);
  std::stringstream back;
  back << f.rdbuf();
  CHECK(back.str() == text);
  std::filesystem::remove(path);
  check_error([&] { write_chrome_trace("/nonexistent-dir/x/trace.json", per_rank); },
              errc::invalid_argument, {"write_chrome_trace", "/nonexistent-dir/x/trace.json"});
}

TEST_CASE("enable_collectives_timing records where the recorder is off") {
  testing::run_ranks(2, [](world& w) {
    auto& g = w.default_group();
    g.enable_collectives_timing();
    g.enable_collectives_timing();  // idempotent
    auto x = tensor::from_vector<float>({1.0f});
    g.allreduce(x).wait();
    const auto rec = g.flight_record();
    REQUIRE(!rec.empty());
    CHECK(rec.back().op == "allreduce");
    CHECK(rec.back().state == "completed");
  });
}

TEST_CASE("the ring keeps the last calls, oldest first, once it wrapped") {
  auto ring = std::make_shared<detail::flight_ring>("g", 1, 4, 3);
  CHECK(ring->entries().empty());
  for (int i = 1; i <= 5; ++i) {
    const auto id =
        ring->record("allreduce", static_cast<std::uint64_t>(i), i, 4u * i, dtype::float32, 1, -1);
    if (i != 5) ring->ended(id, nullptr);
  }
  const auto rec = ring->entries();
  REQUIRE(rec.size() == 3);
  CHECK(rec[0].seq == 3);
  CHECK(rec[1].seq == 4);
  CHECK(rec[2].seq == 5);
  CHECK(rec[0].state == "completed");
  CHECK(rec[2].state == "in flight");
  CHECK(rec[2].ended_us == 0);
  CHECK(rec[2].numel == 5);
  CHECK(rec[2].group == "g");
  CHECK(rec[2].rank == 1);
  CHECK(rec[2].group_size == 4);
  CHECK(format_flight_record(rec).find("* group 'g' rank 1/4 seq 5 allreduce") !=
        std::string::npos);
}

TEST_CASE("calls that end late, after the ring wrapped, end in their own slots") {
  auto ring = std::make_shared<detail::flight_ring>("g", 0, 2, 3);
  std::vector<std::uint64_t> ids;
  for (int i = 1; i <= 5; ++i)
    ids.push_back(
        ring->record("allreduce", static_cast<std::uint64_t>(i), i, 4u * i, dtype::float32, 1, -1));
  // Out of order, the newest first; 1 and 2 left the ring (their ends change nothing).
  ring->ended(ids[4], nullptr);
  ring->ended(ids[2], std::make_exception_ptr(error(errc::internal, "seq 3 failed")));
  ring->ended(ids[0], nullptr);
  ring->ended(ids[1], nullptr);
  auto rec = ring->entries();
  REQUIRE(rec.size() == 3);
  CHECK(rec[0].seq == 3);
  CHECK(rec[0].state == "failed");
  CHECK(rec[0].error.find("seq 3 failed") != std::string::npos);
  CHECK(rec[1].seq == 4);
  CHECK(rec[1].state == "in flight");
  CHECK(rec[2].seq == 5);
  CHECK(rec[2].state == "completed");
  // Growing (not full yet): a call ends in its own slot too.
  auto young = std::make_shared<detail::flight_ring>("g", 0, 2, 8);
  const auto a = young->record("barrier", 1, 0, 0, dtype::float32, 0, -1);
  const auto b = young->record("barrier", 2, 0, 0, dtype::float32, 0, -1);
  young->ended(a, nullptr);
  rec = young->entries();
  REQUIRE(rec.size() == 2);
  CHECK(rec[0].state == "completed");
  CHECK(rec[1].state == "in flight");
  young->ended(b, nullptr);
  CHECK(young->entries()[1].state == "completed");
}
