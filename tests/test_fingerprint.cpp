// A call's fingerprint on its own (base/agreement.hpp): the hash of even
// counts equals the hash of their list, the wire form comes back whole, and
// what a peer sending garbage may send is refused with a reason. In one
// process only (tests/test_agreement.cpp checks the agreement across ranks).

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/cost_model.hpp"
#include "base/agreement.hpp"
#include "base/call.hpp"
#include "troupe/error.hpp"

using namespace troupe;

TEST_CASE("the hash of even counts is the hash of their list") {
  // A gather or scatter on the tiny lane posts the counts' hash without
  // building their list; a rank that planned the list posts hash_counts.
  for (std::size_t n : {0, 1, 2, 3, 7, 32})
    for (std::int64_t c : {std::int64_t{0}, std::int64_t{1}, std::int64_t{256}, std::int64_t{-1}}) {
      CAPTURE(n);
      CAPTURE(c);
      CHECK(detail::hash_even_counts(n, c) == detail::hash_counts(std::vector<std::int64_t>(n, c)));
    }
  CHECK(detail::hash_even_counts(3, 2) != detail::hash_even_counts(2, 3));
}

TEST_CASE("a fingerprint's wire form comes back whole, and a malformed one is refused") {
  detail::call_fingerprint even;  // an alltoall of even splits on Bruck's steps
  even.code = static_cast<std::uint8_t>(detail::op_code::alltoallv);
  even.dtype = static_cast<std::uint8_t>(dtype::float32);
  even.numel = 3;
  even.even = 1;
  detail::call_fingerprint splits = even;  // one with split sizes
  splits.even = 0;
  splits.numel = 0;
  splits.sends = {1, 2};
  splits.receives = {2, 1};
  detail::call_fingerprint chosen = even;  // the algorithm the engine chose, said
  chosen.algorithm = 1 + static_cast<std::uint8_t>(detail::algorithm_kind::alltoall_bruck);
  for (const auto* f : {&even, &splits, &chosen}) {
    const auto wire = f->serialize();
    const auto back = detail::call_fingerprint::deserialize(wire.data(), wire.size());
    CHECK(back.same_call(*f));
    CHECK(back.even == f->even);
    CHECK(back.algorithm == f->algorithm);
    CHECK(back.sends == f->sends);
    CHECK(back.receives == f->receives);
  }
  CHECK_FALSE(even.same_call(splits));
  CHECK_FALSE(even.same_call(chosen));
  CHECK(even.describe() == "alltoall of 3 float32 elements to each rank");
  // What a peer that sends garbage may send: each refused with a reason.
  auto refused = [](std::string wire, const char* why) {
    CAPTURE(why);
    try {
      (void)detail::call_fingerprint::deserialize(wire.data(), wire.size());
      CHECK_MESSAGE(false, "accepted");
    } catch (const error& e) {
      CHECK(e.code() == errc::invalid_argument);
      CHECK(std::string(e.what()).find(why) != std::string::npos);
    }
  };
  auto wire = even.serialize();
  wire[30] = 2;  // the even-splits mark
  refused(wire, "even-splits mark");
  refused(even.serialize().substr(0, 20), "too short");
  refused(splits.serialize() + "x", "sizes do not add up");
  wire = even.serialize();
  wire[0] = 99;
  refused(wire, "bad collective");
}
