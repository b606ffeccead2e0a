#include "transport/frame.hpp"

#include "troupe/error.hpp"

namespace troupe::detail {
namespace {

bool write_common(byte_stream& out, frame_header& h, const std::string& group,
                  const tensor& payload) {
  h.name_len = static_cast<std::uint16_t>(group.size());
  h.has_payload = payload.defined() ? 1 : 0;
  h.dtype = static_cast<std::uint8_t>(payload.defined() ? payload.scalar_type() : dtype::uint8);
  h.payload_bytes = payload.defined() ? payload.nbytes() : 0;
  return out.write(&h, sizeof(h)) && out.write(group.data(), group.size()) &&
         (h.payload_bytes == 0 || out.write(payload.data(), h.payload_bytes));
}

}  // namespace

bool write_frame(byte_stream& out, const std::string& group, const envelope& env) {
  frame_header h;
  h.kind = 0;
  h.code = static_cast<std::uint8_t>(env.code);
  h.src = env.src;
  h.step = env.step;
  h.seq = env.seq;
  return write_common(out, h, group, env.payload);
}

bool write_frame(byte_stream& out, const std::string& group, const p2p_envelope& env) {
  frame_header h;
  h.kind = 1;
  h.src = env.src;
  h.tag = env.tag;
  return write_common(out, h, group, env.payload);
}

bool write_goodbye(byte_stream& out) {
  frame_header h;
  h.kind = 2;
  return out.write(&h, sizeof(h));
}

std::string read_frame(byte_stream& in, received_frame& out) {
  auto& h = out.header;
  if (!in.read(&h, sizeof(h))) return "connection closed";
  if (h.magic != frame_magic) return "bad frame magic";
  if (h.kind == 2) return {};
  if (h.kind > 2) return "bad frame kind " + std::to_string(h.kind);
  if (h.kind == 0 && h.code > static_cast<std::uint8_t>(op_code::monitored_barrier))
    return "bad op code " + std::to_string(h.code);
  if (h.dtype >= dtype_count) return "bad dtype " + std::to_string(h.dtype);
  if (h.name_len == 0 || h.name_len > max_group_name)
    return "bad group name length " + std::to_string(h.name_len);
  const auto elem = element_size(static_cast<dtype>(h.dtype));
  if (h.payload_bytes % elem != 0 || (!h.has_payload && h.payload_bytes != 0))
    return "bad payload size " + std::to_string(h.payload_bytes);
  out.group.resize(h.name_len);
  if (!in.read(out.group.data(), h.name_len)) return "connection closed";
  out.payload = tensor{};
  if (h.has_payload) {
    // One copy: straight from the stream into the tensor the receiver keeps.
    out.payload = tensor::empty({static_cast<std::int64_t>(h.payload_bytes / elem)},
                                static_cast<dtype>(h.dtype));
    if (h.payload_bytes && !in.read(out.payload.data(), h.payload_bytes))
      return "connection closed";
  }
  return {};
}

}  // namespace troupe::detail
