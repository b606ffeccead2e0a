#pragma once
// The data plane's record of one peer and of one group's route, shared by
// transport/data_plane.cpp (set-up, frames) and data_plane_accept.cpp
// (strangers, reader threads).

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/futex_lock.hpp"
#include "transport/data_plane.hpp"
#include "transport/link.hpp"
#include "transport/tcp_stream.hpp"

namespace troupe::detail {

struct data_plane::peer {
  std::string process;  // identity of the peer's process
  std::string host;
  int pid = 0;
  bool local = false;      // same process
  bool same_host = false;  // same host, other process
  // Set while the world forms when one of the two could not open the other's
  // shared-memory link (a process that is not dumpable, or one the other may
  // not look into): nothing of either is mapped by the other then (no loans,
  // no segment), whichever direction failed.
  std::atomic<bool> memory_closed{false};
  // Outgoing: the stream frames are written to (a transport's link, else
  // the socket), and the socket, which then only proves liveness. Taken for every frame
  // written (a writer blocked on a full socket holds it: the others sleep).
  futex_lock out_mtx;
  std::unique_ptr<tcp_stream> out_socket;
  std::unique_ptr<link_out> out_link;
  byte_stream* out = nullptr;
  // Incoming.
  std::unique_ptr<tcp_stream> in_socket;
  std::unique_ptr<link_in> in_link;  // a transport's link, else frames come over in_socket
  std::atomic<bool> gone{false};
  // This rank told it why it closes their connection (leave_note): once.
  std::atomic<bool> noted{false};
  // When bytes last came from it (steady clock, ns; 0: not connected yet):
  // the failure detector's evidence that its process runs.
  std::atomic<std::int64_t> heard_ns{0};
  bool crashed = false;  // gone without a goodbye (set with gone_why, under mtx_)
  std::string gone_why;  // set (under mtx_) before `gone`
  // Reading the socket: whoever holds in_mtx (reader thread or a pumping waiter).
  mutable std::mutex in_mtx;
  frame_reader reader;
  std::shared_ptr<const route> current;  // the route of the frame being read (under in_mtx)
  // The route of this peer's last frame and its group, as of routes_version_
  // (under in_mtx): the next frame of the same group finds it without the
  // plane's lock and map. Weak: a group destroyed meanwhile is not kept.
  std::weak_ptr<const route> last_route;
  std::string last_group;
  std::uint64_t last_version = 0;
  std::atomic<int> pumpers{0};
  // When the last thread that pumped this socket stopped without handing
  // it to the reader thread (steady clock, ns; 0: handed over, or never
  // pumped): the reader stays parked for reading_linger after it.
  std::atomic<std::int64_t> pumped_ns{0};
  std::condition_variable park;  // the reader thread waits here while a thread pumps
  bool over = false;             // the connection ended (under in_mtx)
};

/// Where frames for one group go in this process.
struct data_plane::route {
  std::vector<int> members;  // world rank of each group rank
  group_sink actor;          // collective and p2p frames
  inline_sink sink;          // inline frames
  inline_place place;
};

/// Identifies this process among the ranks of a job (same value for every
/// world in the process, different in every other process, forked ones too).
std::string process_identity();

}  // namespace troupe::detail
