// host_backend (host_backend.hpp): a group's set-up (its group actor, the
// actor engine's transport to the peers, the inline engines), abort and
// tear-down, and the works it tracks so that tear-down fails them.

#include "backends/host_backend.hpp"
#include "base/texts.hpp"

#include <cstdio>

#include "actors/group_actor.hpp"
#include "actors/in_process.hpp"
#include "actors/mixed.hpp"
#include "actors/plane_sink.hpp"
#include "actors/rank_runtime.hpp"
#include "actors/thread_logger.hpp"
#include "backends/device_exchange.hpp"
#include "base/count_in.hpp"
#include "base/process_directory.hpp"
#include "base/work_state.hpp"
#include "inline/mailbox.hpp"
#include "inline/open_engines.hpp"
#include "store/watchful_store.hpp"
#include "transport/data_plane.hpp"
#include "troupe/error.hpp"
#ifdef TROUPE_HAVE_CUDA
#include "cuda/device_ops.hpp"
#endif

namespace troupe::detail {

host_backend::host_backend(const backend_context& ctx)
    : backend(ctx),
      rt_(*static_cast<rank_runtime*>(ctx.runtime)),
      timeout_(ctx.timeout),
      debug_(ctx.debug),
      key_prefix_(rt_.job() + "/" + ctx.group_name + "/") {
  group_ = spawn_group_actor(
      rt_.system(),
      group_info{ctx.group_name, ctx.rank, ctx.size, ctx.global_ranks, unwatched(ctx.store),
                 rt_.leaving_together(), rt_.plane() ? rt_.plane()->link_costs() : std::string()});
  const auto& plane = rt_.plane();
  // Point to point: the mailbox, published before any peer may send to it.
  if (ctx.size > 1 && !inline_engines_off()) {
    mailbox_ = std::make_shared<mailbox>(key_prefix_ + "mailbox/", ctx.group_name, ctx.rank,
                                         ctx.global_ranks, plane);
    mailbox_->attach();
  }
  if (plane) {
    auto sink = plane_sink(group_);
    if (mailbox_) {
      std::weak_ptr<mailbox> mb = mailbox_;
      sink.p2p = [mb](p2p_envelope env) {
        if (auto m = mb.lock()) m->arrive(std::move(env));
      };
      sink.loan = [mb](p2p_envelope env) {
        if (auto m = mb.lock()) m->loan(std::move(env));
      };
      sink.p2p_place = [mb](const frame_header& h) {
        auto m = mb.lock();
        return m ? m->place(h) : posted_receive{};
      };
      sink.gone = [mb, actor = std::move(sink.gone)](int r, const std::string& why, bool crashed) {
        if (auto m = mb.lock()) m->gone(r, why, crashed);
        actor(r, why, crashed);
      };
    }
    plane->add_group(ctx.group_name, ctx.global_ranks, std::move(sink));
  }
  auto in_other_process = [&](int r) {
    return plane && !plane->is_local(ctx.global_ranks[static_cast<std::size_t>(r)]);
  };
  // Meet the group actors of the peers in this process in the group's roster
  // (they create theirs concurrently); peers in other processes are reached
  // through the data plane.
  int here = 0;
  bool mixed = false;
  for (int r = 0; r < ctx.size; ++r) {
    if (in_other_process(r))
      mixed = true;
    else
      ++here;
  }
  auto roster = shared_in_process<group_roster>(
      key_prefix_ + "roster", [&] { return std::make_unique<group_roster>(ctx.size, here); });
  int missing = -1;
  auto members = roster->meet(
      ctx.rank, group_, std::chrono::steady_clock::now() + ctx.timeout,
      [&](int r) { return !in_other_process(r); }, missing);
  roster.reset();
  if (!members) {
    shutdown("group set-up failed");
    throw error(errc::timeout,
                "new_group: " + detail::timeout_after(ctx.timeout) + " waiting for rank " +
                    std::to_string(missing) + " (world rank " +
                    std::to_string(ctx.global_ranks[static_cast<std::size_t>(missing)]) +
                    ") to create group '" + ctx.group_name + "'");
  }
  std::shared_ptr<actor_peers> net;
  if (mixed)
    net =
        std::make_shared<mixed_peers>(std::move(members), ctx.global_ranks, plane, ctx.group_name);
  else
    net = std::make_shared<in_process_peers>(std::move(members), ctx.global_ranks);
  thread_logger_release release;  // after the scoped actor (actors/thread_logger.hpp)
  caf::scoped_actor self{rt_.system()};
  self->request(group_, caf::infinite, peers_atom::value, net)
      .receive([](bool) {}, [](caf::error&) {});
  // Return only once every member found every other: a member that returns
  // early could otherwise leave (destroy the group) before a peer found it.
  try {
    count_in(*ctx.store, "created", ctx.rank, ctx.size, ctx.timeout, "new_group",
             "create group '" + ctx.group_name + "'");
    // Errors name a peer as the group actor's transport does, when they ask.
    net_ = net;
    const rank_names names(ctx.size, [net = std::weak_ptr<actor_peers>(net)](int r) {
      auto n = net.lock();
      return n ? n->describe_peer(r) : "rank " + std::to_string(r);
    });
    if (mailbox_) mailbox_->set_names(names);
    auto f = open_inline_engines(ctx, names, plane, key_prefix_ + "engines/",
                                 debug_ != debug_level::off);
    engine_ = std::move(f.main);
    messages_ = std::move(f.messages);
    shm_ = f.shm;
    // A timed-out call's chain of waits is told and read through the
    // group's store without its watch: it matters most once a member is gone.
    for (const auto& e : {engine_, messages_})
      if (e) e->tell_waits_through(unwatched(ctx.store));
    // Beside a shared-memory engine, operations on messages read the
    // peers' announcements from the segment.
    if (messages_) messages_->read_announcements_from(engine_->medium_ptr());
#ifdef TROUPE_HAVE_CUDA
    // Ranks that share this process share their device memory too.
    if (!mixed)
      exchange_ =
          gpu::device_exchange::open(key_prefix_ + "device", ctx.size, gpu::cuda_device_ops());
#endif
  } catch (...) {
    shutdown("group set-up failed");
    throw;
  }
}

host_backend::~host_backend() {
  shutdown("the group was destroyed");
}

std::string host_backend::name() const {
  return "actor";
}

std::uint64_t host_backend::sequence_number() {
  return issued_.load();
}

void host_backend::abort(const std::string& reason) {
  caf::anon_send(group_, abort_atom::value, reason);
  if (engine_) engine_->abort(reason);
  if (messages_) messages_->abort(reason);
  if (exchange_) exchange_->abort(reason);
  if (mailbox_) mailbox_->abort(errc::aborted, reason);
}

/// TROUPE_DEBUG=DETAIL: one line when a call is issued and one when it ends.
void host_backend::log_detail(const work& w, const tensor& data) const {
  auto what = data.defined() ? data.describe() : std::string("no tensor");
  std::fprintf(stderr, "[troupe group '%s' rank %d] issue %s %s\n", group_name().c_str(), rank(),
               w.op_name().c_str(), what.c_str());
  w.on_complete([r = rank()](const work& done) {
    std::fprintf(stderr, "[troupe group '%s' rank %d] %s seq %llu %s\n", done.group_name().c_str(),
                 r, done.op_name().c_str(), static_cast<unsigned long long>(done.sequence_number()),
                 done.is_success() ? "done" : "FAILED");
  });
}

/// Remembers pending works so that destroying the group fails them instead of
/// leaving a waiter behind.
void host_backend::track(const work& w) {
  std::lock_guard<std::mutex> g{mtx_};
  if (pending_.size() > 64)
    std::erase_if(pending_, [](auto& p) {
      auto s = p.lock();
      return !s || work_done(*s);
    });
  pending_.push_back(w.state());
}

bool host_backend::work_done(work_state& s) {
  std::lock_guard<std::mutex> g{s.mtx};
  return s.done;
}

void host_backend::shutdown(const std::string& reason) {
  if (!group_) return;
  for (auto* f : {&engine_, &messages_})
    if (*f) {
      (*f)->abort(reason);
      f->reset();
    }
  if (exchange_) {
    exchange_->leave(rank(), reason);
    exchange_.reset();
  }
  if (mailbox_) {
    mailbox_->leave(reason);
    mailbox_.reset();
  }
  if (rt_.plane()) rt_.plane()->remove_group(group_name());
  caf::anon_send_exit(group_, caf::exit_reason::user_shutdown);
  group_ = nullptr;
  std::vector<std::weak_ptr<work_state>> pending;
  {
    std::lock_guard<std::mutex> g{mtx_};
    pending.swap(pending_);
  }
  for (auto& p : pending)
    if (auto s = p.lock())
      work::attach(s).fail(std::make_exception_ptr(
          error(errc::aborted, call_location(s->op, s->group) + " failed: " + reason)));
}

}  // namespace troupe::detail
