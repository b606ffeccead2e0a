// data_plane (data_plane.hpp): peers that are gone — one that left with a
// goodbye, one that died or broke its connection, one dropped for the frames
// it sent — and who hears of it.
//
// A connection a live rank closes in the middle of a frame (its write took
// nothing until its call's deadline, or it judged the peer) ends with no
// room for a goodbye, and the peer would take the closed connection for a
// death. So the closing rank first sends why back on the peer's connection
// to it (unused in that direction after the handshake): a note. The peer,
// finding its incoming connection closed, looks for one there before naming
// a cause; a rank that died closed that connection too, so a death is not
// judged later for it.

#include "transport/data_plane.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "transport/data_plane_parts.hpp"

namespace troupe::detail {

namespace {

/// How a note starts (anything else on that connection is not one).
constexpr char note_magic[] = "troupe closes: ";
/// The most of a note read or sent.
constexpr std::size_t max_note = 1024;
/// How long a rank whose incoming connection closed looks for a note: the
/// note was sent before the close, on another connection.
constexpr int note_wait_ms = 100;

}  // namespace

void data_plane::leave_note(peer& p, const std::string& why) {
  if (!p.in_socket || p.noted.exchange(true)) return;
  auto text = note_magic + why;
  text.resize(std::min(text.size(), max_note));
  // Never waits: a peer that reads nothing of this direction has room for it.
  [[maybe_unused]] auto n =
      ::send(p.in_socket->fd(), text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

std::string data_plane::read_note(int r) {
  auto& p = at(r);
  if (!p.out_socket) return {};
  std::string text;
  char buf[256];
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(note_wait_ms);
  while (text.size() < max_note) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    pollfd pf{p.out_socket->fd(), POLLIN, 0};
    if (left.count() <= 0 || ::poll(&pf, 1, static_cast<int>(left.count())) <= 0) break;
    const auto got = ::recv(pf.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (got <= 0) break;  // its end (it died), or nothing after all
    text.append(buf, static_cast<std::size_t>(got));
  }
  const auto magic = std::strlen(note_magic);
  if (text.compare(0, magic, note_magic) != 0) return {};
  text.erase(0, magic);
  text.resize(std::min(text.size(), max_note - magic));
  for (char& c : text)
    if (!std::isprint(static_cast<unsigned char>(c))) c = '?';  // its words, shown as text
  return text;
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

void data_plane::peer_gone(int r, const std::string& why, bool crashed, int cause,
                           failure_kind kind) {
  auto& p = at(r);
  if (stopping_) return;
  std::vector<std::function<void(int, const std::string&, bool)>> targets;
  {
    std::lock_guard<std::mutex> g{mtx_};
    if (p.gone.load()) return;
    p.gone_why = why;
    p.crashed = crashed;
    p.gone.store(true);
    for (auto& kv : routes_)
      if (kv.second->actor.gone) targets.push_back(kv.second->actor.gone);
  }
  // Whom this rank's own goodbye will blame: the first failure it learned of.
  if (const int blame = cause >= 0 ? cause : crashed ? r : -1; blame >= 0) {
    int none = -1;
    first_cause_.compare_exchange_strong(none, blame * 256 + static_cast<int>(kind));
  }
  if (crashed) crashes_->fetch_add(1);
  // Sends to it fail at once (not under out_mtx: a writer blocked on the
  // full ring of a dead peer holds it until the ring closes). A live one
  // learns why first.
  leave_note(p, why);
  if (p.out_link) p.out_link->close();
  if (p.out_socket) p.out_socket->close();
  for (auto& t : targets) t(r, why, crashed);
}

void data_plane::reject(int r, const std::string& why) {
  if (stopping_ || at(r).gone.load()) return;  // dropped once
  std::fprintf(stderr, "[troupe rank %d] dropping the connection of %s: %s\n", opts_.rank,
               describe(r).c_str(), why.c_str());
  peer_gone(r, "its connection was dropped: it sent " + why, true, -1, failure_kind::dropped);
  std::lock_guard<std::mutex> g{mtx_};
  auto& p = at(r);
  if (p.in_socket) p.in_socket->close();  // its reader ends; the peer sees the end
  if (p.in_link) p.in_link->close();
}

}  // namespace troupe::detail
