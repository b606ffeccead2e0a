#include "transport/data_plane.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <random>

#include "transport/data_plane_parts.hpp"
#include "transport/rendezvous.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

using namespace std::chrono_literals;

namespace {

/// Writes to a socket without blocking; while the socket is full it calls
/// `while_full` and waits briefly for room.
class nonblocking_stream final : public byte_stream {
 public:
  nonblocking_stream(int fd, const std::function<void()>& while_full,
                     std::chrono::steady_clock::time_point deadline)
      : fd_(fd), while_full_(while_full), deadline_(deadline) {}
  bool write(const void* data, std::size_t n) override {
    auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const auto w = ::send(fd_, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        p += w;
        n -= static_cast<std::size_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (std::chrono::steady_clock::now() >= deadline_) return false;
        if (while_full_) while_full_();
        pollfd pf{fd_, POLLOUT, 0};
        ::poll(&pf, 1, 1);
        continue;
      }
      return false;
    }
    return true;
  }
  bool read(void*, std::size_t) override { return false; }
  void close() override {}

 private:
  int fd_;
  const std::function<void()>& while_full_;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace

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
  char buf[256] = {};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

namespace {

constexpr std::size_t ring_capacity = std::size_t{4} << 20;

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

data_plane::data_plane(data_plane_options opts) : opts_(std::move(opts)) {
  for (int r = 0; r < opts_.world_size; ++r) peers_.push_back(std::make_unique<peer>());
}

data_plane::~data_plane() {
  // Say goodbye first, so peers tell a rank that left from one that crashed,
  // and name the rank whose failure made this one leave, if any.
  const int cause = first_cause_.load();
  for (auto& p : peers_) {
    std::lock_guard<std::mutex> g{p->out_mtx};
    if (p->out && !p->gone) write_goodbye(*p->out, cause);
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
    std::lock_guard<std::mutex> g{mtx_};
    for (auto& p : peers_) {
      if (p->out_ring) p->out_ring->close();
      if (p->out_socket) p->out_socket->close();
      if (p->in_ring) p->in_ring->close();
      if (p->in_socket) p->in_socket->close();
    }
  }
  std::map<std::uint64_t, std::thread> readers;
  {
    std::lock_guard<std::mutex> g{mtx_};
    readers.swap(readers_);
  }
  for (auto& [id, t] : readers) t.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (int fd : wake_)
    if (fd >= 0) ::close(fd);
}

void data_plane::connect(store& s, rendezvous& rdv) {
  const auto prefix = "troupe/" + opts_.job + "/";
  const auto me = opts_.rank;
  std::vector<int> all;
  for (int r = 0; r < opts_.world_size; ++r) all.push_back(r);
  // 1. Where does every rank live?
  auto proc_key = [&](int r) { return prefix + "proc/" + std::to_string(r); };
  s.set(proc_key(me), process_identity() + " " + host_name() + " " + std::to_string(::getpid()));
  rdv.wait_for(all, proc_key, "join the world (write their process identity to the store)");
  std::vector<std::string> keys;
  for (int r : all) keys.push_back(proc_key(r));
  const auto values = s.multi_get(keys);
  for (int r : all) {
    const auto v = troupe::to_string(values[static_cast<std::size_t>(r)]);
    auto& p = at(r);
    const auto a = v.find(' '), b = v.rfind(' ');
    if (a == std::string::npos || a == b)
      throw error(errc::backend, "data plane: rank " + std::to_string(r) +
                                     "'s process identity in the store is malformed: '" + v + "'");
    p.process = v.substr(0, a);
    p.host = v.substr(a + 1, b - a - 1);
    p.pid = std::atoi(v.c_str() + b + 1);
    p.local = p.process == process_identity();
    p.same_host = !p.local && p.host == host_name();
    if (!p.local) ++remote_count_;
    rdv.learn(r, p.host, p.pid);
  }
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
    hello h{opts_.token, me, static_cast<std::int32_t>(::getpid()), host_name(), opts_.job, {}};
    if (p.same_host && opts_.transport != "tcp") {
      h.ring = "/troupe-" + opts_.job + "-" + std::to_string(me) + "-" + std::to_string(r);
      p.out_ring = shm_ring::create(h.ring, ring_capacity);
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
    if (!answered || ack != 1)
      throw error(errc::backend, "data plane: " + rdv.describe(r) + " at " + host + ":" +
                                     std::to_string(port) +
                                     " closed this rank's connection without accepting it (a "
                                     "wrong job token, or it gave up building its world)");
    p.out = p.out_ring ? static_cast<byte_stream*>(p.out_ring.get()) : p.out_socket.get();
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
}

std::string data_plane::admit(int r, const frame_header& h, const std::string& group, bool& skip) {
  auto& p = at(r);
  p.current.reset();
  if (h.kind == frame_goodbye) return {};
  {
    std::lock_guard<std::mutex> g{mtx_};
    if (auto i = routes_.find(group); i != routes_.end()) p.current = i->second;
  }
  const auto* rt = p.current.get();
  // A group that does not exist here (destroyed, or never joined): dropped unread.
  if (!rt || (h.kind == frame_inline ? !rt->sink : !rt->actor)) {
    skip = true;
    return {};
  }
  return check_sender(h, group, rt->members, r);
}

bool data_plane::dispatch(int r, received_frame& f, std::string& refusal) {
  auto& p = at(r);
  if (f.header.kind == frame_goodbye) {
    // A rank that left on purpose: only calls still waiting for it fail
    // (what it sent before it left still counts), naming the rank it blames.
    const int cause = f.header.src;
    const bool blames = cause >= 0 && cause < opts_.world_size && cause != r;
    peer_gone(r,
              blames ? "it left the job after " + describe(cause) + " failed" : "it left the job",
              false, blames ? cause : -1);
    return false;
  }
  const auto rt = std::move(p.current);  // checked by admit()
  if (!rt) return true;
  if (f.header.kind == frame_inline) {
    refusal = rt->sink(f);
    return refusal.empty();
  }
  if (f.header.kind == frame_collective)
    caf::anon_send(
        rt->actor, data_atom::value,
        envelope{f.header.seq, f.header.step, f.header.src, static_cast<op_code>(f.header.code),
                 std::move(f.payload), std::move(f.fp)});
  else
    caf::anon_send(rt->actor, msg_atom::value,
                   p2p_envelope{f.header.src, f.header.tag, std::move(f.payload)});
  return true;
}

bool data_plane::drain(int r, bool& any) {
  auto& p = at(r);
  if (p.over) return false;
  std::string refusal, why;
  try {
    auto on_frame = [&](received_frame& f) {
      any = true;
      return dispatch(r, f, refusal);
    };
    auto admit_frame = [&](const frame_header& h, const std::string& group, bool& skip) {
      return admit(r, h, group, skip);
    };
    // Fabric payloads may go where their operation posted a receive.
    auto place = [&](const frame_header& h, const std::string&) {
      const auto& rt = p.current;
      return h.kind == frame_inline && rt && rt->place ? rt->place(h) : posted_receive{};
    };
    why = p.in_ring
              ? p.reader.drain([&](void* d, std::size_t n) { return p.in_ring->read_some(d, n); },
                               on_frame, place, admit_frame)
              : p.reader.drain(p.in_socket->fd(), on_frame, place, admit_frame);
  } catch (const std::exception& e) {
    why = std::string("reading its frames failed: ") + e.what();
  } catch (...) {
    why = "reading its frames failed: an unknown exception";
  }
  if (why.empty()) return true;
  p.over = true;
  p.current.reset();
  if (why == "stopped" && refusal.empty()) return false;  // a goodbye, already handled
  if (!refusal.empty()) why = refusal;
  if (why == "connection closed" || why.rfind("connection broke", 0) == 0) {
    peer_gone(r, "its process died or its connection broke (" + why + ")", true);
    return false;
  }
  reject(r, why);  // a frame broke the rules: the peer fails, the process goes on
  return false;
}

void data_plane::reader_loop(int r) {
  auto& p = at(r);
  // Waits up to 100 ms for bytes; false once nothing more can come.
  auto wait = [&]() -> bool {
    if (p.in_ring) return p.in_ring->wait_readable(std::chrono::milliseconds(100));
    pollfd pf{p.in_socket->fd(), POLLIN, 0};
    return ::poll(&pf, 1, 100) >= 0 || errno == EINTR;
  };
  for (;;) {
    {
      // Park while a waiting thread reads this connection itself; look again
      // every 2 ms (a pumper that stops without waking us is seen then).
      std::unique_lock<std::mutex> g{p.in_mtx};
      if (p.over || stopping_) return;
      if (p.pumpers.load() > 0) {
        p.park.wait_for(g, std::chrono::milliseconds(2));
        continue;
      }
    }
    const bool open = wait();
    if (stopping_) return;
    std::lock_guard<std::mutex> g{p.in_mtx};
    bool any = false;
    if (!drain(r, any) || (!open && !any)) return;
  }
}

bool data_plane::reads_socket(int r) const {
  auto& p = at(r);
  return p.in_socket && !p.in_ring;
}

bool data_plane::pump(int r) {
  auto& p = at(r);
  if (!p.in_socket && !p.in_ring) return false;
  std::unique_lock<std::mutex> g{p.in_mtx, std::try_to_lock};
  if (!g.owns_lock()) return false;
  bool any = false;
  drain(r, any);
  return any;
}

void data_plane::pumping(int r, int delta, bool wake) {
  auto& p = at(r);
  if (p.pumpers.fetch_add(delta) + delta == 0 && wake) {
    std::lock_guard<std::mutex> g{p.in_mtx};
    p.park.notify_all();
  }
}

std::string data_plane::gone_reason(int r) {
  auto& p = at(r);
  if (!p.gone.load()) return {};
  std::lock_guard<std::mutex> g{mtx_};
  return p.gone_why;
}

std::string data_plane::crash_reason(int r) {
  auto& p = at(r);
  if (!p.gone.load()) return {};
  std::lock_guard<std::mutex> g{mtx_};
  return p.crashed ? p.gone_why : std::string();
}

void data_plane::peer_gone(int r, const std::string& why, bool crashed, int cause) {
  auto& p = at(r);
  if (stopping_) return;
  std::vector<group_actor> targets;
  {
    std::lock_guard<std::mutex> g{mtx_};
    if (p.gone.load()) return;
    p.gone_why = why;
    p.crashed = crashed;
    p.gone.store(true);
    for (auto& kv : routes_)
      if (kv.second->actor) targets.push_back(kv.second->actor);
  }
  // Whom this rank's own goodbye will blame: the first failure it learned of.
  if (const int blame = cause >= 0 ? cause : crashed ? r : -1; blame >= 0) {
    int none = -1;
    first_cause_.compare_exchange_strong(none, blame);
  }
  if (crashed) crashes_->fetch_add(1);
  // Sends to it fail at once (not under out_mtx: a writer blocked on the
  // full ring of a dead peer holds it until the ring closes).
  if (p.out_ring) p.out_ring->close();
  if (p.out_socket) p.out_socket->close();
  for (auto& t : targets) caf::anon_send(t, gone_atom::value, r, why, crashed);
}

void data_plane::reject(int r, const std::string& why) {
  if (stopping_ || at(r).gone.load()) return;  // dropped once
  std::fprintf(stderr, "[troupe rank %d] dropping the connection of %s: %s\n", opts_.rank,
               describe(r).c_str(), why.c_str());
  peer_gone(r, "its connection was dropped: it sent " + why, true);
  std::lock_guard<std::mutex> g{mtx_};
  auto& p = at(r);
  if (p.in_socket) p.in_socket->close();  // its reader ends; the peer sees the end
  if (p.in_ring) p.in_ring->close();
}

bool data_plane::is_local(int r) const {
  return at(r).local;
}

bool data_plane::shares_memory(int r) const {
  auto& p = at(r);
  return p.local || (p.same_host && opts_.transport != "tcp");
}

std::string data_plane::describe(int r) const {
  auto& p = at(r);
  return "world rank " + std::to_string(r) + " (host " + p.host + ", pid " + std::to_string(p.pid) +
         ")";
}

template <class Envelope>
void data_plane::send_frame(int r, const std::string& group, const Envelope& env) {
  auto& p = at(r);
  std::lock_guard<std::mutex> g{p.out_mtx};
  if (!p.out || p.gone) return;  // the peer is gone: the waiting side fails the call
  write_frame(*p.out, group, env);
}

void data_plane::send(int r, const std::string& group, const envelope& env) {
  send_frame(r, group, env);
}

void data_plane::send(int r, const std::string& group, const p2p_envelope& env) {
  send_frame(r, group, env);
}

void data_plane::send_inline(int r, const std::string& group, const envelope& env,
                             const std::function<void()>& while_full,
                             std::chrono::steady_clock::time_point deadline) {
  auto& p = at(r);
  {
    std::lock_guard<std::mutex> g{p.out_mtx};
    if (!p.out || p.gone) return;  // the peer is gone: the waiting side fails the call
    if (p.out != p.out_socket.get()) {
      write_frame(*p.out, group, env, frame_inline);
      return;
    }
    nonblocking_stream out{p.out_socket->fd(), while_full, deadline};
    if (write_frame(out, group, env, frame_inline)) return;
    p.out_socket->close();
  }
  peer_gone(r, "it took no data for the length of an operation's timeout (connection closed)",
            true);
}

bool data_plane::send_raw(int r, const void* data, std::size_t n) {
  auto& p = at(r);
  std::lock_guard<std::mutex> g{p.out_mtx};
  return p.out && !p.gone && p.out->write(data, n);
}

void data_plane::set_route(const std::string& group, const std::function<void(route&)>& change) {
  std::lock_guard<std::mutex> g{mtx_};
  auto i = routes_.find(group);
  auto next = std::make_shared<route>(i == routes_.end() ? route{} : *i->second);
  change(*next);
  if (!next->actor && !next->sink)
    routes_.erase(group);
  else
    routes_[group] = std::move(next);
}

void data_plane::add_sink(const std::string& group, const std::vector<int>& members,
                          inline_sink sink, inline_place place) {
  set_route(group, [&](route& rt) {
    rt.members = members;
    rt.sink = std::move(sink);
    rt.place = std::move(place);
  });
}

void data_plane::remove_sink(const std::string& group) {
  set_route(group, [](route& rt) {
    rt.sink = nullptr;
    rt.place = nullptr;
  });
}

void data_plane::add_group(const std::string& group, const std::vector<int>& members,
                           const group_actor& actor) {
  set_route(group, [&](route& rt) {
    rt.members = members;
    rt.actor = actor;
  });
  // Peers gone before the group existed fail its calls as well.
  for (int r = 0; r < opts_.world_size; ++r) {
    auto& p = at(r);
    if (!p.gone.load()) continue;
    std::string why;
    bool crashed = false;
    {
      std::lock_guard<std::mutex> g{mtx_};
      why = p.gone_why;
      crashed = p.crashed;
    }
    caf::anon_send(actor, gone_atom::value, r, why, crashed);
  }
}

void data_plane::remove_group(const std::string& group) {
  set_route(group, [](route& rt) { rt.actor = nullptr; });
}

}  // namespace troupe::detail
