#pragma once
/// troupe — asynchronous collectives on actors. The umbrella header.

#include "troupe/backend.hpp"
#include "troupe/debug.hpp"
#include "troupe/device.hpp"
#include "troupe/dtype.hpp"
#include "troupe/error.hpp"
#include "troupe/flight_recorder.hpp"
#include "troupe/options.hpp"
#include "troupe/process_group.hpp"
#include "troupe/reduce_op.hpp"
#include "troupe/store.hpp"
#include "troupe/tensor.hpp"
#include "troupe/work.hpp"
#include "troupe/world.hpp"
