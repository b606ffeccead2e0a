#pragma once
/// A c10d store (TCPStore, FileStore, HashStore, PrefixStore, or one written
/// in Python) as a troupe store, so that troupe's ranks rendezvous through the
/// store torch hands a backend.
///
/// Blocking calls use the troupe store's timeout (initially the c10d
/// store's). c10d's errors become troupe's: a wait or get that runs out of
/// time is errc::timeout naming the keys, anything else errc::store naming the
/// call. c10d 1.13 stores have no append, multi_get or multi_set: append is a
/// compare_set loop, the multi calls are one call per key (multi_get waits for
/// every key once, with one timeout). Waits look with check() every 0.1 to
/// 10 ms instead of calling c10d's wait: a TCPStore connection whose wait
/// timed out reads the late answer as the reply to its next request.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "troupe/store.hpp"

namespace troupe_torch {

/// `inner` seen as a troupe::store; the returned store keeps `inner` alive.
std::shared_ptr<troupe::store> wrap_store(c10::intrusive_ptr<c10d::Store> inner);

}  // namespace troupe_torch
