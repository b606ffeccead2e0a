// world: rendezvous of one rank, its runtime, default group and group registry.

#include "troupe/world.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <unistd.h>

#include "actors/rank_runtime.hpp"
#include "algorithms/cost_model.hpp"
#include "api/link_measurement.hpp"
#include "api/rank_threads.hpp"
#include "base/call_until.hpp"
#include "base/engine_setting.hpp"
#include "base/wait_policy.hpp"
#include "store/watchful_store.hpp"
#include "transport/data_plane.hpp"
#include "transport/link.hpp"
#include "transport/local_address.hpp"
#include "transport/rendezvous.hpp"
#include "transport/tcp_stream.hpp"
#include "troupe/error.hpp"
#include "troupe/tcp_store.hpp"

namespace troupe {

namespace detail {
backend_creator find_backend(const std::string& name);
}

struct world::impl {
  world_options opts;
  std::shared_ptr<detail::rendezvous> rdv;  // who is known to be gone, for the groups' set-up
  std::unique_ptr<detail::rank_runtime> rt;
  std::shared_ptr<process_group> default_group;
  debug_level debug = debug_level::off;
  std::mutex mtx;
  std::map<std::string, std::shared_ptr<process_group>> groups;  // registered, by name
  int group_counter = 0;                                         // new_group calls (all ranks)
  std::map<std::vector<int>, int> local_counter;                 // local-sync groups by members
  std::string job_key;                 // the job's store prefix ("troupe/job/N")
  std::map<std::string, int> shrinks;  // shrink calls per group name

  std::shared_ptr<process_group> make_group(const std::string& name, std::vector<int> ranks,
                                            std::chrono::milliseconds timeout,
                                            const std::string& backend_spec,
                                            const std::string& description);
  /// The world's building from the rendezvous on: the job id, the data
  /// plane, the link's measurement, the default group.
  void build(const std::string& job_key, const std::string& congestion,
             detail::engine_setting engines);
};

namespace {

/// A duration in whole milliseconds from `name` (0 or more), else `fallback`.
std::chrono::milliseconds milliseconds_from_env(const char* name,
                                                std::chrono::milliseconds fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long ms = std::strtoll(v, &end, 10);
  if (errno != 0 || *end != '\0' || ms < 0)
    throw error(errc::invalid_argument, std::string("world: ") + name + " '" + v +
                                            "' is not a number of milliseconds (0 or more)");
  return std::chrono::milliseconds(ms);
}

std::string random_job_id() {
  std::random_device rd;
  std::mt19937_64 gen{(static_cast<std::uint64_t>(rd()) << 32) ^ rd()};
  static const char* hex = "0123456789abcdef";
  std::string r;
  for (int i = 0; i < 16; ++i) r += hex[gen() % 16];
  return r;
}

void invalid(const std::string& what) {
  throw error(errc::invalid_argument, what);
}

/// Asks the server of `s` (a tcp_store, perhaps behind prefixes) to append
/// `line` to `key` should this process's connection end without a goodbye;
/// whether it can.
bool watch_this_process(store& s, const std::string& key, const std::string& line) {
  if (auto* p = dynamic_cast<prefix_store*>(&s))
    return watch_this_process(*p->underlying(), p->prefix() + "/" + key, line);
  auto* t = dynamic_cast<tcp_store*>(&s);
  if (t) t->append_on_disconnect(key, to_bytes(line));
  return t != nullptr;
}

}  // namespace

std::shared_ptr<process_group> world::impl::make_group(const std::string& name,
                                                       std::vector<int> ranks,
                                                       std::chrono::milliseconds timeout,
                                                       const std::string& backend_spec,
                                                       const std::string& description) {
  backend_config cfg{backend_spec};
  auto me = std::find(ranks.begin(), ranks.end(), opts.rank);
  const int group_rank = me == ranks.end() ? -1 : static_cast<int>(me - ranks.begin());
  std::map<device_type, std::shared_ptr<backend>> backends;
  std::map<device_type, std::string> unavailable;
  if (group_rank >= 0) {
    std::map<std::string, std::shared_ptr<backend>> by_name;  // one instance per backend name
    for (auto& [dev, bname] : cfg.entries()) {
      if (!is_backend_available(bname)) {  // calls on this device report it
        unavailable[dev] = bname;
        continue;
      }
      auto& b = by_name[bname];
      if (!b) {
        backend_context ctx;
        // Its set-up fails at once, naming the rank, when a member is gone
        // or gave up creating the group (quoting why: a member whose
        // backend failed to start writes its reason under gave_up_key,
        // unless it only quoted another's).
        const std::string gave_up_key = "troupe/" + rt->job() + "/gave_up/" + name;
        auto quoted = std::make_shared<std::atomic<bool>>(false);
        ctx.store = std::make_shared<detail::watchful_store>(
            std::make_shared<prefix_store>("troupe/" + rt->job() + "/" + name, opts.store),
            [rdv = rdv, plane = std::weak_ptr<detail::data_plane>(rt->plane()), ranks, name,
             me = opts.rank, gave_up_key, quoted] {
              std::string why;
              if (auto p = plane.lock(); p && p->crashed()->load() != 0)
                for (int w : ranks)
                  if (auto c = p->crash_reason(w); !c.empty())
                    why += (why.empty() ? "" : "; ") + p->describe(w) + " is gone: " + c;
              if (why.empty()) why = rdv->gone_among(ranks);
              if (why.empty())
                for (const auto& l : rdv->read_gave_up(gave_up_key))
                  if (std::find(ranks.begin(), ranks.end(), l.rank) != ranks.end()) {
                    why = rdv->describe(l.rank) + " gave up creating it: " + l.reason;
                    *quoted = true;
                    break;
                  }
              if (!why.empty())
                throw error(errc::peer_failure, "new_group: rank " + std::to_string(me) +
                                                    " gave up creating group '" + name +
                                                    "': " + why);
            });
        ctx.rank = group_rank;
        ctx.size = static_cast<int>(ranks.size());
        ctx.global_ranks = ranks;
        ctx.group_name = name;
        ctx.timeout = timeout;
        ctx.device = dev;
        ctx.runtime = rt.get();
        ctx.debug = debug;
        try {
          b = detail::find_backend(bname)(ctx);
        } catch (const std::exception& e) {
          if (!*quoted) rdv->tell(gave_up_key, e);
          throw;
        }
        if (!b) throw error(errc::backend, "backend '" + bname + "' returned no backend");
      }
      backends[dev] = b;
    }
  }
  if (debug != debug_level::off) {
    std::string list;
    for (auto r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
    std::fprintf(stderr, "[troupe rank %d] group '%s' ranks [%s] backend '%s'%s\n", opts.rank,
                 name.c_str(), list.c_str(), cfg.to_string().c_str(),
                 group_rank < 0 ? " (not a member)" : "");
  }
  auto pg = std::make_shared<process_group>(name, description, group_rank, std::move(ranks),
                                            std::move(backends), std::move(unavailable), timeout);
  std::lock_guard<std::mutex> g{mtx};
  groups[name] = pg;
  return pg;
}

world::world(std::string backend, std::shared_ptr<troupe::store> store, int rank, int world_size,
             std::chrono::milliseconds timeout)
    : world([&] {
        world_options o;
        o.backend = std::move(backend);
        o.store = std::move(store);
        o.rank = rank;
        o.world_size = world_size;
        o.timeout = timeout;
        return o;
      }()) {}

world::world(world_options opts) : impl_(std::make_unique<impl>()) {
  if (!opts.store) invalid("world: store is null");
  if (opts.world_size < 1)
    invalid("world: world_size " + std::to_string(opts.world_size) +
            " must be at least 1 (a group of zero ranks cannot run collectives)");
  if (opts.rank < 0 || opts.rank >= opts.world_size)
    invalid("world: rank " + std::to_string(opts.rank) + " is out of range for world_size " +
            std::to_string(opts.world_size));
  if (opts.timeout.count() <= 0)
    invalid("world: timeout " + std::to_string(opts.timeout.count()) + " ms must be positive");
  backend_config check{opts.backend};  // throws on a bad backend string
  if (auto cpu = check.backend_for(device_type::cpu); !cpu.empty() && !is_backend_available(cpu))
    invalid("world: backend '" + cpu + "' (for device cpu, from '" + opts.backend +
            "') is not registered");
  impl_->debug = get_debug_level();  // throws on a bad TROUPE_DEBUG
  (void)detail::wait_policy::get();  // throws on a bad TROUPE_SPIN_US, _POLL_US, _GPU_WATCH_US
  const auto engines = detail::read_engine_setting();  // throws on a bad TROUPE_ENGINE
  // Throws on a bad TROUPE_TCP_CONGESTION, before this rank joins anyone.
  std::string congestion = "auto";
  if (const char* c = std::getenv("TROUPE_TCP_CONGESTION"); c && *c) congestion = c;
  detail::tcp_check_congestion(congestion);
  impl_->opts = std::move(opts);
  auto& o = impl_->opts;
  // Rendezvous: rank 0 names the job; everyone reads it. The job id keeps
  // unrelated worlds in one process apart in the in-process directory. A store
  // may serve several worlds one after another: each rank counts its joins,
  // so the k-th world on the store reads the k-th job key, never an old one.
  // A rank that does not come is named when the world's timeout passes; one
  // whose process ends is named at once where that can be told
  // (transport/rendezvous.hpp): this rank asks a tcp_store server to note
  // its end under the job's gone key.
  const auto joined = o.store->add("troupe/joined", 1);
  const std::string job_key = "troupe/job/" + std::to_string((joined - 1) / o.world_size);
  const std::string gone_key = job_key + "/gone";
  // A store that cannot tell is not asked (each rank would read it every
  // look while it waits).
  const bool told = watch_this_process(
      *o.store, gone_key,
      std::to_string(o.rank) + " " + detail::host_name() + " " + std::to_string(::getpid()) + "\n");
  impl_->rdv =
      std::make_shared<detail::rendezvous>(*o.store, o.rank, o.world_size, o.timeout,
                                           told ? gone_key : std::string(), job_key + "/gave_up");
  // Whatever makes this rank give up from here on, the others are told why
  // (they may have no other way to learn it: transport/rendezvous.hpp).
  try {
    impl_->build(job_key, congestion, engines);
  } catch (const std::exception& e) {
    impl_->rdv->give_up(e);
    throw;
  }
}

void world::impl::build(const std::string& job_key, const std::string& congestion,
                        detail::engine_setting engines) {
  const auto& o = opts;
  auto& rdv = *this->rdv;
  if (o.rank == 0) o.store->set(job_key, random_job_id());
  rdv.wait_for(
      {0}, [&](int) { return job_key; }, "start the job (write its id to the store)");
  const auto job = o.store->get_string(job_key);
  this->job_key = job_key;
  // Two scheduler threads per rank, one when the ranks outnumber the CPUs
  // (simulations of many ranks in one process: threads that only sleep).
  const bool many = o.world_size > static_cast<int>(std::thread::hardware_concurrency());
  rt = std::make_unique<detail::rank_runtime>(o.rank, job, many ? 1 : 2);
  // Ranks in other processes: the data plane (a no-op when all live here).
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  detail::data_plane_options dp;
  dp.rank = o.rank;
  dp.world_size = o.world_size;
  dp.job = job;
  dp.token = o.token.empty() ? env("TROUPE_JOB_TOKEN") : o.token;
  dp.bind_address = detail::choose_bind_address(o.bind_address, "", "world");
  dp.transport = env("TROUPE_TRANSPORT").empty() ? o.transport : env("TROUPE_TRANSPORT");
  dp.timeout = o.timeout;
  if (dp.transport != "auto" && dp.transport != "tcp" && !detail::find_transport(dp.transport))
    invalid("world: transport '" + dp.transport +
            "' (world_options.transport or TROUPE_TRANSPORT) is not auto, tcp or a registered "
            "transport (shm)");
  dp.congestion = congestion;
  dp.route = detail::to_string(engines);
  dp.heartbeat = milliseconds_from_env("TROUPE_HEARTBEAT_MS", dp.heartbeat);
  dp.unresponsive = milliseconds_from_env("TROUPE_UNRESPONSIVE_MS", dp.unresponsive);
  auto plane = std::make_shared<detail::data_plane>(dp);
  plane->connect(*o.store, rdv);
  rt->set_plane(plane);
  std::vector<int> all(static_cast<std::size_t>(o.world_size));
  for (int r = 0; r < o.world_size; ++r) all[static_cast<std::size_t>(r)] = r;
  // TROUPE_LINK_COSTS=measure across hosts: the link measured on a group of
  // its own, before the groups that choose by it.
  if (detail::measures_links(*plane, o.rank, o.world_size, *o.store, job_key + "/measure", rdv)) {
    const std::string name = "troupe:link-measurement";
    try {
      auto probe = make_group(name, all, o.timeout, "actor", "the link's measurement");
      plane->set_link_costs(detail::measure_link_costs(
          *probe, *plane, *o.store, job_key + "/link_costs", rdv, debug != debug_level::off));
    } catch (const error& e) {
      throw error(e.code(), "world: rank " + std::to_string(o.rank) +
                                ": measuring the link between hosts at start "
                                "(TROUPE_LINK_COSTS=measure): " +
                                e.what());
    }
    std::lock_guard<std::mutex> g{mtx};
    groups.erase(name);
    // Every rank read the result after rank 0 took in every message sent
    // to it: none of the measurement's is left in flight.
    plane->forget_p2p();
  }
  // Across hosts whose ranks outnumber their CPUs the groups price the
  // waits for them (cost_model::ranks_per_cpu), as every rank found the
  // same; a setting that names ranks_per_cpu, or a measurement, decides.
  if (const auto& share = plane->job_sharing(); share.hosts > 1 && plane->link_costs().empty()) {
    const auto& process = detail::cost_model::of_process();
    if (const auto m = process.with_sharing(share.ranks_per_cpu);
        m.ranks_per_cpu != process.ranks_per_cpu)
      plane->set_link_costs(m.to_text());
  }
  default_group = make_group("default", all, o.timeout, o.backend, "default group");
}

void detail::leave_together(world& w) noexcept {
  w.runtime().leaving_together()->store(true);
}

world::~world() {
  // Survivors that shrink a group count this rank out at once. A store
  // gone with its process fails this; one whose process stopped would hold
  // the destructor until the store's timeout: a second at most here.
  detail::call_until(
      [s = impl_->opts.store, key = impl_->job_key + "/left/" + std::to_string(rank())] {
        s->set(key, to_bytes("1"));
        return true;
      },
      std::chrono::steady_clock::now() + std::chrono::seconds(1));
  std::map<std::string, std::shared_ptr<process_group>> groups;
  {
    std::lock_guard<std::mutex> g{impl_->mtx};
    groups.swap(impl_->groups);
  }
  for (auto& kv : groups)
    kv.second->release("the world of rank " + std::to_string(rank()) + " was destroyed");
  impl_->default_group->release("the world was destroyed");
  impl_->rt.reset();
}

int world::rank() const noexcept {
  return impl_->opts.rank;
}
int world::size() const noexcept {
  return impl_->opts.world_size;
}
const std::shared_ptr<troupe::store>& world::get_store() const noexcept {
  return impl_->opts.store;
}
std::chrono::milliseconds world::timeout() const noexcept {
  return impl_->opts.timeout;
}
std::string world::link_costs() const {
  const auto& measured = impl_->rt->plane()->link_costs();
  return measured.empty() ? detail::cost_model::of_process().to_text() : measured;
}

const std::string& world::backend_string() const noexcept {
  return impl_->opts.backend;
}
process_group& world::default_group() {
  return *impl_->default_group;
}

std::vector<flight_entry> world::flight_record() const {
  auto out = impl_->default_group->flight_record();
  std::vector<std::shared_ptr<process_group>> groups;
  {
    std::lock_guard<std::mutex> g{impl_->mtx};
    for (auto& kv : impl_->groups) groups.push_back(kv.second);
  }
  for (auto& g : groups)
    if (g && g.get() != impl_->default_group.get() && g->is_member()) {
      auto more = g->flight_record();
      out.insert(out.end(), more.begin(), more.end());
    }
  std::stable_sort(out.begin(), out.end(), [](const flight_entry& a, const flight_entry& b) {
    return a.issued_us < b.issued_us;
  });
  return out;
}
detail::rank_runtime& world::runtime() const noexcept {
  return *impl_->rt;
}

std::shared_ptr<process_group> world::new_group(std::vector<int> ranks, new_group_options opts) {
  if (ranks.empty()) invalid("new_group: a group of zero ranks is not allowed");
  std::set<int> seen;
  for (auto r : ranks) {
    if (r < 0 || r >= size())
      invalid("new_group: rank " + std::to_string(r) + " is out of range for world_size " +
              std::to_string(size()));
    if (!seen.insert(r).second) invalid("new_group: rank " + std::to_string(r) + " appears twice");
  }
  std::sort(ranks.begin(), ranks.end());
  const bool member = seen.count(rank()) != 0;
  std::string name;
  {
    std::lock_guard<std::mutex> g{impl_->mtx};
    if (opts.use_local_synchronization) {
      if (!member) return nullptr;
      name = "ranks";
      for (auto r : ranks) name += "_" + std::to_string(r);
      name += "#" + std::to_string(impl_->local_counter[ranks]++);
    } else {
      name = "group" + std::to_string(++impl_->group_counter);
    }
  }
  return impl_->make_group(name, std::move(ranks), opts.timeout.value_or(timeout()),
                           opts.backend.empty() ? backend_string() : opts.backend,
                           opts.description);
}

namespace {

/// The registry entry of `g` (by identity: set_name may have renamed it).
std::map<std::string, std::shared_ptr<process_group>>::const_iterator check_registered(
    const std::map<std::string, std::shared_ptr<process_group>>& groups, const process_group& g,
    const char* op) {
  for (auto i = groups.begin(); i != groups.end(); ++i)
    if (i->second.get() == &g) return i;
  throw error(errc::group, std::string(op) + ": group '" + g.name() +
                               "' is not registered; create groups through new_group");
}

}  // namespace

int world::get_group_rank(const process_group& group, int global_rank) const {
  std::lock_guard<std::mutex> g{impl_->mtx};
  check_registered(impl_->groups, group, "get_group_rank");
  auto& rs = group.global_ranks();
  auto i = std::find(rs.begin(), rs.end(), global_rank);
  if (i == rs.end())
    throw error(errc::group, "get_group_rank: global rank " + std::to_string(global_rank) +
                                 " is not part of group '" + group.name() + "'");
  return static_cast<int>(i - rs.begin());
}

int world::get_global_rank(const process_group& group, int group_rank) const {
  std::lock_guard<std::mutex> g{impl_->mtx};
  check_registered(impl_->groups, group, "get_global_rank");
  if (group_rank < 0 || group_rank >= group.size())
    throw error(errc::group, "get_global_rank: group rank " + std::to_string(group_rank) +
                                 " is not part of group '" + group.name() + "' of size " +
                                 std::to_string(group.size()));
  return group.global_ranks()[static_cast<std::size_t>(group_rank)];
}

std::vector<int> world::get_process_group_ranks(const process_group& group) const {
  std::lock_guard<std::mutex> g{impl_->mtx};
  check_registered(impl_->groups, group, "get_process_group_ranks");
  return group.global_ranks();
}

void world::destroy_process_group(const std::shared_ptr<process_group>& group) {
  if (!group) return;
  {
    std::lock_guard<std::mutex> g{impl_->mtx};
    impl_->groups.erase(check_registered(impl_->groups, *group, "destroy_process_group"));
  }
  group->release("group '" + group->name() + "' was destroyed");
}

std::shared_ptr<process_group> world::shrink(process_group& group,
                                             std::chrono::milliseconds timeout) {
  if (!group.is_member())
    throw error(errc::group, "shrink: this rank is not part of group '" + group.name() + "'");
  if (timeout.count() <= 0)
    invalid("shrink: timeout " + std::to_string(timeout.count()) + " ms is not positive");
  int epoch = 0;
  {
    std::lock_guard<std::mutex> g{impl_->mtx};
    epoch = ++impl_->shrinks[group.name()];
  }
  auto& st = *impl_->opts.store;
  const auto prefix =
      impl_->job_key + "/shrink/" + group.name() + "/" + std::to_string(epoch) + "/";
  const auto& members = group.global_ranks();
  // Revoke the old group here (ULFM's MPI_Comm_revoke): this rank leaves it,
  // so a survivor still blocked in it, waiting for this rank (a receive from
  // a neighbour, a collective the dead rank was not part of yet), fails at
  // once and comes to recover too, instead of at its timeout.
  group.release("group '" + group.name() + "' was revoked: world rank " + std::to_string(rank()) +
                " recovers from a failure (world::shrink)");
  st.set(prefix + "alive/" + std::to_string(rank()), to_bytes("1"));
  // 1. Who is left: every member checked in, or is known gone, or the time is up.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto decided_key = prefix + "members";
  std::vector<int> alive;
  std::string decided;
  for (;;) {
    if (st.check({decided_key})) break;  // another survivor decided already
    alive.clear();
    bool undecided = false;
    for (int r : members) {
      const auto id = std::to_string(r);
      if (st.check({prefix + "alive/" + id}))
        alive.push_back(r);
      else if (impl_->rdv->gone(r).empty() && !st.check({impl_->job_key + "/left/" + id}))
        undecided = true;
    }
    if (!undecided || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  // 2. Agree: the first proposal written wins; everyone reads the same list.
  std::string proposal;
  for (int r : alive) proposal += (proposal.empty() ? "" : " ") + std::to_string(r);
  if (!st.check({decided_key}) && proposal.empty())
    throw error(errc::timeout, "shrink: group '" + group.name() + "': no survivor checked in");
  decided = to_string(st.compare_set(decided_key, bytes{}, to_bytes(proposal)));
  std::vector<int> survivors;
  for (std::size_t i = 0; i < decided.size();) {
    const auto sp = decided.find(' ', i);
    survivors.push_back(std::atoi(decided.c_str() + i));
    if (sp == std::string::npos) break;
    i = sp + 1;
  }
  if (std::find(survivors.begin(), survivors.end(), rank()) == survivors.end())
    throw error(errc::peer_failure, "shrink: group '" + group.name() + "': the survivors (" +
                                        decided + ") counted this rank (" + std::to_string(rank()) +
                                        ") out: it came too late");
  const auto name = group.name() + "~" + std::to_string(epoch);
  auto g = impl_->make_group(name, survivors, this->timeout(), backend_string(),
                             group.description() + " (shrunk to " + decided + ")");
  return g;
}

void world::abort(const std::string& reason) {
  std::lock_guard<std::mutex> g{impl_->mtx};
  for (auto& kv : impl_->groups) kv.second->abort(reason);
}

}  // namespace troupe
