#include "inline/open_engines.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "base/count_in.hpp"
#include "base/engine_setting.hpp"
#include "inline/engine.hpp"
#include "inline/message_medium.hpp"
#include "inline/shm/segment.hpp"
#include "inline/shm/shm_medium.hpp"
#include "transport/data_plane.hpp"
#include "troupe/error.hpp"
#include "troupe/store.hpp"

namespace troupe::detail {

bool inline_engines_off() {
  return read_engine_setting() == engine_setting::actors;
}

inline_engines open_inline_engines(const backend_context& ctx, const rank_names& names,
                                   const std::shared_ptr<data_plane>& plane, const std::string& key,
                                   bool verbose) {
  inline_engines out;
  const auto setting = read_engine_setting();
  bool shm = setting != engine_setting::actors && setting != engine_setting::messages;
  std::vector<bool> local;
  for (int w : ctx.global_ranks) {
    if (plane) shm = shm && plane->shares_memory(w);
    local.push_back(!plane || plane->is_local(w));
  }
  const auto shape = shape_for(ctx.size);
  std::unique_ptr<segment> seg;
  std::shared_ptr<message_medium> msg_med;
  std::string why;
  auto& st = *ctx.store;
  try {
    if (ctx.rank == 0) {
      if (shm) seg = segment::create(shape);
      st.set("engines/segment", to_bytes(seg ? seg->name() : std::string()));
    } else {
      auto name = troupe::to_string(st.get("engines/segment"));
      if (shm && !name.empty()) seg = segment::open(name, shape);
    }
    if (seg) seg->identity(ctx.rank).pid.store(static_cast<std::int32_t>(::getpid()));
  } catch (const error& e) {
    if (e.code() == errc::timeout) throw;
    seg.reset();
    why = e.what();
  }
  std::string mode = "none";
  if (setting != engine_setting::actors) {
    msg_med = std::make_shared<message_medium>(plane, key, local, ctx.global_ranks, ctx.rank,
                                               ctx.group_name, names);
    msg_med->attach();
    mode = seg ? "shm+net" : "net";
  }
  // Every rank counts itself in under its mode: they agree when the count
  // of this rank's mode is everyone (one counter each, not n keys read).
  st.add("engines/mode/" + mode, 1);
  count_in(st, "engines/arrived", ctx.rank, ctx.size, ctx.timeout, "new_group",
           "open the engines of group '" + ctx.group_name + "'");
  const bool agreed = mode != "none" && st.add("engines/mode/" + mode, 0) == ctx.size;
  if (seg && ctx.rank == 0) seg->close_descriptor();
  if (!why.empty() && verbose)
    std::fprintf(stderr, "[troupe group '%s' rank %d] no shared-memory collectives: %s\n",
                 ctx.group_name.c_str(), ctx.rank, why.c_str());
  if (!agreed) return out;
  std::shared_ptr<medium> med = msg_med;
  if (seg) {
    auto shm_med = std::make_shared<shm_medium>(std::move(seg), ctx.rank, ctx.group_name, names,
                                                setting != engine_setting::staged);
    shm_med->read_rings_of(msg_med);
    med = std::move(shm_med);
    out.shm = true;
    out.messages =
        std::make_shared<inline_engine>(std::move(msg_med), ctx.rank, ctx.group_name, names);
  }
  out.main = std::make_shared<inline_engine>(std::move(med), ctx.rank, ctx.group_name, names);
  return out;
}

}  // namespace troupe::detail
