// collective_utils over the object collectives' byte transport. Both calls
// gather one small record per rank (its type, stage, outcome and payload), so
// that every rank sees every rank's stage name and outcome and all of them
// reach the same verdict: the payloads, or the same error everywhere.

#include "troupe/collective_utils.hpp"

#include <string>

#include "troupe/error.hpp"

namespace troupe::collective_utils::detail {

namespace {

/// What each rank contributes.
struct record {
  std::string type;
  std::optional<std::string> stage;
  bool success = true;
  std::string exception;
  std::optional<byte_vector> payload;
};

template <class Inspector>
auto inspect(Inspector& f, record& r) {
  return f(r.type, r.stage, r.success, r.exception, r.payload);
}

std::vector<record> gather_records(process_group& pg, const record& mine) {
  std::vector<record> all;
  for (auto& b : troupe::detail::all_gather_bytes(pg, serialize(mine)))
    all.push_back(deserialize<record>(b));
  return all;
}

/// Python's f"{stage_name}": the name, or None.
std::string stage_text(const std::optional<std::string>& s) {
  return s ? *s : "None";
}

/// The seed's failure text: "Rank R failed[: stage S][: exception E]".
std::string failure_text(int rank, bool named_stage, const std::optional<std::string>& stage,
                         const std::string& exception) {
  auto msg = "Rank " + std::to_string(rank) + " failed";
  if (named_stage) msg += ": stage " + stage_text(stage);
  if (!exception.empty()) msg += ": exception " + exception;
  return msg;
}

/// Every rank's type must be rank 0's; every rank's stage must be `expected`.
void check_agreement(const std::vector<record>& all, const std::optional<std::string>& expected,
                     const char* op) {
  for (std::size_t i = 1; i < all.size(); ++i)
    if (all[i].type != all[0].type) throw_type_mismatch(i, all[i].type, all[0].type);
  std::string msg;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].stage != expected)
      msg += std::string(msg.empty() ? "" : "; ") + "Unexpected stage name received from rank " +
             std::to_string(i) + ": " + stage_text(all[i].stage);
  if (!msg.empty()) throw error(errc::mismatch, std::string(op) + ": " + msg);
}

}  // namespace

void throw_type_mismatch(std::size_t index, const std::string& type, const std::string& first) {
  throw error(errc::mismatch, "Object type at index " + std::to_string(index) + " is " + type +
                                  ", while first object type is " + first);
}

void check_broadcast_args(bool has_data, const broadcast_options& o) {
  if (!o.success && has_data)
    throw error(errc::invalid_argument,
                "broadcast: Data or Function is expected to be None if not successful");
  if (o.pg && (o.rank < 0 || o.rank >= o.pg->size()))
    throw error(errc::invalid_argument, "broadcast: rank " + std::to_string(o.rank) +
                                            " is not a rank of group '" + o.pg->name() +
                                            "' of size " + std::to_string(o.pg->size()));
  if (!o.pg && o.rank != 0)
    throw error(errc::invalid_argument, "broadcast: without a group only rank 0 exists, got rank " +
                                            std::to_string(o.rank));
}

byte_vector broadcast_outcome(const std::string& type, outcome mine, const broadcast_options& o) {
  const bool root = o.pg ? o.pg->rank() == o.rank : true;
  record r{type, o.stage_name, root ? mine.success : true, root ? mine.exception : std::string(),
           root ? std::move(mine.payload) : std::nullopt};
  if (o.pg) {
    auto all = gather_records(*o.pg, r);
    check_agreement(all, all[static_cast<std::size_t>(o.rank)].stage, "broadcast");
    r = std::move(all[static_cast<std::size_t>(o.rank)]);
  }
  if (!r.success)
    throw error(errc::aborted,
                failure_text(o.rank, o.stage_name.has_value(), r.stage, r.exception));
  if (!r.payload)
    throw error(errc::invalid_argument, "broadcast: rank " + std::to_string(o.rank) +
                                            " has no data to send (pass data or a function)");
  return std::move(*r.payload);
}

std::vector<byte_vector> all_gather_outcomes(const std::string& type, outcome mine,
                                             const all_gather_options& o) {
  if (!o.pg) {
    if (!mine.success)
      throw error(errc::aborted, "all_gather failed with exception " + mine.exception);
    return {std::move(*mine.payload)};
  }
  auto all = gather_records(
      *o.pg, {type, o.stage_name, mine.success, mine.exception, std::move(mine.payload)});
  check_agreement(all, all[0].stage, "all_gather");
  std::string failures;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (!all[i].success)
      failures += std::string(failures.empty() ? "" : "; ") +
                  failure_text(static_cast<int>(i), o.stage_name.has_value(), all[i].stage,
                               all[i].exception);
  if (!failures.empty()) throw error(errc::aborted, "all_gather: " + failures);
  std::vector<byte_vector> r;
  for (auto& x : all) r.push_back(std::move(*x.payload));
  return r;
}

std::vector<byte_vector> all_gather_typed(process_group& pg, const std::string& type,
                                          byte_vector payload) {
  auto all = gather_records(pg, {type, std::nullopt, true, {}, std::move(payload)});
  check_agreement(all, std::nullopt, "all_gather_object_enforce_type");
  std::vector<byte_vector> r;
  for (auto& x : all) r.push_back(std::move(*x.payload));
  return r;
}

}  // namespace troupe::collective_utils::detail
