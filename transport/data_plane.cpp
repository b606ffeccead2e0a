// data_plane (data_plane.hpp): set-up — where every rank lives, the
// listening socket, connecting to and introducing this rank to every process
// peer — and what it knows of each rank.

#include "transport/data_plane.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "base/process_directory.hpp"
#include "base/wait_policy.hpp"
#include "memory/peer_memory.hpp"
#include "transport/data_plane_parts.hpp"
#include "transport/link.hpp"
#include "transport/rank_places.hpp"
#include "transport/rendezvous.hpp"
#include "transport/shm_ring.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

using namespace std::chrono_literals;

std::string process_identity() {
  // Made again in a forked child: it is another process.
  static std::mutex m;
  static pid_t owner = 0;
  static std::string id;
  std::lock_guard<std::mutex> g{m};
  if (owner != ::getpid()) {
    owner = ::getpid();
    std::random_device rd;
    id = std::to_string(rd()) + std::to_string(rd()) + "-" + std::to_string(owner);
  }
  return id;
}

std::string host_name() {
  // TROUPE_HOSTNAME names the host instead (processes that say different
  // names are on different hosts to troupe: tests of what crosses hosts).
  if (const char* name = std::getenv("TROUPE_HOSTNAME"); name && *name) return name;
  char buf[256] = {};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

namespace {

/// "host port" as the store holds it.
std::pair<std::string, std::uint16_t> parse_address(int r, const std::string& addr) {
  const auto sp = addr.rfind(' ');
  int port = -1;
  if (sp != std::string::npos && sp > 0) port = std::atoi(addr.c_str() + sp + 1);
  if (port <= 0 || port > 65535)
    throw error(errc::backend, "data plane: rank " + std::to_string(r) +
                                   "'s address in the store is malformed: '" + addr + "'");
  return {addr.substr(0, sp), static_cast<std::uint16_t>(port)};
}

}  // namespace

data_plane::data_plane(data_plane_options opts)
    : opts_(std::move(opts)), local_(std::make_shared<peer>()) {}

data_plane::~data_plane() {
  close();
}

void data_plane::close() {
  std::call_once(closed_, [this] { close_once(); });
}

void data_plane::close_once() {
  // Say goodbye first, so peers tell a rank that left from one that crashed,
  // and name the rank whose failure made this one leave, if any.
  const int first = first_cause_.load();
  const int cause = first < 0 ? -1 : first / 256;
  const auto kind = first < 0 ? failure_kind::failed : static_cast<failure_kind>(first % 256);
  for (auto& p : peers_) {
    std::lock_guard<futex_lock> g{p->out_mtx};
    if (p->out && !p->gone) say_goodbye(*p, cause, kind);
  }
  {
    // From here on no connection is adopted (that happens under mtx_).
    std::lock_guard<std::mutex> g{mtx_};
    stopping_ = true;
  }
  if (wake_[1] >= 0) [[maybe_unused]]
    auto n = ::write(wake_[1], "x", 1);
  if (acceptor_.joinable()) acceptor_.join();  // no thread starts from here on
  {
    std::lock_guard<std::mutex> h{heart_mtx_};  // stopping_ is seen, or it waits
  }
  heart_cv_.notify_all();
  if (heart_.joinable()) heart_.join();
  {
    std::lock_guard<std::mutex> g{mtx_};
    for (auto& p : peers_) {
      if (p->out_link) p->out_link->close();
      if (p->out_socket) p->out_socket->close();
      if (p->in_link) p->in_link->close();
      if (p->in_socket) p->in_socket->close();
    }
  }
  std::map<std::uint64_t, std::thread> readers;
  {
    std::lock_guard<std::mutex> g{mtx_};
    readers.swap(readers_);
  }
  for (auto& [id, t] : readers) {
    if (t.get_id() != std::this_thread::get_id()) {
      t.join();
      continue;
    }
    // Closed from this reader (a callback it ran ended the world): it cannot
    // join itself. It goes on when the close returns, out of its loop (the
    // connections are closed), holding the plane until it ends. (Not when
    // the destructor closes here: the owner closes first, so that it cannot.)
    if (auto* keep = detach_reader(this)) *keep = weak_from_this().lock();
    t.detach();
  }
  // The routes hold the group actors' handles: released now, not when the
  // last holder lets go (the actor system of a world that ended on a reader
  // thread waits for its actors while that thread still holds the plane).
  decltype(routes_) routes;
  {
    std::lock_guard<std::mutex> g{mtx_};
    routes.swap(routes_);
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  for (int& fd : wake_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

void data_plane::connect(store& s, rendezvous& rdv) {
  const auto prefix = "troupe/" + opts_.job + "/";
  const auto me = opts_.rank;
  std::vector<int> all;
  for (int r = 0; r < opts_.world_size; ++r) all.push_back(r);
  // 1. Where does every rank live? Each writes its process and counts itself
  // in; then one rank of each process reads every entry into the table the
  // ranks of this process share.
  auto proc_key = [&](int r) { return prefix + "proc/" + std::to_string(r); };
  s.set(proc_key(me), process_identity() + " " + host_name() + " " + std::to_string(::getpid()) +
                          " " + opts_.route + " " + std::to_string(host_cpus()));
  rdv.wait_for_everyone(prefix + "procs", proc_key,
                        "join the world (write their process identity to the store)");
  struct places_slot {
    std::mutex mtx;
    std::shared_ptr<const rank_places> table;
  };
  auto slot = shared_in_process<places_slot>("rank places/" + opts_.job,
                                             [] { return std::make_unique<places_slot>(); });
  {
    std::lock_guard<std::mutex> g{slot->mtx};
    if (!slot->table) {
      std::vector<std::string> keys;
      for (int r : all) keys.push_back(proc_key(r));
      slot->table = std::make_shared<const rank_places>(
          read_rank_places(s.multi_get(keys), process_identity()));
    }
    places_ = slot->table;
  }
  places_slot_ = std::move(slot);  // a rank of this process that comes later finds the table
  const auto& t = *places_;
  // Frames of one route are dropped unread by the other: such a job would
  // wait for a timeout. Every rank read the same entries: all of them say it.
  if (std::any_of(t.processes.begin(), t.processes.end(),
                  [&](const auto& p) { return p.route != opts_.route; })) {
    std::string differ;  // the first ranks whose route is not this rank's
    int differing = 0;
    for (int r : all)
      if (const auto& route = t.of(r).route; route != opts_.route && ++differing <= 4)
        differ += (differ.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) +
                  " has '" + route.substr(0, 16) + "'";
    throw error(errc::invalid_argument,
                "world: rank " + std::to_string(me) + " runs collectives with TROUPE_ENGINE '" +
                    opts_.route + "' but " + differ +
                    (differing > 4 ? " (and " + std::to_string(differing - 4) + " more)" : "") +
                    "; every rank of a job must use the same TROUPE_ENGINE");
  }
  const auto& here = t.processes[static_cast<std::size_t>(t.here)];
  local_->process = here.identity;
  local_->host = here.host;
  local_->pid = here.pid;
  local_->local = true;
  for (const auto& p : t.processes)
    if (&p == &here || p.host == host_name()) host_ranks_ += p.ranks;
  job_sharing_ = sharing_of(t);
  remote_count_ = opts_.world_size - here.ranks;
  // The ranks of this process share one record (they have no connection);
  // a rank of another process gets its own.
  if (remote_count_ > 0) {
    peers_.assign(static_cast<std::size_t>(opts_.world_size), local_);
    for (int r : all) {
      if (t.local(r)) continue;
      const auto& where = t.of(r);
      auto p = std::make_shared<peer>();
      p->process = where.identity;
      p->host = where.host;
      p->pid = where.pid;
      p->same_host = where.host == host_name();
      peers_[static_cast<std::size_t>(r)] = std::move(p);
    }
  }
  rdv.learn(places_);
  // Ring readers linger only while every rank of this host may have a CPU
  // of its own (as waits spin only then): with more ranks than CPUs the
  // readers' yields would take turns with the ranks' own.
  ring_linger_ = wait_policy::get().for_ranks(host_ranks_).spin > std::chrono::nanoseconds{0}
                     ? shm_ring::linger
                     : std::chrono::microseconds{0};
  if (remote_count_ == 0) return;
  if (opts_.token.empty())
    throw error(errc::invalid_argument,
                "world: ranks live in several processes but no job token was given; set "
                "TROUPE_JOB_TOKEN (troupe-run does) so every connection can prove it belongs "
                "to the job");
  // 2. Listen and tell the others where.
  listen_fd_ = tcp_listen(opts_.bind_address, 0);
  ::fcntl(listen_fd_, F_SETFL, ::fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);  // accepted until EAGAIN
  port_ = tcp_local_port(listen_fd_);
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
    throw error(errc::backend, std::string("data plane: pipe: ") + std::strerror(errno));
  s.set(prefix + "addr/" + std::to_string(me), opts_.bind_address + " " + std::to_string(port_));
  acceptor_ = std::thread([this] { accept_loop(); });
  // The failure detector beats each peer as soon as this rank's connection
  // to it is there (a rank late to build its world holds this one back in
  // steps 3 and 4: its peers hear this one meanwhile), and listens from
  // step 4 on (transport/data_plane_heartbeat.cpp).
  if (opts_.heartbeat.count() > 0 || opts_.unresponsive.count() > 0)
    heart_ = std::thread([this] { heartbeat_loop(); });
  // 3. Connect to every process peer and introduce ourselves.
  for (int r : all) {
    auto& p = at(r);
    if (p.local) continue;
    auto addr_key = [&](int q) { return prefix + "addr/" + std::to_string(q); };
    rdv.wait_for({r}, addr_key, "publish its data-plane address");
    const auto addr = s.get_string(addr_key(r));
    const auto [host, port] = parse_address(r, addr);
    const std::string what =
        "accept this rank's connection at " + host + ":" + std::to_string(port);
    const auto waiting = "rank " + std::to_string(r) + " to " + what;
    int fd = -1;
    while (fd < 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          rdv.deadline() - std::chrono::steady_clock::now());
      try {
        fd = tcp_connect(host, port, std::clamp(left, std::chrono::milliseconds(1), rdv.slice));
      } catch (const error& e) {
        if (e.code() != errc::timeout) throw;
        rdv.check(all, waiting);  // a rank that gave up closed its port
        if (left <= rdv.slice) rdv.timed_out({r}, what);
      }
    }
    p.out_socket = std::make_unique<tcp_stream>(fd);
    tcp_choose_congestion(fd, opts_.congestion);  // before its first byte
    hello h{opts_.token, me, static_cast<std::int32_t>(::getpid()), host_name(), opts_.job, {}};
    // A transport's link, where one joins the pair (transport/link.hpp).
    const auto* link = transport_for(opts_.transport, {me, r, p.same_host, 0});
    if (link) {
      p.out_link = link->open_out({me, r, p.same_host, 0});
      h.link = link->name + " " + p.out_link->address();
    }
    const auto bytes = encode_hello(h);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        rdv.deadline() - std::chrono::steady_clock::now());
    tcp_set_read_timeout(fd, std::max(left, std::chrono::milliseconds(1)));
    char ack = 0;
    const bool answered =
        p.out_socket->write(bytes.data(), bytes.size()) && p.out_socket->read(&ack, 1);
    tcp_set_read_timeout(fd, std::chrono::milliseconds(0));
    if (!answered) {
      // It gave up (because a rank is gone?), is dying, or took too long: a
      // death shows through the store or its pidfd a moment after its
      // sockets closed, so look for a while before blaming the handshake.
      const auto until = std::min(rdv.deadline(), std::chrono::steady_clock::now() + 1s);
      do {
        rdv.check(all, waiting);
        std::this_thread::sleep_for(rdv.slice / 4);
      } while (std::chrono::steady_clock::now() < until);
      if (std::chrono::steady_clock::now() >= rdv.deadline()) rdv.timed_out({r}, what);
    }
    if (!answered || (ack != 1 && ack != 2))
      throw error(errc::backend, "data plane: " + rdv.describe(r) + " at " + host + ":" +
                                     std::to_string(port) +
                                     " closed this rank's connection without accepting it (a "
                                     "wrong job token, or it gave up building its world)");
    // 1: it opened the link (nothing else may now); 2: it cannot, and reads
    // this rank's frames from the socket.
    if (ack == 2 && p.out_link) {
      p.out_link.reset();
      if (link->maps_memory) p.memory_closed = true;
    }
    if (p.out_link) p.out_link->opened();
    std::lock_guard<futex_lock> beating{p.out_mtx};  // the heartbeat may look
    p.out = p.out_link ? static_cast<byte_stream*>(p.out_link.get()) : p.out_socket.get();
  }
  // 4. Wait until every process peer connected to us.
  const std::string what = "connect to rank " + std::to_string(me);
  std::unique_lock<std::mutex> g{mtx_};
  while (connected_ < remote_count_) {
    connected_cv_.wait_for(g, rdv.slice);
    if (connected_ == remote_count_) break;
    std::vector<int> missing;
    for (int r : all)
      if (!at(r).local && !at(r).in_socket) missing.push_back(r);
    g.unlock();
    rdv.check(all, rank_list(missing) + " to " + what);
    if (std::chrono::steady_clock::now() >= rdv.deadline()) rdv.timed_out(missing, what);
    g.lock();
  }
  // 5. The failure detector listens, once every connection is there.
  listening_ = true;
}

const std::string& data_plane::host_of(int r) const {
  return at(r).host;
}

bool data_plane::is_local(int r) const {
  return at(r).local;
}

int data_plane::pid_of(int r) const {
  return at(r).pid;
}

bool data_plane::shares_memory(int r) const {
  auto& p = at(r);
  return p.local || (p.same_host && opts_.transport != "tcp" && !p.memory_closed.load());
}

int data_plane::ranks_on_host() const {
  return host_ranks_;
}

data_plane::sharing data_plane::sharing_of(const rank_places& t) {
  // Per host: its ranks, and the fewest CPUs one of its processes may use.
  std::map<std::string, std::pair<int, int>> hosts;
  for (const auto& p : t.processes) {
    auto [it, fresh] = hosts.emplace(p.host, std::make_pair(0, p.cpus));
    it->second.first += p.ranks;
    if (p.cpus > 0 && (it->second.second <= 0 || p.cpus < it->second.second))
      it->second.second = p.cpus;
  }
  sharing s;
  s.hosts = static_cast<int>(hosts.size());
  for (const auto& [host, ranks_cpus] : hosts)
    if (const auto [ranks, cpus] = ranks_cpus; cpus > 0)
      s.ranks_per_cpu = std::max(s.ranks_per_cpu, double(ranks) / cpus);
  return s;
}

bool data_plane::cpu_per_rank() const {
  return host_ranks_ <= host_cpus();
}

std::string data_plane::describe(int r) const {
  auto& p = at(r);
  return "world rank " + std::to_string(r) + " (host " + p.host + ", pid " + std::to_string(p.pid) +
         ")";
}

}  // namespace troupe::detail
