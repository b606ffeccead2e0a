// Fuzzing target: the data plane's frame decoder (transport/frame.hpp) with
// the checks the data plane applies to every frame (check_sender: the
// connection is world rank 1 of a group "g" of world ranks {0, 1, 2}). The
// first input byte sets how many bytes arrive at a time (1..256), the rest
// is the connection's byte stream. Payloads above 1 MiB are refused here as
// well, so that a run's memory stays small; the real bound (this host's
// memory) is checked by check_header before that. Invariants: every frame
// handed on passed the checks and carries exactly the payload it announced;
// a receive posted for a frame gets its bytes or none.

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/agreement.hpp"
#include "fuzz/fuzz_target.hpp"
#include "transport/frame.hpp"

using namespace troupe;
using namespace troupe::detail;

namespace {

class string_stream final : public byte_stream {
 public:
  std::string bytes;
  bool write(const void* d, std::size_t n) override {
    bytes.append(static_cast<const char*>(d), n);
    return true;
  }
  bool read(void*, std::size_t) override { return false; }
  void close() override {}
};

constexpr std::uint64_t max_fuzz_payload = 1 << 20;

}  // namespace

namespace troupe::fuzz {

void expect(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
  std::abort();
}

const char* name() {
  return "frames";
}

std::vector<std::string> seeds() {
  string_stream s;
  auto floats = tensor::empty({5000}, dtype::float32);  // above 16 KiB: a posted receive
  for (std::int64_t i = 0; i < floats.numel(); ++i) floats.data_as<float>()[i] = float(i);
  write_frame(s, "g",
              envelope{7, 0, 1, op_code::allreduce, tensor::from_vector<int>({1, 2}), nullptr});
  const auto one = s.bytes;
  write_frame(s, "g", envelope{7, 1, 1, op_code::allreduce, floats, nullptr}, frame_inline);
  write_frame(s, "g", p2p_envelope{1, 42, tensor::from_vector<double>({0.5})});
  write_frame(s, "g", envelope{8, 0, 1, op_code::barrier, tensor{}, nullptr});
  write_frame(s, "other", envelope{1, 0, 1, op_code::broadcast, floats, nullptr});
  // A first message of a call: the sender's fingerprint after the group name.
  auto fp = std::make_shared<call_fingerprint>();
  fp->code = static_cast<std::uint8_t>(op_code::alltoallv);
  fp->sends = {1, 2};
  fp->receives = {2, 1};
  write_frame(s, "g", envelope{9, 0, 1, op_code::alltoallv, floats, fp}, frame_inline);
  write_frame(s, "g", envelope{9, describe_step, 1, op_code::alltoallv, tensor{}, fp});
  // A loan and the answers a loan gets.
  p2p_envelope lent{1, 3, {}, p2p_envelope::lent};
  lent.loan = {1, 5, 1 << 20, 4096, 65536, 7, static_cast<std::uint8_t>(dtype::float32), {}};
  write_frame(s, "g", lent);
  p2p_envelope answer{1, 0, tensor::from_vector<std::uint8_t>({'n', 'o'}), p2p_envelope::returned};
  answer.loan.id = 1;
  write_frame(s, "g", answer);
  write_goodbye(s, 2);
  return {std::string(1, '\x0f') + one, std::string(1, '\x00') + s.bytes,
          std::string(1, '\xff') + s.bytes};
}

}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using troupe::fuzz::expect;
  if (size < 1) return 0;
  const std::size_t piece = std::size_t{data[0]} + 1;
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const std::size_t n = size - 1;
  std::size_t at = 0;
  auto read_some = [&](void* d, std::size_t want) -> long {
    if (at == n) return -1;
    const auto k = std::min({want, piece, n - at});
    std::memcpy(d, bytes + at, k);
    at += k;
    return static_cast<long>(k);
  };
  const std::vector<int> members{0, 1, 2};
  auto admit = [&](const frame_header& h, const std::string& group, bool& skip) -> std::string {
    if (h.kind == frame_goodbye) return {};
    if (group != "g") {
      skip = true;
      return {};
    }
    if (h.payload_bytes > max_fuzz_payload) return "larger than the fuzzer takes";
    return check_sender(h, group, members, 1);
  };
  // Frames of operation 7, step 1 may land in a posted tensor of 5000 floats.
  auto posted = tensor::zeros({5000}, dtype::float32);
  auto guard = std::make_shared<receive_guard>();
  bool handed_out = false;
  auto place = [&](const frame_header& h, const std::string&) -> posted_receive {
    if (handed_out || h.seq != 7 || h.step != 1) return {};
    handed_out = true;
    return {posted, guard};
  };
  auto on_frame = [&](received_frame& f) {
    const auto& h = f.header;
    if (h.kind == frame_goodbye) return false;
    expect(f.group == "g", "a frame of another group was handed on");
    expect(h.src == 1, "a frame with a foreign source was handed on");
    expect(h.payload_bytes <= max_fuzz_payload, "an oversized payload was handed on");
    expect(f.payload.defined() == (h.has_payload != 0), "payload presence differs from the header");
    if (f.payload.defined())
      expect(f.payload.nbytes() == h.payload_bytes, "payload size differs from the header");
    if (h.kind == frame_loan) {
      p2p_envelope env;
      if (read_loan(f, env).empty() && env.kind == p2p_envelope::lent) {
        const auto& l = env.loan;
        expect(l.share_offset <= l.share_size && l.nbytes <= l.share_size - l.share_offset,
               "a loan past its buffer's end was taken");
        expect(l.dtype < dtype_count, "a loan of a bad dtype was taken");
      }
    }
    return true;
  };
  frame_reader reader;
  const auto why = reader.drain(read_some, on_frame, place, admit);
  expect(!why.empty(), "a drain that read to the end said nothing");
  return 0;
}
