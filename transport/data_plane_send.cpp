// data_plane (data_plane.hpp): sending frames to ranks in other processes,
// from the inline engine's waiting threads without blocking on a full
// socket (or past the operation's deadline on a full ring), and raw bytes for tests that play a
// rule-breaking peer.

#include "transport/data_plane.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/callback_pool.hpp"
#include "transport/data_plane_parts.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

namespace {

/// Writes to a socket without blocking; while the socket is full it calls
/// `while_full` and waits briefly for room. After a failed write, why() says
/// what happened and how long the write had run.
class nonblocking_stream final : public byte_stream {
 public:
  nonblocking_stream(int fd, const std::function<void()>& while_full,
                     std::chrono::steady_clock::time_point deadline, const write_stall* stall)
      : fd_(fd), while_full_(while_full), deadline_(deadline), stall_(stall) {}
  std::string why() const { return why_; }
  /// Whether the write failed at its deadline (not on a closed connection).
  bool timed_out() const { return timed_out_; }
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
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline_) {
          timed_out_ = true;
          return fail("writing to it timed out after " + elapsed() +
                      ": its connection took no more data before the operation's deadline "
                      "(connection closed)");
        }
        if (stall_ && now - start_ >= stall_->after) {
          stall_->tell();
          stall_ = nullptr;
        }
        if (while_full_) while_full_();
        pollfd pf{fd_, POLLOUT, 0};
        ::poll(&pf, 1, 1);
        continue;
      }
      const int e = w < 0 ? errno : EPIPE;
      return fail(std::string(e == ECONNRESET || e == EPIPE ? "it closed or reset the connection"
                                                            : "writing to its connection failed") +
                  " (" + std::strerror(e) + ", " + elapsed() + " into a write)");
    }
    return true;
  }
  bool read(void*, std::size_t) override { return false; }
  void close() override {}

 private:
  bool fail(std::string why) {
    why_ = std::move(why);
    return false;
  }
  std::string elapsed() const {
    const auto t = std::chrono::steady_clock::now() - start_;
    return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(t).count()) + " ms";
  }

  int fd_;
  const std::function<void()>& while_full_;
  std::chrono::steady_clock::time_point deadline_;
  const write_stall* stall_;  // null once told
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::string why_;
  bool timed_out_ = false;
};

/// Writes to a link (a shared-memory ring), giving up at the operation's
/// deadline while the link takes nothing (its reader stopped, or stuck).
/// Where a stall is given, the write first waits until stall->after into
/// it, tells, then waits on to the deadline.
class deadline_link_stream final : public byte_stream {
 public:
  deadline_link_stream(link_out& link, std::chrono::steady_clock::time_point deadline,
                       const write_stall* stall)
      : link_(link), deadline_(deadline), stall_(stall) {}
  bool timed_out() const { return timed_out_; }
  std::string why() const {
    const auto t = std::chrono::steady_clock::now() - start_;
    return "writing to it timed out after " +
           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(t).count()) +
           " ms: its link took no more data before the operation's deadline (link closed)";
  }
  bool write(const void* data, std::size_t n) override {
    auto* p = static_cast<const char*>(data);
    if (stall_ && start_ + stall_->after < deadline_) {
      const auto tell_at = start_ + stall_->after;
      std::size_t written = 0;
      if (link_.write_until(p, n, tell_at, &written)) return true;
      if (std::chrono::steady_clock::now() < tell_at) return false;  // closed
      p += written;
      n -= written;
      stall_->tell();
      stall_ = nullptr;
    }
    if (link_.write_until(p, n, deadline_)) return true;
    timed_out_ = std::chrono::steady_clock::now() >= deadline_;
    return false;
  }
  bool writes_by_copy() const noexcept override { return link_.writes_by_copy(); }
  bool read(void*, std::size_t) override { return false; }
  void close() override {}

 private:
  link_out& link_;
  std::chrono::steady_clock::time_point deadline_;
  const write_stall* stall_;  // null once told
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  bool timed_out_ = false;
};

/// Why a frame to a peer that is gone was not written.
constexpr const char* gone_text = "its connection was closed before this frame";

/// What a sender calls while a socket is full where reader threads read the
/// sockets: nothing.
const std::function<void()>& nothing_to_read() {
  static const std::function<void()> nothing;
  return nothing;
}

}  // namespace

template <class Write>
data_plane::write_outcome data_plane::write_bounded(peer& p, const Write& write_to,
                                                    const std::function<void()>& while_full,
                                                    std::chrono::steady_clock::time_point deadline,
                                                    const write_stall* stall) {
  using ended = write_outcome::ended;
  if (p.out_link && p.out == p.out_link.get()) {
    // A ring's reader thread takes its bytes whatever this thread does;
    // one that took nothing until the deadline is stopped or stuck.
    deadline_link_stream out{*p.out_link, deadline, stall};
    if (write_to(out)) return {};
    if (!out.timed_out()) return {ended::closed, gone_text};  // closed as the peer went
    leave_note(p, out.why());  // a frame cut short: no goodbye can follow it
    p.out_link->close();
    return {ended::timed_out, out.why()};
  }
  if (p.out != p.out_socket.get())
    return write_to(*p.out) ? write_outcome{} : write_outcome{ended::closed, gone_text};
  nonblocking_stream out{p.out_socket->fd(), while_full, deadline, stall};
  if (write_to(out)) return {};
  if (out.timed_out()) leave_note(p, out.why());
  p.out_socket->close();
  const auto why = out.why();
  return {out.timed_out() ? ended::timed_out : ended::failed,
          why.empty() ? "writing to its connection failed (connection closed)" : why};
}

template <class Write>
std::string data_plane::send_until(int r, const Write& write_to,
                                   const std::function<void()>& while_full,
                                   std::chrono::steady_clock::time_point deadline,
                                   on_write_error errors, const write_stall* stall) {
  using ended = write_outcome::ended;
  auto& p = at(r);
  const bool judge = errors == on_write_error::fail_peer;
  write_outcome o;
  {
    std::lock_guard<futex_lock> g{p.out_mtx};
    // The peer is gone: a call waiting for it fails with why it left.
    if (!p.out || p.gone) return "";
    o = write_bounded(p, write_to, while_full, deadline, stall);
  }
  // A connection its peer closed is judged by the thread that reads it,
  // after the goodbye that may come first (naming the rank whose failure
  // made that peer leave): left to it where asked. One that took nothing
  // until the deadline is this rank's to judge, and the sender's call's to
  // fail: it is past its deadline, and its data did not all go.
  if (o.how == ended::written || (!judge && o.how != ended::timed_out)) return "";
  if (o.how != ended::closed) peer_gone(r, o.why, true, -1, failure_kind::died);
  return o.how == ended::timed_out ? o.why : "";
}

void data_plane::say_goodbye(peer& p, std::int32_t cause, failure_kind kind) {
  // A goodbye the peer does not take within a second is not waited for
  // (a stopped peer must not hold this world's end).
  write_bounded(
      p, [&](byte_stream& out) { return write_goodbye(out, cause, kind); }, nothing_to_read(),
      std::chrono::steady_clock::now() + std::chrono::seconds(1));
}

std::string data_plane::send(int r, const std::string& group, const envelope& env,
                             std::chrono::steady_clock::time_point deadline,
                             const write_stall* stall) {
  return send_until(
      r, [&](byte_stream& out) { return write_frame(out, group, env, frame_collective); },
      nothing_to_read(), deadline, on_write_error::leave_to_reader, stall);
}

void data_plane::send(int r, const std::string& group, const p2p_envelope& env) {
  send(r, group, env, std::chrono::steady_clock::now() + opts_.timeout);
}

std::string data_plane::send(int r, const std::string& group, const p2p_envelope& env,
                             std::chrono::steady_clock::time_point deadline) {
  note_p2p();
  return send_until(
      r, [&](byte_stream& out) { return write_frame(out, group, env); }, nothing_to_read(),
      deadline, on_write_error::leave_to_reader);
}

void data_plane::send_soon(int r, const std::string& group, const p2p_envelope& env) {
  auto& p = at(r);
  {
    std::unique_lock<futex_lock> g{p.out_mtx, std::try_to_lock};
    if (g.owns_lock() && (!p.out || p.gone)) return;  // the peer is gone
    if (g.owns_lock() && p.out_link && p.out == p.out_link.get() &&
        p.out_link->writable() >= sizeof(frame_header) + group.size() +
                                      (env.payload.defined() ? env.payload.nbytes() : 0)) {
      write_frame(*p.out, group, env);
      return;
    }
  }
  std::weak_ptr<data_plane> self = weak_from_this();
  post_callback([self, r, group, env] {
    if (auto plane = self.lock()) plane->send(r, group, env);
  });
}

std::string data_plane::send_inline(int r, const std::string& group, const envelope& env,
                                    const std::function<void()>& while_full,
                                    std::chrono::steady_clock::time_point deadline,
                                    const write_stall* stall) {
  return send_until(
      r, [&](byte_stream& out) { return write_frame(out, group, env, frame_inline); }, while_full,
      deadline, on_write_error::fail_peer, stall);
}

bool data_plane::send_raw(int r, const void* data, std::size_t n) {
  auto& p = at(r);
  std::lock_guard<futex_lock> g{p.out_mtx};
  return p.out && !p.gone && p.out->write(data, n);
}

}  // namespace troupe::detail
