#include "base/agreement.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/call.hpp"
#include "base/texts.hpp"
#include "troupe/dtype.hpp"
#include "troupe/reduce_op.hpp"

namespace troupe::detail {
namespace {

bool reduces(op_code c) {
  return c == op_code::allreduce || c == op_code::reduce || c == op_code::reduce_scatterv;
}
bool rooted(op_code c) {
  return c == op_code::broadcast || c == op_code::reduce || c == op_code::gatherv ||
         c == op_code::scatterv;
}
bool has_numel(op_code c) {
  return c == op_code::allreduce || c == op_code::reduce || c == op_code::broadcast;
}
bool has_counts(op_code c) {
  return c == op_code::allgatherv || c == op_code::gatherv || c == op_code::scatterv ||
         c == op_code::reduce_scatterv;
}
bool moves_data(op_code c) {
  return c != op_code::barrier && c != op_code::monitored_barrier;
}

std::string list(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string dtype_name(std::uint8_t t) {
  return t < dtype_count ? std::string(to_string(static_cast<dtype>(t)))
                         : "dtype " + std::to_string(t);
}

std::string reduce_name(std::uint8_t k, std::uint8_t scale) {
  if (k > reduce_op::PREMUL_SUM) return "reduce op " + std::to_string(k);
  std::string s = to_string(static_cast<reduce_op::kind>(k));
  if (k == reduce_op::PREMUL_SUM) s += scale == 2 ? " with a tensor scale" : " with a scalar scale";
  return s;
}

std::string algorithm_text(std::uint8_t a) {
  if (a == 0) return "none said";
  if (const char* name = algorithm_name ? algorithm_name(a) : nullptr) return name;
  return "algorithm " + std::to_string(a);
}

/// What differs between two fingerprints of ranks that disagree.
std::string differences(const call_fingerprint& a, const call_fingerprint& b) {
  std::vector<std::string> d;
  if (a.code != b.code) return "the collective";
  if (a.even != b.even)
    return "whether split sizes were passed (pass them on every rank or on none)";
  if (a.even && a.counts != b.counts) d.push_back("the elements each rank receives from each");
  if (a.dtype != b.dtype) d.push_back("the dtype");
  if (a.numel != b.numel) d.push_back("the element count");
  if (a.reduce != b.reduce || a.scale != b.scale) d.push_back("the reduce op");
  if (a.root != b.root) d.push_back("the root");
  if (!a.even && (a.counts != b.counts || a.counts_hash != b.counts_hash))
    d.push_back("the counts per rank");
  if (a.local != b.local) d.push_back("the number of tensors per rank");
  if (d.empty() && a.algorithm != b.algorithm)
    d.push_back("the algorithm each chose (" + algorithm_text(a.algorithm) + ", " +
                algorithm_text(b.algorithm) +
                ": tell every rank the same TROUPE_ALGORITHMS and TROUPE_LINK_COSTS)");
  std::string s;
  for (std::size_t i = 0; i < d.size(); ++i)
    s += (i == 0 ? "" : i + 1 == d.size() ? " and " : ", ") + d[i];
  return s;
}

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// A word per step, not FNV's byte (8x fewer multiplies: this runs on every
// small gather, scatter, allgather and reduce_scatter). Each step maps h
// one-to-one (xor, then an odd multiply), so two lists of one length that
// differ in one count always differ here.
constexpr std::uint64_t counts_basis = 1469598103934665603ull;
constexpr std::uint64_t counts_step(std::uint64_t h, std::int64_t c) {
  return (h ^ static_cast<std::uint64_t>(c)) * 1099511628211ull;
}
constexpr std::uint64_t counts_end(std::uint64_t h) {
  return h ^ (h >> 31);
}

}  // namespace

const char* (*algorithm_name)(std::uint8_t) = nullptr;

std::uint64_t hash_counts(const std::vector<std::int64_t>& counts) {
  std::uint64_t h = counts_basis;
  for (auto c : counts) h = counts_step(h, c);
  return counts_end(h);
}

std::uint64_t hash_even_counts(std::size_t n, std::int64_t count) {
  std::uint64_t h = counts_basis;
  for (std::size_t i = 0; i < n; ++i) h = counts_step(h, count);
  return counts_end(h);
}

bool call_fingerprint::same_call(const call_fingerprint& o) const {
  const auto hash = [](const call_fingerprint& f) {
    return f.counts_hash != 0 ? f.counts_hash : f.counts.empty() ? 0 : hash_counts(f.counts);
  };
  return code == o.code && dtype == o.dtype && reduce == o.reduce && scale == o.scale &&
         root == o.root && numel == o.numel && local == o.local && even == o.even &&
         algorithm == o.algorithm && hash(*this) == hash(o);
}

std::string call_fingerprint::describe() const {
  const auto c = static_cast<op_code>(code);
  std::string s = to_string(c);
  if (!moves_data(c)) return s;
  if (reduces(c)) s += " (" + reduce_name(reduce, scale) + ")";
  if (has_numel(c))
    s += " of " + std::to_string(numel) + " " + dtype_name(dtype) + " elements";
  else if (even)
    s += " of " + std::to_string(numel) + " " + dtype_name(dtype) + " elements to each rank" +
         (counts.size() == 1 && counts[0] != numel ? ", " + std::to_string(counts[0]) + " from each"
                                                   : "");
  else
    s += " of " + dtype_name(dtype);
  if (!counts.empty() && !even) s += " with counts " + list(counts);
  if (c == op_code::broadcast || c == op_code::scatterv) s += " from root " + std::to_string(root);
  if (c == op_code::reduce || c == op_code::gatherv) s += " to root " + std::to_string(root);
  if (local != 1) s += " over " + std::to_string(local) + " tensors per rank";
  return s;
}

std::string call_fingerprint::serialize() const {
  std::string out;
  out.reserve(32 + 8 * (counts.size() + sends.size() + receives.size()));
  put(out, code);
  put(out, dtype);
  put(out, reduce);
  put(out, scale);
  put(out, root);
  put(out, numel);
  put(out, local);
  put(out, static_cast<std::uint16_t>(counts.size()));
  put(out, static_cast<std::uint16_t>(sends.size()));
  put(out, static_cast<std::uint16_t>(receives.size()));
  put(out, static_cast<std::uint16_t>(even | algorithm << 8));
  for (auto* v : {&counts, &sends, &receives})
    for (auto x : *v) put(out, x);
  return out;
}

call_fingerprint call_fingerprint::deserialize(const void* bytes, std::size_t n) {
  auto bad = [&](const char* why) {
    return error(errc::invalid_argument,
                 std::string("call fingerprint: ") + why + " (" + std::to_string(n) + " bytes)");
  };
  if (n < 32) throw bad("too short");
  const auto* p = static_cast<const char*>(bytes);
  auto get = [&p](auto& v) {
    std::memcpy(&v, p, sizeof(v));
    p += sizeof(v);
  };
  call_fingerprint f;
  get(f.code);
  get(f.dtype);
  get(f.reduce);
  get(f.scale);
  get(f.root);
  get(f.numel);
  get(f.local);
  std::uint16_t nc = 0, ns = 0, nr = 0, even = 0;
  get(nc);
  get(ns);
  get(nr);
  get(even);
  if ((even & 0xff) > 1) throw bad("bad even-splits mark");
  f.even = static_cast<std::uint8_t>(even & 0xff);
  f.algorithm = static_cast<std::uint8_t>(even >> 8);
  if (n != 32 + 8 * (std::size_t{nc} + ns + nr)) throw bad("sizes do not add up");
  if (f.code > static_cast<std::uint8_t>(op_code::monitored_barrier)) throw bad("bad collective");
  for (auto [v, k] : {std::pair{&f.counts, nc}, {&f.sends, ns}, {&f.receives, nr}}) {
    v->resize(k);
    for (auto& x : *v) get(x);
  }
  return f;
}

call_fingerprint fingerprint_of(const collective_call& call) {
  call_fingerprint f;
  const auto c = call.code;
  f.code = static_cast<std::uint8_t>(c);
  if (!moves_data(c)) return f;
  const auto& t = call.input.defined() ? call.input : call.output;
  f.dtype = static_cast<std::uint8_t>(call.user_dtype ? *call.user_dtype : t.scalar_type());
  if (reduces(c)) {
    f.reduce = call.op.op();
    if (call.op.op() == reduce_op::PREMUL_SUM) f.scale = call.op.has_tensor_scale() ? 2 : 1;
  }
  if (rooted(c)) f.root = call.root;
  if (has_numel(c)) f.numel = t.numel();
  f.local = call.avg_local;
  f.algorithm = call.algorithm;
  if (has_counts(c)) f.counts = call.counts;
  if (c == op_code::alltoallv && call.bruck_alltoall) {
    // What each rank sends each rank, and receives from each: a rank whose
    // output is not its input's size disagrees (else it alone would fail).
    f.even = 1;
    f.numel = call.counts.empty() ? 0 : call.counts.front();
    f.counts = {call.recv_counts.empty() ? 0 : call.recv_counts.front()};
  } else if (c == op_code::alltoallv) {
    f.sends = call.counts;
    f.receives = call.recv_counts;
  }
  return f;
}

bool agreement_rides_data(int size, bool leave_process) {
  constexpr const char* name = "TROUPE_AGREEMENT_RING_FROM";
  // Parsed again only when the environment's value changes (setenv makes a
  // new string): once per call otherwise costs one getenv.
  static std::atomic<const char*> seen{nullptr};
  static std::atomic<int> from{0};  // 0: the default
  const char* v = std::getenv(name);
  if (v != seen.load(std::memory_order_acquire)) {
    int n = 0;
    if (v && *v) {
      char* end = nullptr;
      errno = 0;
      const long k = std::strtol(v, &end, 10);
      if (errno != 0 || *end != '\0' || k < 3 || k > (1L << 30))
        throw error(errc::invalid_argument,
                    std::string(name) + "='" + v + "': expected a rank count of 3 or more");
      n = static_cast<int>(k);
    }
    from.store(n, std::memory_order_relaxed);
    seen.store(v, std::memory_order_release);
  }
  const int set = from.load(std::memory_order_relaxed);
  return size >= (set != 0 ? set : leave_process ? 3 : 17);
}

bool result_needs_every_rank(const collective_call& call) {
  const auto positive = [](const std::vector<std::int64_t>& c) {
    return !c.empty() && std::all_of(c.begin(), c.end(), [](std::int64_t k) { return k > 0; });
  };
  switch (call.code) {
    case op_code::barrier:
      return true;
    case op_code::allreduce: {
      const auto& t = call.input.defined() ? call.input : call.output;
      return t.defined() && t.numel() > 0;
    }
    case op_code::allgatherv:
    case op_code::reduce_scatterv:
      return positive(call.counts);
    case op_code::alltoallv:  // Bruck's steps carry every rank's blocks to every rank
      return call.bruck_alltoall && positive(call.counts);
    default:
      return false;
  }
}

std::string describe_disagreement(const std::vector<call_fingerprint>& fps,
                                  std::vector<int> ranks) {
  const bool whole_group = ranks.empty();
  if (whole_group)
    for (int r = 0; r < static_cast<int>(fps.size()); ++r) ranks.push_back(r);
  auto label = [&](std::vector<int> idx) {
    for (auto& i : idx) i = ranks[static_cast<std::size_t>(i)];
    return ranks_text(idx);
  };
  // Ranks grouped by the call they made, in order of their lowest rank.
  std::vector<std::vector<int>> classes;
  for (int r = 0; r < static_cast<int>(fps.size()); ++r) {
    auto i = classes.begin();
    for (; i != classes.end(); ++i)
      if (fps[static_cast<std::size_t>(i->front())].same_call(fps[static_cast<std::size_t>(r)]))
        break;
    if (i == classes.end())
      classes.push_back({r});
    else
      i->push_back(r);
  }
  if (classes.size() > 1) {
    std::string s;
    for (std::size_t i = 0; i < classes.size(); ++i)
      s += (i ? "; " : "") + label(classes[i]) + " called " +
           fps[static_cast<std::size_t>(classes[i].front())].describe();
    const auto& first = fps[static_cast<std::size_t>(classes[0].front())];
    std::string what;
    for (std::size_t i = 1; i < classes.size(); ++i) {
      auto d = differences(first, fps[static_cast<std::size_t>(classes[i].front())]);
      if (what.find(d) == std::string::npos) what += (what.empty() ? "" : "; ") + d;
    }
    return s + " (they differ in " + what + ")";
  }
  if (!whole_group || fps.empty() || static_cast<op_code>(fps[0].code) != op_code::alltoallv ||
      fps[0].even)
    return {};
  // alltoall: what rank i sends to rank j is what rank j expects from rank i.
  const auto n = fps.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (fps[i].sends.size() != n || fps[i].receives.size() != n)
      return "rank " + std::to_string(i) + " passed splits for " +
             std::to_string(fps[i].sends.size()) + " ranks in a group of " + std::to_string(n);
  }
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j)
      if (fps[i].sends[j] != fps[j].receives[i])
        return "alltoall: rank " + std::to_string(i) + " sends " + std::to_string(fps[i].sends[j]) +
               " elements to rank " + std::to_string(j) + ", which expects " +
               std::to_string(fps[j].receives[i]) + " from it";
  return {};
}

agreement::agreement(const collective_call& call, int rank, int size)
    : rank_(rank),
      mine_(std::make_shared<const call_fingerprint>(fingerprint_of(call))),
      theirs_(static_cast<std::size_t>(size)),
      told_(static_cast<std::size_t>(size), false) {
  theirs_[static_cast<std::size_t>(rank)] = mine_;
  told_[static_cast<std::size_t>(rank)] = true;
}

bool agreement::tell(int peer) {
  auto&& t = told_[static_cast<std::size_t>(peer)];
  if (t) return false;
  t = true;
  return true;
}

std::vector<int> agreement::untold() {
  std::vector<int> r;
  for (int p = 0; p < static_cast<int>(told_.size()); ++p)
    if (tell(p)) r.push_back(p);
  return r;
}

void agreement::heard(int peer, const fingerprint_ptr& fp) {
  auto& slot = theirs_[static_cast<std::size_t>(peer)];
  if (slot || !fp) return;
  slot = fp;
  if (!agrees_with(peer)) differs_ = true;
}

bool agreement::agrees_with(int peer) const {
  const auto& f = theirs_[static_cast<std::size_t>(peer)];
  if (!f) return false;
  if (!f->same_call(*mine_)) return false;
  if (static_cast<op_code>(mine_->code) != op_code::alltoallv || mine_->even) return true;
  // Pairwise: what each sends the other is what the other expects.
  const auto n = theirs_.size();
  if (f->sends.size() != n || f->receives.size() != n || mine_->sends.size() != n) return false;
  const auto p = static_cast<std::size_t>(peer), me = static_cast<std::size_t>(rank_);
  return f->sends[me] == mine_->receives[p] && f->receives[me] == mine_->sends[p];
}

int agreement::missing() const {
  for (std::size_t r = 0; r < theirs_.size(); ++r)
    if (!theirs_[r]) return static_cast<int>(r);
  return -1;
}

std::string agreement::missing_ranks() const {
  std::vector<int> rs;
  for (std::size_t r = 0; r < theirs_.size(); ++r)
    if (!theirs_[r]) rs.push_back(static_cast<int>(r));
  return rs.empty() ? std::string{} : ranks_text(rs);
}

std::string agreement::disagreement(bool partial) const {
  // Every fingerprint that arrived is the same call as this rank's (an
  // equality of fields): one class, nothing to describe. Only alltoall's
  // uneven splits, checked between every two ranks, need the whole table.
  if (!differs_ && (static_cast<op_code>(mine_->code) != op_code::alltoallv || mine_->even))
    return {};
  std::vector<call_fingerprint> fps;
  for (auto& f : theirs_) {
    if (f)
      fps.push_back(*f);
    else if (!partial)
      return {};
  }
  if (!partial) return describe_disagreement(fps);
  // From what arrived: this rank against each peer that disagrees with it.
  for (std::size_t p = 0; p < theirs_.size(); ++p) {
    if (!theirs_[p] || agrees_with(static_cast<int>(p))) continue;
    const auto lo = std::min<std::size_t>(p, static_cast<std::size_t>(rank_));
    const auto hi = std::max<std::size_t>(p, static_cast<std::size_t>(rank_));
    auto why = describe_disagreement({*theirs_[lo], *theirs_[hi]},
                                     {static_cast<int>(lo), static_cast<int>(hi)});
    if (why.empty()) {
      // alltoall splits: this rank's row against the peer's.
      const auto& f = *theirs_[p];
      const auto me = static_cast<std::size_t>(rank_);
      const bool sizes = f.sends.size() == theirs_.size() && f.receives.size() == theirs_.size();
      if (!sizes)
        why = "rank " + std::to_string(p) + " passed splits for " + std::to_string(f.sends.size()) +
              " ranks in a group of " + std::to_string(theirs_.size());
      else if (f.sends[me] != mine_->receives[p])
        why = "alltoall: rank " + std::to_string(p) + " sends " + std::to_string(f.sends[me]) +
              " elements to rank " + std::to_string(me) + ", which expects " +
              std::to_string(mine_->receives[p]) + " from it";
      else
        why = "alltoall: rank " + std::to_string(me) + " sends " + std::to_string(mine_->sends[p]) +
              " elements to rank " + std::to_string(p) + ", which expects " +
              std::to_string(f.receives[me]) + " from it";
    }
    return why + " (" + missing_ranks() + " never described " +
           (missing_ranks().find(',') == std::string::npos ? "its" : "their") + " call)";
  }
  return {};
}

}  // namespace troupe::detail
