// flight_ring (flight_ring.hpp) and the public formatting of flight records
// (include/troupe/flight_recorder.hpp): the table and the Chrome trace JSON.

#include "base/flight_ring.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "troupe/error.hpp"

namespace troupe {
namespace detail {

namespace {

std::int64_t micros(std::chrono::nanoseconds d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

}  // namespace

std::size_t flight_ring::default_capacity() {
  static const std::size_t n = [] {
    const char* v = std::getenv("TROUPE_FLIGHT_RECORDER");
    if (!v || !*v) return std::size_t{2000};
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*end != '\0' || x < 0) {
      std::fprintf(stderr,
                   "[troupe] TROUPE_FLIGHT_RECORDER='%s' is not a number of calls; keeping 2000\n",
                   v);
      return std::size_t{2000};
    }
    return static_cast<std::size_t>(x);
  }();
  return n;
}

flight_ring::flight_ring(std::string group, int rank, int size, std::size_t capacity)
    : group_(std::move(group)),
      rank_(rank),
      size_(size),
      wall_minus_steady_us_(micros(std::chrono::system_clock::now().time_since_epoch()) -
                            micros(std::chrono::steady_clock::now().time_since_epoch())),
      capacity_(std::max<std::size_t>(capacity, 1)) {}

std::int64_t flight_ring::wall_us(std::chrono::steady_clock::time_point t) const {
  if (t == std::chrono::steady_clock::time_point{}) t = std::chrono::steady_clock::now();
  return micros(t.time_since_epoch()) + wall_minus_steady_us_;
}

std::uint64_t flight_ring::record(const char* op, std::uint64_t seq, std::int64_t numel,
                                  std::uint64_t bytes, dtype type, int tensors, int peer,
                                  std::chrono::steady_clock::time_point issued, bool completed) {
  const auto at = wall_us(issued);
  std::lock_guard<spin_lock> g{mtx_};
  // The ring grows as calls come (a rank of a 1024-rank simulation that made
  // a few calls keeps a few slots, not 2000).
  if (slots_.size() < capacity_) slots_.emplace_back();
  auto& s = slots_[at_];
  s.id = ++next_;
  at_ = at_ + 1 == capacity_ ? 0 : at_ + 1;
  s.op = op;
  s.seq = seq;
  s.numel = numel;
  s.bytes = bytes;
  s.type = type;
  s.tensors = tensors;
  s.peer = peer;
  s.issued_us = at;
  s.ended_us = completed ? at : 0;
  s.state = completed ? 1 : 0;
  s.error.clear();
  // The next call's slot, for writing: a ring of 2000 calls (about 220 KiB)
  // has left the caches by the time it comes round, and a store to a
  // cold slot would be most of record()'s time in a small call.
  if (slots_.size() == capacity_) __builtin_prefetch(&slots_[at_], 1);
  return s.id;
}

void flight_ring::ended(std::uint64_t id, const std::exception_ptr& err,
                        std::chrono::steady_clock::time_point when) {
  const auto at = wall_us(when);
  std::string why;
  bool dump = false;
  if (err) {
    try {
      std::rethrow_exception(err);
    } catch (const error& e) {
      why = e.what();
      dump =
          e.code() == errc::timeout || e.code() == errc::mismatch || e.code() == errc::peer_failure;
    } catch (const std::exception& e) {
      why = e.what();
    } catch (...) {
      why = "an unknown exception";
    }
  }
  {
    std::lock_guard<spin_lock> g{mtx_};
    // Call id lies `back` slots behind the next one's (else the ring moved
    // on past it).
    const auto back = next_ - id + 1;
    auto* s = back <= slots_.size() ? &slots_[at_ >= back ? at_ - back : at_ + capacity_ - back]
                                    : nullptr;
    if (s && s->id == id) {
      s->ended_us = at;
      s->state = err ? 2 : 1;
      if (err) {  // a success keeps the text record() cleared
        s->error = std::move(why);
        why = s->error;
      }
    }
  }
  if (dump) dump_once(why);
}

std::vector<flight_entry> flight_ring::entries() const {
  std::vector<flight_entry> out;
  std::lock_guard<spin_lock> g{mtx_};
  const auto n = std::min<std::uint64_t>(next_, slots_.size());
  for (std::uint64_t i = next_ - n; i < next_; ++i) {
    const auto& s = slots_[i % capacity_];
    flight_entry e;
    e.id = s.id;
    e.group = group_;
    e.rank = rank_;
    e.group_size = size_;
    e.op = s.op;
    e.seq = s.seq;
    e.numel = s.numel;
    e.bytes = s.bytes;
    e.dtype = s.tensors ? std::string(to_string(s.type)) : std::string();
    e.tensors = s.tensors;
    e.peer = s.peer;
    e.issued_us = s.issued_us;
    e.state = s.state == 0 ? "in flight" : s.state == 1 ? "completed" : "failed";
    e.ended_us = s.ended_us;
    e.error = s.error;
    out.push_back(std::move(e));
  }
  return out;
}

void flight_ring::dump_once(const std::string& why) {
  if (dumped_.exchange(true)) return;
  const auto text = "[troupe] flight record of group '" + group_ + "' rank " +
                    std::to_string(rank_) + " after: " + why + "\n" +
                    format_flight_record(entries());
  const char* dir = std::getenv("TROUPE_FLIGHT_RECORDER_DUMP");
  if (dir && *dir) {
    const auto path = std::string(dir) + "/" + group_ + "-rank" + std::to_string(rank_) + ".txt";
    std::ofstream f(path);
    if (f << text) return;
    std::fprintf(stderr, "[troupe] cannot write the flight record to '%s'\n", path.c_str());
  }
  std::fputs(text.c_str(), stderr);
}

}  // namespace detail

namespace {

std::string fmt_bytes(std::uint64_t b) {
  char buf[32];
  if (b >= (1u << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1u << 20));
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

/// JSON string contents (quotes, backslashes and control characters escaped).
std::string json_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string format_flight_record(const std::vector<flight_entry>& entries) {
  std::ostringstream os;
  if (entries.empty()) return "  (no calls recorded)\n";
  const auto t0 = entries.front().issued_us;
  for (const auto& e : entries) {
    os << "  " << (e.state == "in flight" ? "* " : "  ") << "group '" << e.group << "' rank "
       << e.rank << "/" << e.group_size << " seq " << e.seq << " " << e.op;
    if (e.tensors) os << " " << e.numel << " x " << e.dtype << " (" << fmt_bytes(e.bytes) << ")";
    if (e.peer >= 0) os << " peer " << e.peer;
    os << " issued +" << (e.issued_us - t0) << " us";
    if (e.ended_us) os << ", took " << (e.ended_us - e.issued_us) << " us";
    os << ": " << e.state;
    if (!e.error.empty()) os << " (" << e.error << ")";
    os << "\n";
  }
  return os.str();
}

std::string chrome_trace_json(const std::vector<std::vector<flight_entry>>& per_rank) {
  std::int64_t t0 = INT64_MAX, last = 0;
  for (const auto& r : per_rank)
    for (const auto& e : r) {
      t0 = std::min(t0, e.issued_us);
      last = std::max({last, e.issued_us, e.ended_us});
    }
  std::ostringstream os;
  os << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
  bool first = true;
  auto sep = [&] {
    if (!first) os << ",";
    first = false;
  };
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    sep();
    os << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << r << ",\"args\":{\"name\":\"rank "
       << r << "\"}}";
    for (const auto& e : per_rank[r]) {
      sep();
      // In flight: the slice runs to the end of the trace.
      const auto end = e.ended_us ? e.ended_us : last;
      os << "{\"name\":\"" << json_escape(e.op) << "\",\"cat\":\"" << json_escape(e.group)
         << "\",\"ph\":\"X\",\"pid\":" << r << ",\"tid\":0,\"ts\":" << (e.issued_us - t0)
         << ",\"dur\":" << std::max<std::int64_t>(end - e.issued_us, 0)
         << ",\"args\":{\"seq\":" << e.seq << ",\"group\":\"" << json_escape(e.group)
         << "\",\"group_rank\":" << e.rank << ",\"numel\":" << e.numel << ",\"bytes\":" << e.bytes
         << ",\"dtype\":\"" << json_escape(e.dtype) << "\",\"peer\":" << e.peer << ",\"state\":\""
         << json_escape(e.state) << "\",\"error\":\"" << json_escape(e.error) << "\"}}";
    }
  }
  os << "]}\n";
  return os.str();
}

void write_chrome_trace(const std::string& path,
                        const std::vector<std::vector<flight_entry>>& per_rank) {
  std::ofstream f(path);
  if (!(f << chrome_trace_json(per_rank)))
    throw error(errc::invalid_argument, "write_chrome_trace: cannot write '" + path + "'");
}

}  // namespace troupe
