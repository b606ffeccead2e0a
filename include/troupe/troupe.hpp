#pragma once
/// troupe — asynchronous collectives on actors. The umbrella header: every
/// public header of the library, the training layer included.
///
/// Not included: <troupe/caf_await.hpp>, which awaits works from inside CAF
/// actors and so needs CAF's headers (opt in where you write actors).

#include "troupe/backend.hpp"
#include "troupe/debug.hpp"
#include "troupe/device.hpp"
#include "troupe/dtype.hpp"
#include "troupe/error.hpp"
#include "troupe/flight_recorder.hpp"
#include "troupe/launch.hpp"
#include "troupe/object_collectives.hpp"
#include "troupe/options.hpp"
#include "troupe/process_group.hpp"
#include "troupe/reduce_op.hpp"
#include "troupe/serialize.hpp"
#include "troupe/simulation.hpp"
#include "troupe/store.hpp"
#include "troupe/tcp_store.hpp"
#include "troupe/tensor.hpp"
#include "troupe/testing.hpp"
#include "troupe/training.hpp"
#include "troupe/version.hpp"
#include "troupe/work.hpp"
#include "troupe/world.hpp"
