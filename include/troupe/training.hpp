#pragma once
/// The training layer in one include: the reducer and its comm hooks,
/// parameter sync, collective utilities, differentiable collectives and
/// SyncBatchNorm (see README.md, "Training").

#include "troupe/apply_to_tensors.hpp"
#include "troupe/bucket_assignment.hpp"
#include "troupe/collective_utils.hpp"
#include "troupe/comm_hook.hpp"
#include "troupe/default_hooks.hpp"
#include "troupe/differentiable.hpp"
#include "troupe/param_sync.hpp"
#include "troupe/powersgd.hpp"
#include "troupe/reducer.hpp"
#include "troupe/state_dict.hpp"
#include "troupe/sync_batch_norm.hpp"
