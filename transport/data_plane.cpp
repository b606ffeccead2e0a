#include "transport/data_plane.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <random>

#include "transport/shm_ring.hpp"
#include "transport/tcp_stream.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

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

struct data_plane::peer {
  std::string process;  // identity of the peer's process
  std::string host;
  int pid = 0;
  bool local = false;      // same process
  bool same_host = false;  // same host, other process
  // Outgoing: the stream frames are written to, and the socket that carries
  // them or (with shared memory) only proves liveness.
  std::mutex out_mtx;
  std::unique_ptr<tcp_stream> out_socket;
  std::unique_ptr<shm_ring> out_ring;
  byte_stream* out = nullptr;
  // Incoming.
  std::unique_ptr<tcp_stream> in_socket;
  std::unique_ptr<shm_ring> in_ring;
  std::atomic<bool> gone{false};
  std::string gone_why;  // set (under in_mtx) before `gone`
  // Reading the socket: whoever holds in_mtx (reader thread or a pumping waiter).
  mutable std::mutex in_mtx;
  frame_reader reader;
  std::atomic<int> pumpers{0};
  std::condition_variable park;  // the reader thread waits here while pumpers > 0
  bool over = false;             // the connection ended (under in_mtx)
};

namespace {

constexpr char hello_magic[8] = {'T', 'R', 'O', 'U', 'P', 'E', 'H', '1'};
constexpr std::size_t ring_capacity = std::size_t{4} << 20;

/// Identifies this process among the ranks of a job (same value for every
/// world in the process, different in every other process).
const std::string& process_identity() {
  static const std::string id = [] {
    std::random_device rd;
    return std::to_string(rd()) + std::to_string(rd()) + "-" + std::to_string(::getpid());
  }();
  return id;
}

std::string host_name() {
  char buf[256] = {};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

void put_string(std::string& out, const std::string& s) {
  auto n = static_cast<std::uint16_t>(s.size());
  out.append(reinterpret_cast<const char*>(&n), sizeof(n));
  out += s;
}

bool get_string(byte_stream& in, std::string& s, std::size_t max) {
  std::uint16_t n = 0;
  if (!in.read(&n, sizeof(n)) || n > max) return false;
  s.resize(n);
  return n == 0 || in.read(s.data(), n);
}

bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

data_plane::data_plane(data_plane_options opts) : opts_(std::move(opts)) {
  for (int r = 0; r < opts_.world_size; ++r) peers_.push_back(std::make_unique<peer>());
}

data_plane::~data_plane() {
  // Say goodbye first, so peers tell a rank that left from one that crashed.
  for (auto& p : peers_) {
    std::lock_guard<std::mutex> g{p->out_mtx};
    if (p->out && !p->gone) write_goodbye(*p->out);
  }
  {
    // From here on no thread starts and no connection is adopted (both happen
    // under mtx_), so closing what exists reaches every blocked reader.
    std::lock_guard<std::mutex> g{mtx_};
    stopping_ = true;
    if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
    for (auto& p : peers_) {
      if (p->out_ring) p->out_ring->close();
      if (p->out_socket) p->out_socket->close();
      if (p->in_ring) p->in_ring->close();
      if (p->in_socket) p->in_socket->close();
    }
  }
  for (;;) {  // threads may still have started threads before stopping_ was set
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> g{mtx_};
      threads.swap(threads_);
    }
    if (threads.empty()) break;
    for (auto& t : threads) t.join();
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void data_plane::connect(store& s) {
  const auto prefix = "troupe/" + opts_.job + "/";
  const auto me = opts_.rank;
  // 1. Where does every rank live?
  s.set(prefix + "proc/" + std::to_string(me),
        process_identity() + " " + host_name() + " " + std::to_string(::getpid()));
  std::vector<std::string> keys;
  for (int r = 0; r < opts_.world_size; ++r) keys.push_back(prefix + "proc/" + std::to_string(r));
  s.wait(keys, opts_.timeout);
  for (int r = 0; r < opts_.world_size; ++r) {
    auto v = s.get_string(keys[static_cast<std::size_t>(r)]);
    auto& p = *peers_[static_cast<std::size_t>(r)];
    auto a = v.find(' '), b = v.rfind(' ');
    p.process = v.substr(0, a);
    p.host = v.substr(a + 1, b - a - 1);
    p.pid = std::atoi(v.c_str() + b + 1);
    p.local = p.process == process_identity();
    p.same_host = !p.local && p.host == host_name();
    if (!p.local) ++remote_count_;
  }
  if (remote_count_ == 0) return;
  if (opts_.token.empty())
    throw error(errc::invalid_argument,
                "world: ranks live in several processes but no job token was given; set "
                "TROUPE_JOB_TOKEN (troupe-run does) so every connection can prove it belongs "
                "to the job");
  // 2. Listen and tell the others where.
  listen_fd_ = tcp_listen(opts_.bind_address, 0);
  s.set(prefix + "addr/" + std::to_string(me),
        opts_.bind_address + " " + std::to_string(tcp_local_port(listen_fd_)));
  {
    std::lock_guard<std::mutex> g{mtx_};
    threads_.emplace_back([this] { accept_loop(); });
  }
  // 3. Connect to every process peer and introduce ourselves.
  for (int r = 0; r < opts_.world_size; ++r) {
    auto& p = *peers_[static_cast<std::size_t>(r)];
    if (p.local) continue;
    const auto key = prefix + "addr/" + std::to_string(r);
    s.wait({key}, opts_.timeout);
    auto addr = s.get_string(key);
    auto sp = addr.find(' ');
    int fd = tcp_connect(addr.substr(0, sp),
                         static_cast<std::uint16_t>(std::stoi(addr.substr(sp + 1))), opts_.timeout);
    p.out_socket = std::make_unique<tcp_stream>(fd);
    std::string ring_name;
    if (p.same_host && opts_.transport != "tcp") {
      ring_name = "/troupe-" + opts_.job + "-" + std::to_string(me) + "-" + std::to_string(r);
      p.out_ring = shm_ring::create(ring_name, ring_capacity);
    }
    std::string hello(hello_magic, sizeof(hello_magic));
    auto tlen = static_cast<std::uint32_t>(opts_.token.size());
    hello.append(reinterpret_cast<const char*>(&tlen), sizeof(tlen));
    hello += opts_.token;
    std::int32_t ids[2] = {me, static_cast<std::int32_t>(::getpid())};
    hello.append(reinterpret_cast<const char*>(ids), sizeof(ids));
    put_string(hello, host_name());
    put_string(hello, opts_.job);
    put_string(hello, ring_name);
    char ack = 0;
    if (!p.out_socket->write(hello.data(), hello.size()) || !p.out_socket->read(&ack, 1) ||
        ack != 1)
      throw error(errc::backend, "data plane: rank " + std::to_string(r) + " at " + addr +
                                     " refused this rank's connection (wrong job token?)");
    p.out = p.out_ring ? static_cast<byte_stream*>(p.out_ring.get()) : p.out_socket.get();
  }
  // 4. Wait until every process peer connected to us.
  std::unique_lock<std::mutex> g{mtx_};
  if (!connected_cv_.wait_for(g, opts_.timeout, [&] { return connected_ == remote_count_; }))
    throw error(errc::timeout, "data plane: Timeout after " +
                                   std::to_string(opts_.timeout.count()) + " ms: only " +
                                   std::to_string(connected_) + " of " +
                                   std::to_string(remote_count_) + " ranks connected to rank " +
                                   std::to_string(me));
}

void data_plane::accept_loop() {
  while (!stopping_) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_ || errno == EINVAL || errno == EBADF) return;
      continue;
    }
    std::lock_guard<std::mutex> g{mtx_};
    if (stopping_) {
      ::close(fd);
      return;
    }
    threads_.emplace_back([this, fd] { serve(fd); });
  }
}

/// Checks a newcomer's hello, then reads its frames until it goes away.
void data_plane::serve(int fd) {
  auto sock = std::make_unique<tcp_stream>(fd);
  const auto who = tcp_peer_name(fd);
  auto refuse = [&](const std::string& why) {
    ++refused_;
    std::fprintf(stderr, "[troupe rank %d] refused data-plane connection from %s: %s\n", opts_.rank,
                 who.c_str(), why.c_str());
  };
  tcp_set_read_timeout(fd, std::chrono::milliseconds(5000));  // strangers may not stall us
  char magic[8];
  std::uint32_t tlen = 0;
  std::string token, host, job, ring;
  std::int32_t ids[2] = {-1, 0};
  if (!sock->read(magic, sizeof(magic)) || std::memcmp(magic, hello_magic, sizeof(magic)) != 0)
    return refuse("not a troupe handshake");
  if (!sock->read(&tlen, sizeof(tlen)) || tlen > 4096) return refuse("malformed handshake");
  token.resize(tlen);
  if ((tlen && !sock->read(token.data(), tlen)) || !sock->read(ids, sizeof(ids)) ||
      !get_string(*sock, host, 255) || !get_string(*sock, job, 255) ||
      !get_string(*sock, ring, 255))
    return refuse("truncated handshake");
  if (!same_secret(token, opts_.token)) return refuse("wrong job token");
  const int r = ids[0];
  if (job != opts_.job) return refuse("wrong job");
  if (r < 0 || r >= opts_.world_size || peers_[static_cast<std::size_t>(r)]->local)
    return refuse("bad rank " + std::to_string(r));
  auto& p = *peers_[static_cast<std::size_t>(r)];
  if (p.in_socket) return refuse("rank " + std::to_string(r) + " is already connected");
  if (!ring.empty() && ring.rfind("/troupe-" + opts_.job + "-", 0) != 0)
    return refuse("bad ring name");
  tcp_set_read_timeout(fd, std::chrono::milliseconds(0));
  std::unique_ptr<shm_ring> in_ring;
  try {
    if (!ring.empty()) in_ring = shm_ring::open(ring);
  } catch (const error& e) {
    return refuse(e.what());
  }
  char ack = 1;
  if (!sock->write(&ack, 1)) return;
  auto* raw = sock.get();
  {
    std::lock_guard<std::mutex> g{mtx_};
    if (stopping_) return;  // shutting down: the socket closes with `sock`
    p.in_socket = std::move(sock);
    p.in_ring = std::move(in_ring);
    ++connected_;
  }
  connected_cv_.notify_all();
  if (p.in_ring) {
    // Data comes through the ring; the socket only tells when the peer is gone.
    std::lock_guard<std::mutex> g{mtx_};
    if (stopping_) return;
    threads_.emplace_back([this, r, raw] {
      char byte;
      while (raw->read(&byte, 1)) {
      }
      if (auto& pr = *peers_[static_cast<std::size_t>(r)]; pr.in_ring) pr.in_ring->close();
    });
  }
  reader_loop(r);
}

bool data_plane::dispatch(int r, received_frame& f) {
  if (f.header.kind == frame_goodbye) {
    peer_gone(r, "it left the job", false);
    return false;
  }
  if (f.header.kind == frame_fabric) {
    fabric_sink sink;
    {
      std::lock_guard<std::mutex> g{mtx_};
      if (auto i = sinks_.find(f.group); i != sinks_.end()) sink = i->second.first;
    }
    if (sink) sink(f);
    return true;
  }
  group_actor target;
  {
    std::lock_guard<std::mutex> g{mtx_};
    if (auto i = groups_.find(f.group); i != groups_.end()) target = i->second;
  }
  if (!target) return true;  // the group was destroyed here
  if (f.header.kind == frame_collective)
    caf::anon_send(
        target, data_atom::value,
        envelope{f.header.seq, f.header.step, f.header.src, static_cast<op_code>(f.header.code),
                 std::move(f.payload), std::move(f.fp)});
  else
    caf::anon_send(target, msg_atom::value,
                   p2p_envelope{f.header.src, f.header.tag, std::move(f.payload)});
  return true;
}

bool data_plane::drain(int r, bool& any) {
  auto& p = *peers_[static_cast<std::size_t>(r)];
  if (p.over) return false;
  auto on_frame = [&](received_frame& f) {
    any = true;
    return dispatch(r, f);
  };
  // Fabric payloads may go where their operation posted a receive.
  auto place = [&](const frame_header& h, const std::string& group) {
    if (h.kind != frame_fabric) return posted_receive{};
    fabric_place where;
    {
      std::lock_guard<std::mutex> g{mtx_};
      if (auto i = sinks_.find(group); i != sinks_.end()) where = i->second.second;
    }
    return where ? where(h) : posted_receive{};
  };
  auto why =
      p.in_ring ? p.reader.drain([&](void* d, std::size_t n) { return p.in_ring->read_some(d, n); },
                                 on_frame, place)
                : p.reader.drain(p.in_socket->fd(), on_frame, place);
  if (why.empty()) return true;
  p.over = true;
  if (why == "stopped") return false;  // a goodbye, already handled
  if (why != "connection closed" && !stopping_)
    std::fprintf(stderr, "[troupe rank %d] dropping connection of rank %d: %s\n", opts_.rank, r,
                 why.c_str());
  peer_gone(r, "its process died or its connection broke (" + why + ")", true);
  return false;
}

void data_plane::reader_loop(int r) {
  auto& p = *peers_[static_cast<std::size_t>(r)];
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
  auto& p = *peers_[static_cast<std::size_t>(r)];
  return p.in_socket && !p.in_ring;
}

bool data_plane::pump(int r) {
  auto& p = *peers_[static_cast<std::size_t>(r)];
  if (!p.in_socket && !p.in_ring) return false;
  std::unique_lock<std::mutex> g{p.in_mtx, std::try_to_lock};
  if (!g.owns_lock()) return false;
  bool any = false;
  drain(r, any);
  return any;
}

void data_plane::pumping(int r, int delta, bool wake) {
  auto& p = *peers_[static_cast<std::size_t>(r)];
  if (p.pumpers.fetch_add(delta) + delta == 0 && wake) {
    std::lock_guard<std::mutex> g{p.in_mtx};
    p.park.notify_all();
  }
}

std::string data_plane::gone_reason(int r) {
  auto& p = *peers_[static_cast<std::size_t>(r)];
  if (!p.gone.load()) return {};
  std::lock_guard<std::mutex> g{mtx_};
  return p.gone_why;
}

void data_plane::peer_gone(int r, const std::string& why, bool crashed) {
  auto& p = *peers_[static_cast<std::size_t>(r)];
  if (stopping_) return;
  {
    std::lock_guard<std::mutex> g{mtx_};
    if (p.gone.load()) return;
    p.gone_why = why;
    p.gone.store(true);
  }
  if (p.out_ring) p.out_ring->close();  // sends to it fail at once
  if (p.out_socket) p.out_socket->close();
  std::vector<group_actor> targets;
  {
    std::lock_guard<std::mutex> g{mtx_};
    for (auto& kv : groups_) targets.push_back(kv.second);
  }
  for (auto& t : targets) caf::anon_send(t, gone_atom::value, r, why, crashed);
}

bool data_plane::is_local(int r) const {
  return peers_[static_cast<std::size_t>(r)]->local;
}

bool data_plane::shares_memory(int r) const {
  auto& p = *peers_[static_cast<std::size_t>(r)];
  return p.local || (p.same_host && opts_.transport != "tcp");
}

std::string data_plane::describe(int r) const {
  auto& p = *peers_[static_cast<std::size_t>(r)];
  return "world rank " + std::to_string(r) + " (host " + p.host + ", pid " + std::to_string(p.pid) +
         ")";
}

template <class Envelope>
void data_plane::send_frame(int r, const std::string& group, const Envelope& env) {
  auto& p = *peers_[static_cast<std::size_t>(r)];
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

void data_plane::send_fabric(int r, const std::string& group, const envelope& env,
                             const std::function<void()>& while_full,
                             std::chrono::steady_clock::time_point deadline) {
  auto& p = *peers_[static_cast<std::size_t>(r)];
  {
    std::lock_guard<std::mutex> g{p.out_mtx};
    if (!p.out || p.gone) return;  // the peer is gone: the waiting side fails the call
    if (p.out != p.out_socket.get()) {
      write_frame(*p.out, group, env, frame_fabric);
      return;
    }
    nonblocking_stream out{p.out_socket->fd(), while_full, deadline};
    if (write_frame(out, group, env, frame_fabric)) return;
    p.out_socket->close();
  }
  peer_gone(r, "it took no data for the length of an operation's timeout (connection closed)",
            true);
}

void data_plane::add_sink(const std::string& group, fabric_sink sink, fabric_place place) {
  std::lock_guard<std::mutex> g{mtx_};
  sinks_[group] = {std::move(sink), std::move(place)};
}

void data_plane::remove_sink(const std::string& group) {
  std::lock_guard<std::mutex> g{mtx_};
  sinks_.erase(group);
}

void data_plane::add_group(const std::string& group, const group_actor& actor) {
  std::lock_guard<std::mutex> g{mtx_};
  groups_[group] = actor;
}

void data_plane::remove_group(const std::string& group) {
  std::lock_guard<std::mutex> g{mtx_};
  groups_.erase(group);
}

}  // namespace troupe::detail
