#pragma once
// agreement — every rank of a collective checks that every other rank made
// the same call before the call may succeed.
//
// Terms: a call's "fingerprint" is what the ranks must agree on (the
// collective, dtype, element count, reduce op and PREMUL_SUM scale kind,
// root, counts per rank, alltoall splits, tensors combined per rank). On
// the shared segment every rank reads every rank's posted descriptor
// (inline/shm/shm_op); on messages (in one process, TCP, the group actors) every
// rank sends its fingerprint to every peer with its first message of the
// call, or alone to peers it sends nothing at once, and a call completes
// only once every peer's fingerprint arrived and agrees. A disagreement
// fails the call on every rank with one text built from every rank's
// fingerprint (describe_disagreement), naming the ranks and what differs,
// as errc::mismatch; every rank steps past the call alike.
//
// At scale (TROUPE_AGREEMENT_RING_FROM ranks and up: by default 17, or 3
// where the group spans processes or hosts; both engines) telling every peer
// costs n - 1 messages per rank and call, n^2 in all (between processes,
// each a system call and a wake-up; between hosts, a network send), so the
// agreement rides with the data instead: the first message to each peer
// still carries the fingerprint, and messages of a peer whose call differs
// never reach the algorithm. Where every rank's result depends on every
// rank's data (result_needs_every_rank) that is enough: a rank whose
// algorithm finished received a chain of agreeing messages from every rank;
// a call still waiting after a while (the inline engine: 2 ms; the group
// actors: at once) also tells its fingerprint to its ring successor, so
// that a disagreement anywhere, which differs between two neighbours, is
// found even where the calls' data never meets (op_context::tell_successor).
// Other
// calls (broadcast, reduce, gather, scatter, empty parts) add ceil(log2 n)
// rounds of dissemination (round k to rank + 2^k, each sent once the
// previous arrived, the first to the successor): the same chains, n log n
// messages. An alltoall of even splits on Bruck's steps rides too: its
// fingerprint says "n elements to each rank", which every rank must say
// alike. A rank that finds a disagreement (or hears of one: an alarm) alarms
// every peer, all switch to the full exchange and fail with the same text as
// before. An alltoall of split sizes keeps the full exchange: they agree
// pairwise, which chains do not carry (its data, and the fingerprints with
// it, go between every two ranks anyway). The setting must be the same on
// every rank.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/texts.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

struct collective_call;

/// What the ranks of one collective must agree on.
struct call_fingerprint {
  std::uint8_t code = 0;    ///< op_code
  std::uint8_t dtype = 0;   ///< the caller's dtype
  std::uint8_t reduce = 0;  ///< reduce_op kind (reducing collectives), else 0
  std::uint8_t scale = 0;   ///< PREMUL_SUM: 1 a scalar scale, 2 a tensor scale
  std::int32_t root = 0;    ///< rooted collectives, else 0
  std::int64_t numel = 0;   ///< allreduce, reduce, broadcast: elements
  std::int64_t local = 1;   ///< tensors each rank combined before the call
  /// alltoall of even splits (collective_call::bruck_alltoall): numel is
  /// what each rank sends each rank, counts holds what it receives from
  /// each, and sends / receives stay empty.
  std::uint8_t even = 0;
  /// collective_call::algorithm (0: not said).
  std::uint8_t algorithm = 0;
  /// Elements per rank (allgather, gather, scatter, reduce_scatter).
  std::vector<std::int64_t> counts;
  /// alltoall: elements this rank sends to / receives from each rank.
  std::vector<std::int64_t> sends, receives;
  /// Set where only a hash of the counts is known (shared-memory descriptors).
  std::uint64_t counts_hash = 0;

  /// Whether the parts every rank must share are equal (alltoall's splits
  /// are checked pairwise, by describe_disagreement).
  bool same_call(const call_fingerprint& o) const;
  /// "allreduce (SUM) of 4 float32 elements", "broadcast of 4 float32 elements from root 0".
  std::string describe() const;
  /// The wire form (little-endian host layout, as frames are): fixed 32
  /// bytes (`even` and `algorithm` in the last two), then the vectors.
  std::string serialize() const;
  /// The fingerprint `bytes` hold; throws errc::invalid_argument when malformed.
  static call_fingerprint deserialize(const void* bytes, std::size_t n);
};
using fingerprint_ptr = std::shared_ptr<const call_fingerprint>;

/// The name of fingerprint's algorithm byte (1 + algorithm_kind), for the
/// messages of a disagreement: the algorithms layer, above this one, sets
/// it (algorithms/select.cpp); unset, "algorithm N".
extern const char* (*algorithm_name)(std::uint8_t algorithm);

/// The fingerprint of `call` as this rank planned it (user_dtype: the dtype
/// the caller passed, when the call moves another one).
call_fingerprint fingerprint_of(const collective_call& call);
/// Whether a group of `size` ranks reaches its agreement riding the data
/// (above): from TROUPE_AGREEMENT_RING_FROM ranks on, by default 17, or 3
/// for a group whose messages `leave_process` (each a system call);
/// throws errc::invalid_argument naming the variable when malformed.
bool agreement_rides_data(int size, bool leave_process);
/// Whether the result of `call` on every rank depends on every rank's data
/// (allreduce, allgather and reduce_scatter with no empty part, barrier):
/// then the algorithm's own messages carry the agreement to every rank;
/// other calls add rounds of dissemination (above).
bool result_needs_every_rank(const collective_call& call);
/// A hash of counts, FNV-1a by words (ranks that disagree on them disagree on this).
std::uint64_t hash_counts(const std::vector<std::int64_t>& counts);
/// hash_counts of `n` counts that all equal `count` (no list built).
std::uint64_t hash_even_counts(std::size_t n, std::int64_t count);

/// Why the ranks' calls disagree ("" when they agree): `fps[i]` is the
/// fingerprint of group rank `ranks[i]` (default: rank i). One text for every
/// rank that sees the same fingerprints.
std::string describe_disagreement(const std::vector<call_fingerprint>& fps,
                                  std::vector<int> ranks = {});
/// Thrown by the agreement checks ("collective mismatch: <why>",
/// errc::mismatch): every rank refuses the call alike, so an inline engine steps past
/// it (another failure leaves the protocol state unknown).
class disagreement_error : public error {
 public:
  explicit disagreement_error(const std::string& why) : error(errc::mismatch, mismatch_text(why)) {}
};

/// One call's agreement on messages: records what each peer says it called.
class agreement {
 public:
  agreement(const collective_call& call, int rank, int size);
  /// This rank's fingerprint (sent with the first message to each peer).
  const fingerprint_ptr& mine() const noexcept { return mine_; }
  /// Whether this rank still has to tell `peer` its fingerprint (and marks it told).
  bool tell(int peer);
  /// The peers this rank has not told yet (and marks them told).
  std::vector<int> untold();
  /// Marks every peer told.
  void told_all() { told_.assign(told_.size(), true); }
  /// Records `peer`'s fingerprint (the first one counts).
  void heard(int peer, const fingerprint_ptr& fp);
  /// Whether `peer`'s fingerprint arrived and agrees with this rank's.
  bool agrees_with(int peer) const;
  /// Whether `peer`'s fingerprint arrived.
  bool heard_from(int peer) const { return theirs_[static_cast<std::size_t>(peer)] != nullptr; }
  /// Whether some peer's fingerprint differs (the call cannot succeed).
  bool differs() const noexcept { return differs_; }
  /// The first peer whose fingerprint has not arrived, or -1.
  int missing() const;
  /// Every peer whose fingerprint has not arrived ("rank 3", "ranks 1, 4"), or "".
  std::string missing_ranks() const;
  /// Why the ranks disagree, once every fingerprint arrived ("" otherwise or
  /// when they agree); with `partial`, from what arrived so far.
  std::string disagreement(bool partial = false) const;

 private:
  int rank_;
  fingerprint_ptr mine_;
  std::vector<fingerprint_ptr> theirs_;
  std::vector<bool> told_;
  bool differs_ = false;
};

}  // namespace troupe::detail
